package e2e

import (
	"context"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
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
	out, err := runReadmeBlock(t, root, "## Walkthrough")
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

// TestReadme_network runs the README's agent-network walkthrough: two
// agents of different clients, a follow, a message over the CLI, replies
// over REST, and the receiver reading them with curl over server-sent
// events, resuming with Last-Event-ID.
func TestReadme_network(t *testing.T) {
	if testing.Short() {
		t.Skip("builds parley and runs a shell walkthrough")
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	out, err := runReadmeBlock(t, root, "## The agent network: two agents talk")
	if err != nil {
		t.Fatalf("the agent-network walkthrough failed: %v\n%s", err, out)
	}
	for _, want := range []string{
		`"category":"message","recipients":["beta:bob"],"refused":[{"agent":"beta:carol","reason":"permission_denied"`,
		`"recipients":["clients/acme/agents/alice"]`,
		"\n403\n",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("agent-network walkthrough output lacks %q; output:\n%s", want, out)
		}
	}
	// The first stream has Bob's reply; the resumed one has his second
	// message and not the first, which Last-Event-ID acknowledged. (The
	// resumed stream ran long enough to deliver the first again: the
	// second came after it in cursor order, and it is there.)
	first, resumed, ok := strings.Cut(string(out), "\nresumed:\n")
	if !ok {
		t.Fatalf("agent-network walkthrough printed no resumed stream; output:\n%s", out)
	}
	_, first, _ = strings.Cut(first, "\nfirst:\n")
	if !strings.Contains(first, `"sender":"clients/beta/agents/bob"`) || !strings.Contains(first, `"body":"Yes, at noon"`) {
		t.Errorf("Alice's first SSE stream = %q, want Bob's reply", first)
	}
	if !strings.Contains(resumed, `"body":"See you there"`) || strings.Contains(resumed, `"body":"Yes, at noon"`) {
		t.Errorf("Alice's resumed SSE stream = %q, want Bob's second message and not his first", resumed)
	}
}

// runReadmeBlock runs the first ```sh block after heading in README.md
// with bash, from the repo root, with extra environment variables, and
// returns its combined output.
func runReadmeBlock(t *testing.T, root, heading string, env ...string) ([]byte, error) {
	t.Helper()
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	section := string(readme)
	start := strings.Index(section, heading+"\n")
	if start < 0 {
		t.Fatalf("README.md has no %s section", heading)
	}
	section = section[start:]
	open := strings.Index(section, "```sh\n")
	if open < 0 {
		t.Fatalf("README section %s has no ```sh block", heading)
	}
	script := section[open+len("```sh\n"):]
	script = script[:strings.Index(script, "```")]

	// A generous bound: the script builds binaries, which on a loaded
	// 2-core machine has taken over three minutes.
	ctx, cancel := context.WithTimeout(t.Context(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", script)
	cmd.Dir = root
	// The script's mktemp directories (binary, data, work) land in the
	// test's own temporary directory, removed when the test ends.
	cmd.Env = append(append(os.Environ(), "TMPDIR="+t.TempDir()), env...)
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
	return out, err
}

// TestReadme_servicesSeparately runs the README's section on running the
// four service binaries, `parley gateway` and the CLI as separate
// processes, with the same flags as `parley serve`.
func TestReadme_servicesSeparately(t *testing.T) {
	if testing.Short() {
		t.Skip("builds five binaries and runs them as separate processes")
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	// The services dial their peers (the dispatcher the registry and the
	// negotiator, tasks the dispatcher, the gateway all four), so each needs
	// its peers' addresses before they listen: the README takes them as
	// variables. Ports are picked here and released for the script to bind.
	// They come from below the kernel's ephemeral range: a port from :0 can
	// be handed to another test's listener or outgoing connection in
	// between, which once left the dispatcher unable to bind.
	var env, addrs []string
	for _, name := range []string{"REG", "NEG", "DISP", "TASKS", "HTTP"} {
		a := nonEphemeralAddr(t)
		for slices.Contains(addrs, a) {
			a = nonEphemeralAddr(t)
		}
		addrs = append(addrs, a)
		env = append(env, name+"="+a)
	}
	out, err := runReadmeBlock(t, root, "## Running the services separately", env...)
	if err != nil {
		t.Fatalf("the README's separate-processes section failed: %v\n%s", err, out)
	}
	for _, want := range []string{
		`{"status":"ok"}`,
		`{"status":"success","body":"ping"}`,
		`"input":"split"`,
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("separate-processes output lacks %q; output:\n%s", want, out)
		}
	}
}

// nonEphemeralAddr returns a free 127.0.0.1 address whose port lies below
// the kernel's ephemeral range (ip_local_port_range), so that no listener on
// :0 and no outgoing connection is given it after it is released.
func nonEphemeralAddr(t *testing.T) string {
	t.Helper()
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				low = n
			}
		}
	}
	const first = 10000
	for range 200 {
		port := first + rand.IntN(max(low-first, 1))
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue // taken; try another
		}
		addr := l.Addr().String()
		l.Close()
		return addr
	}
	t.Fatalf("no free port in [%d, %d) after 200 tries", first, low)
	return ""
}
