package e2e

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/parleyhq/parley/e2e/parleytest"
)

// TestHelp_everyBinaryExitsZero runs --help on the shipped binaries: help is
// a successful answer, so scripts and container probes must see exit 0, and
// every command's help shows its usage and an example.
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
		for _, want := range []string{"Usage", "Examples:"} {
			if !strings.Contains(string(out), want) {
				t.Errorf("%s %s printed no %q:\n%s", filepath.Base(r[0]), strings.Join(r[1:], " "), want, out)
			}
		}
	}
}
