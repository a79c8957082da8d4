package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestReadme_walkthrough runs the README's walkthrough as a user would paste
// it, so the README stays true.
func TestReadme_walkthrough(t *testing.T) {
	if testing.Short() {
		t.Skip("builds parley and runs a shell walkthrough")
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	section := string(readme)
	start := strings.Index(section, "## Walkthrough")
	if start < 0 {
		t.Fatal("README.md has no ## Walkthrough section")
	}
	section = section[start:]
	open := strings.Index(section, "```sh\n")
	if open < 0 {
		t.Fatal("the walkthrough has no ```sh block")
	}
	script := section[open+len("```sh\n"):]
	script = script[:strings.Index(script, "```")]

	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", script)
	cmd.Dir = root
	// The script's mktemp directories (binary, data, work) land in the
	// test's own temporary directory, removed when the test ends.
	cmd.Env = append(os.Environ(), "TMPDIR="+t.TempDir())
	// The script runs `parley serve` in the background. If the script
	// fails before its `kill %1`, that orphan would keep the output pipe
	// open and hang the test: run everything in one process group, kill
	// the group on timeout and after the script, and stop waiting for the
	// pipe WaitDelay after the script is gone.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	killGroup := func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.Cancel = killGroup
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	if cmd.Process != nil {
		_ = killGroup() // ESRCH when the script cleaned up after itself
	}
	if err != nil {
		t.Fatalf("walkthrough failed: %v\n%s", err, out)
	}
	for _, want := range []string{
		`{"status":"ok"}`,
		"3a732bde0e63d2e838d1a722feebf3d67b52b211\n",
		`{"status":"success","body":"{\"precipitation\":0,\"temperature\":18,\"weatherCondition\":\"sunny\"}"}`,
		`{"status":"rejected"}`,
		"3a732bde0e63d2e838d1a722feebf3d67b52b211  -",
		`"status":"completed"`,
		`"file_name":"notes.txt"`,
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("walkthrough output lacks %q; output:\n%s", want, out)
		}
	}
}
