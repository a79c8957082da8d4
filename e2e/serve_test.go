// Package e2e tests several Parley services together, through a real
// `parley serve` process.
package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/parleyhq/parley/e2e/parleytest"
	"github.com/parleyhq/parley/platform/sysmon"
	"github.com/parleyhq/parley/sdk"
)

func TestServe_healthOverGRPCAndHTTP_thenSIGTERM(t *testing.T) {
	srv := parleytest.Start(t, "")

	// Live at once; ready once the dispatcher has stored its built-in
	// service protocols in the registry, which in this one process answers
	// only once the server runs: poll, the deadline only bounds a hang.
	get := func(path string) int {
		t.Helper()
		resp, err := http.Get(srv.URL(path))
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := get("/healthz"); code != http.StatusOK {
		t.Errorf("GET /healthz = %d, want 200", code)
	}
	deadline := time.Now().Add(time.Minute)
	for code := get("/readyz"); code != http.StatusOK; code = get("/readyz") {
		if time.Now().After(deadline) {
			t.Fatalf("GET /readyz = %d a minute after listening, want 200\n%s", code, srv.Log)
		}
		time.Sleep(50 * time.Millisecond)
	}

	conn, err := grpc.NewClient(srv.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(parleytest.Bearer(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	// The services' health follows the readiness checks, run every few
	// seconds: it turns SERVING at the first run after /readyz does.
	for _, svc := range []string{
		"",
		"parley.registry.v1.RegistryService",
		"parley.negotiator.v1.NegotiatorService",
		"parley.dispatcher.v1.DispatcherService",
		"parley.tasks.v1.TasksService",
	} {
		for {
			resp, err := hc.Check(t.Context(), &healthpb.HealthCheckRequest{Service: svc})
			if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("health Check(%q) = %v, %v a minute after listening; want SERVING", svc, resp.GetStatus(), err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	if err := srv.Stop(5 * time.Second); err != nil {
		t.Errorf("SIGTERM: %v, want exit status 0 within 5s\n%s", err, srv.Log)
	}
}

func TestServe_secondProcessOnSameDataDirFailsFast(t *testing.T) {
	first := parleytest.Start(t, "")
	second := parleytest.Binary(t)
	cmd := exec.Command(second, "serve", "--data", first.DataDir, "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0")
	done := make(chan error, 1)
	var out []byte
	go func() {
		var err error
		out, err = cmd.CombinedOutput()
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatalf("second parley serve on %s exited 0, want failure", first.DataDir)
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		if len(lines) != 1 || !strings.Contains(lines[0], "locked by another process") {
			t.Errorf("second parley serve printed %q, want one line saying the data directory is locked", out)
		}
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("second parley serve on a locked data directory hung")
	}
}

// TestServe_SIGTERMWithConnectedAgent proves the 5 s shutdown bound holds
// in the normal production state, with an SDK agent's stream open: the
// dispatcher ends agent streams when shutdown starts instead of waiting for
// --shutdown-timeout.
func TestServe_SIGTERMWithConnectedAgent(t *testing.T) {
	srv := parleytest.Start(t, "")
	createAgent(t, srv, "acme", "idle", "") // the dispatcher admits only registered agents
	conn, err := grpc.NewClient(srv.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(parleytest.Bearer(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- sdk.Connect(t.Context(), conn, "clients/acme/agents/idle", sdk.NaturalLanguage(func(context.Context, sdk.Envelope) (json.RawMessage, error) {
			return json.RawMessage(`"hi"`), nil
		}), sdk.OnReady(func() { close(ready) }))
	}()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("sdk.Connect ended before ready: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("the SDK agent did not connect")
	}
	start := time.Now()
	if err := srv.Stop(5 * time.Second); err != nil {
		t.Fatalf("SIGTERM with a connected agent: %v\n%s", err, srv.Log)
	}
	t.Logf("exited %v after SIGTERM", time.Since(start))
	select {
	case err := <-done:
		if err == nil {
			t.Error("sdk.Connect returned nil after the server stopped, want the stream's error (so callers reconnect)")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("sdk.Connect still running 30s after the server stopped")
	}
}

// TestServe_reexecutesItselfWithSchedtrace: `parley serve` replaces itself
// once at start under a GODEBUG carrying schedtrace (platform/sysmon),
// keeping the PID it was started with, so that a supervisor (or a kill -9
// test) still holds the server's process. /proc/PID/environ is the
// environment the running image was started with.
func TestServe_reexecutesItselfWithSchedtrace(t *testing.T) {
	srv := parleytest.Start(t, "")
	environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", srv.Cmd.Process.Pid))
	if err != nil {
		t.Skipf("reading the server's environment: %v (Linux only)", err)
	}
	var godebug []string // only GODEBUG: the rest may hold secrets
	for kv := range strings.SplitSeq(string(environ), "\x00") {
		if v, ok := strings.CutPrefix(kv, "GODEBUG="); ok {
			godebug = append(godebug, v)
		}
	}
	if len(godebug) == 0 || !slices.Contains(strings.Split(godebug[0], ","), sysmon.Setting) {
		t.Errorf("GODEBUG of parley serve (pid %d) = %q, want it to carry %s", srv.Cmd.Process.Pid, godebug, sysmon.Setting)
	}
}
