// Package parleyproc builds and runs `parley serve` for the benchmarks: a
// binary built from ./cmd/parley unless one is given, started on free
// loopback ports with its own data directory, its addresses read from its
// "listening" log line.
package parleyproc

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// startTimeout is how long Start waits for the "listening" line: a server
// on PostgreSQL migrates its schema first.
const startTimeout = 60 * time.Second

// maxLoggedErrors is how many ERROR lines of the server Start copies to
// stderr: what an INTERNAL answer hides.
const maxLoggedErrors = 5

// Build builds ./cmd/parley into dir and returns the binary's path. It runs
// from the repository root; the compiler's output goes to stderr.
func Build(dir string) (string, error) {
	bin := filepath.Join(dir, "parley")
	build := exec.Command("go", "build", "-o", bin, "./cmd/parley")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return "", fmt.Errorf("build parley (run from the repository root): %w", err)
	}
	return bin, nil
}

// Binary is bin when it is set (a -parley flag), else a binary Build
// makes in dir.
func Binary(bin, dir string) (string, error) {
	if bin != "" {
		return bin, nil
	}
	return Build(dir)
}

// Proc is one running `parley serve`.
type Proc struct {
	GRPCAddr string
	HTTPAddr string
	PID      int

	cmd      *exec.Cmd
	stopOnce sync.Once
}

// Start runs `parley serve` with data directory dataDir on free loopback
// ports, extraArgs appended to its command line, until ctx ends or Stop.
// It returns once the server has logged its addresses.
func Start(ctx context.Context, bin, dataDir string, extraArgs ...string) (*Proc, error) {
	args := append([]string{"serve", "--data", dataDir, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"}, extraArgs...)
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "PARLEY_LOG_LEVEL=info") // the "listening" line
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &Proc{PID: cmd.Process.Pid, cmd: cmd}
	found := make(chan [2]string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		logged := 0
		for sc.Scan() {
			var line struct{ Msg, Level, GRPC, HTTP string }
			if json.Unmarshal(sc.Bytes(), &line) != nil {
				continue
			}
			switch {
			case line.Msg == "listening":
				select {
				case found <- [2]string{line.GRPC, line.HTTP}:
				default:
				}
			case line.Level == "ERROR" && logged < maxLoggedErrors:
				logged++
				fmt.Fprintf(os.Stderr, "parley serve logged: %s\n", sc.Bytes())
			}
		}
	}()
	select {
	case a := <-found:
		p.GRPCAddr, p.HTTPAddr = a[0], a[1]
		return p, nil
	case <-time.After(startTimeout):
		p.Stop()
		return nil, fmt.Errorf("parley serve did not log its addresses within %s", startTimeout)
	}
}

// Stop interrupts the server and waits for it to exit. It may be called
// more than once.
func (p *Proc) Stop() {
	p.stopOnce.Do(func() {
		_ = p.cmd.Process.Signal(os.Interrupt)
		_ = p.cmd.Wait()
	})
}

// ReadToken reads the operator token serve writes to its data directory
// on first start.
func ReadToken(path string) (string, error) {
	tok, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("operator token: %w", err)
	}
	return strings.TrimSpace(string(tok)), nil
}
