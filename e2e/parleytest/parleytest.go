// Package parleytest starts a real `parley serve` process for end-to-end
// tests: it builds ./cmd/parley once per test binary, runs it on a temporary
// data directory with ports 127.0.0.1:0, and reads the bound addresses from
// the server's JSON "listening" log line.
package parleytest

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

type build struct {
	once sync.Once
	dir  string // removed by RemoveBuilds
	path string
	err  error
}

var (
	buildsMu sync.Mutex
	builds   = map[string]*build{}
)

// Build builds the main package pkg (an import path in the workspace) once
// per test binary and returns the executable's path.
func Build(t testing.TB, pkg string) string {
	t.Helper()
	buildsMu.Lock()
	b, ok := builds[pkg]
	if !ok {
		b = &build{}
		builds[pkg] = b
	}
	buildsMu.Unlock()
	b.once.Do(func() {
		dir, err := os.MkdirTemp("", "parley-e2e-bin")
		if err != nil {
			b.err = err
			return
		}
		b.dir = dir
		b.path = filepath.Join(dir, filepath.Base(pkg))
		out, err := exec.Command("go", "build", "-o", b.path, pkg).CombinedOutput()
		if err != nil {
			b.err = fmt.Errorf("go build %s: %w\n%s", pkg, err, out)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

// RemoveBuilds deletes every binary Build made. Call it from TestMain
// after m.Run: the binaries outlive single tests, so t.TempDir cannot hold
// them.
func RemoveBuilds() error {
	buildsMu.Lock()
	defer buildsMu.Unlock()
	var errs []error
	for pkg, b := range builds {
		if b.dir != "" {
			errs = append(errs, os.RemoveAll(b.dir))
		}
		delete(builds, pkg)
	}
	if operator.dir != "" {
		errs = append(errs, os.RemoveAll(operator.dir))
	}
	return errors.Join(errs...)
}

// Binary builds the parley binary once and returns its path.
func Binary(t testing.TB) string { return Build(t, "github.com/parleyhq/parley/cmd/parley") }

// Server is a running `parley serve` process.
type Server struct {
	Cmd      *exec.Cmd
	DataDir  string
	GRPCAddr string
	HTTPAddr string
	// Log holds everything the server wrote to stderr so far.
	Log *SyncBuffer
	// Exited is closed when the process has exited; ExitErr then holds
	// Wait's result.
	Exited  chan struct{}
	ExitErr error
}

// URL returns the HTTP base URL joined with path.
func (s *Server) URL(path string) string { return "http://" + s.HTTPAddr + path }

// Start runs `parley serve` with extra flags on dataDir (a new temporary
// directory when empty) and waits until it logs its addresses. The process
// is killed when the test ends if it is still running.
func Start(t testing.TB, dataDir string, extra ...string) *Server {
	t.Helper()
	if dataDir == "" {
		dataDir = t.TempDir()
	}
	_, tokenFile := operatorToken(t)
	args := append([]string{"serve", "--data", dataDir, "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", "--operator-token-file", tokenFile}, extra...)
	s := StartProcess(t, Binary(t), args...)
	s.DataDir = dataDir
	return s
}

// StartProcess runs any Parley server binary with args and waits until it
// logs its "listening" line. Give it 127.0.0.1:0 addresses.
func StartProcess(t testing.TB, binary string, args ...string) *Server {
	t.Helper()
	cmd := exec.Command(binary, args...)
	// Debug, the lowest level, unless the test says otherwise, so that
	// CheckLogsForSecrets sees every line a server can log.
	cmd.Env = append(os.Environ(), "PARLEY_LOG_LEVEL=debug")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &Server{Cmd: cmd, Log: &SyncBuffer{}, Exited: make(chan struct{})}
	keepLog(t.Name()+" "+filepath.Base(binary), s.Log)
	addrs := make(chan [2]string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			s.Log.WriteLine(line)
			var rec struct {
				Msg  string `json:"msg"`
				GRPC string `json:"grpc"`
				HTTP string `json:"http"`
			}
			if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "listening" {
				addrs <- [2]string{rec.GRPC, rec.HTTP}
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
	}()
	go func() {
		s.ExitErr = cmd.Wait()
		close(s.Exited)
	}()
	t.Cleanup(func() {
		select {
		case <-s.Exited:
		default:
			_ = cmd.Process.Kill()
			<-s.Exited
		}
	})
	select {
	case a := <-addrs:
		s.GRPCAddr, s.HTTPAddr = a[0], a[1]
	case <-s.Exited:
		t.Fatalf("%s exited before listening: %v\n%s", binary, s.ExitErr, s.Log)
	case <-time.After(60 * time.Second):
		t.Fatalf("%s did not log its addresses within 60s\n%s", binary, s.Log)
	}
	return s
}

// Stop sends SIGTERM and waits up to timeout for the process to exit. It
// returns the exit error (nil for exit status 0).
func (s *Server) Stop(timeout time.Duration) error {
	if err := s.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	select {
	case <-s.Exited:
		return s.ExitErr
	case <-time.After(timeout):
		return errors.New("parley serve did not exit within " + timeout.String() + " of SIGTERM")
	}
}

// SyncBuffer is a line buffer safe for concurrent use.
type SyncBuffer struct {
	mu    sync.Mutex
	lines []string
}

// WriteLine appends one line.
func (b *SyncBuffer) WriteLine(l string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lines = append(b.lines, l)
}

// String returns every line so far.
func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Join(b.lines, "\n")
}
