package e2e

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/parleyhq/parley/e2e/parleytest"
)

// TestHelp_everyBinaryExitsZero runs --help on the shipped binaries: help is
// a successful answer, so scripts and container probes must see exit 0.
func TestHelp_everyBinaryExitsZero(t *testing.T) {
	runs := [][]string{
		{parleytest.Binary(t), "--help"},
		{parleytest.Binary(t), "serve", "--help"},
		{parleytest.Binary(t), "demo", "--help"},
		{parleytest.Binary(t), "agent", "get", "--help"},
	}
	for _, svc := range []string{"registry", "dispatcher", "negotiator", "tasks"} {
		runs = append(runs, []string{parleytest.Build(t, "github.com/parleyhq/parley/services/"+svc+"/cmd/"+svc), "--help"})
	}
	for _, r := range runs {
		out, err := exec.Command(r[0], r[1:]...).CombinedOutput()
		if err != nil {
			t.Errorf("%s: %v, want exit 0\n%s", strings.Join(r[1:], " "), err, out)
		}
		if !strings.Contains(string(out), "Usage") {
			t.Errorf("%s printed no usage:\n%s", strings.Join(r[1:], " "), out)
		}
	}
}
