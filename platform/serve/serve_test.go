package serve

import (
	"context"
	"errors"
	"flag"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// panickyHealth is a health service whose Check panics, so one handler can
// prove panic recovery on the gRPC path.
type panickyHealth struct {
	healthpb.UnimplementedHealthServer
}

func (panickyHealth) Check(context.Context, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	panic("boom")
}

// errNone stands for "no error" in an atomic.Value, which cannot hold nil.
var errNone = errors.New("none")

type running struct {
	srv      *Server
	grpcConn *grpc.ClientConn
	baseURL  string
	cancel   context.CancelFunc
	done     chan error
}

// start runs s on loopback listeners until the test ends.
func start(t *testing.T, s *Server) *running {
	t.Helper()
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, gl, hl) }()
	conn, err := grpc.NewClient(gl.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	r := &running{srv: s, grpcConn: conn, baseURL: "http://" + hl.Addr().String(), cancel: cancel, done: done}
	t.Cleanup(func() {
		conn.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run() = %v, want nil after a clean shutdown", err)
		}
	})
	return r
}

func newServer(t *testing.T) *Server {
	t.Helper()
	s, err := New(Options{Logger: slog.New(slog.DiscardHandler), ShutdownTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestRun_healthAndReadiness(t *testing.T) {
	s := newServer(t)
	s.HealthService("parley.test.v1.TestService")
	var failing atomic.Value // error
	failing.Store(errNone)
	s.AddReadinessCheck("store", func(context.Context) error {
		if err := failing.Load().(error); !errors.Is(err, errNone) {
			return err
		}
		return nil
	})
	r := start(t, s)

	hc := healthpb.NewHealthClient(r.grpcConn)
	for _, svc := range []string{"", "parley.test.v1.TestService"} {
		resp, err := hc.Check(t.Context(), &healthpb.HealthCheckRequest{Service: svc}, grpc.WaitForReady(true))
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("Check(%q) = %v, %v; want SERVING", svc, resp.GetStatus(), err)
		}
	}
	if code, _ := get(t, r.baseURL+"/healthz"); code != http.StatusOK {
		t.Errorf("GET /healthz = %d, want 200", code)
	}
	if code, _ := get(t, r.baseURL+"/readyz"); code != http.StatusOK {
		t.Errorf("GET /readyz = %d, want 200", code)
	}
	failing.Store(errors.New("store closed"))
	code, body := get(t, r.baseURL+"/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "store closed") {
		t.Errorf("GET /readyz with a failing check = %d %q, want 503 naming the failure", code, body)
	}
}

func TestRun_shutdownFlipsHealthAndReturns(t *testing.T) {
	s := newServer(t)
	r := start(t, s)
	hc := healthpb.NewHealthClient(r.grpcConn)
	if _, err := hc.Check(t.Context(), &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatal(err)
	}
	r.cancel()
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("Run() after cancel = %v, want nil", err)
		}
		r.done <- nil // for Cleanup
	case <-time.After(10 * time.Second):
		t.Fatal("Run() did not return within 10s of cancel")
	}
	if _, err := hc.Check(t.Context(), &healthpb.HealthCheckRequest{}); err == nil {
		t.Error("health Check after shutdown succeeded, want an error")
	}
}

// TestConcerns_bothPaths proves that metrics and panic recovery hold on the
// gRPC path (interceptors) and on the HTTP path (middleware).
func TestConcerns_bothPaths(t *testing.T) {
	s := newServer(t)
	s.Handle("GET /panic", http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("boom") }))
	s.Handle("GET /ok/{id}", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }))
	r := start(t, s)

	if code, _ := get(t, r.baseURL+"/panic"); code != http.StatusInternalServerError {
		t.Errorf("GET /panic = %d, want 500 after recovery", code)
	}
	if code, _ := get(t, r.baseURL+"/ok/123"); code != http.StatusOK {
		t.Errorf("GET /ok/123 = %d, want 200 (server must survive the panic)", code)
	}
	hc := healthpb.NewHealthClient(r.grpcConn)
	if _, err := hc.Check(t.Context(), &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatal(err)
	}

	_, metrics := get(t, r.baseURL+"/metrics")
	for _, want := range []string{
		`parley_http_server_request_seconds_count{code="200",method="GET",route="GET /ok/{id}"} 1`,
		`parley_grpc_server_handling_seconds_count{code="OK",method="/grpc.health.v1.Health/Check"}`,
		`parley_server_panics_total 1`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

func TestRecovery_grpcPath(t *testing.T) {
	logger := slog.New(slog.DiscardHandler)
	m := NewTestMetrics()
	srv := grpc.NewServer(telemetryOptions(m, logger)...)
	healthpb.RegisterHealthServer(srv, panickyHealth{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = healthpb.NewHealthClient(conn).Check(t.Context(), &healthpb.HealthCheckRequest{})
	if status.Code(err) != codes.Internal || status.Convert(err).Message() != "internal error" {
		t.Errorf("Check on a panicking handler = %v, want Internal \"internal error\"", err)
	}
}

func TestNew_tlsFlagsTogether(t *testing.T) {
	_, err := New(Options{Logger: slog.New(slog.DiscardHandler), TLSCertFile: "cert.pem"})
	if err == nil {
		t.Error("New with --tls-cert but no --tls-key succeeded, want an error")
	}
}

// TestRun_drainsRequestsInFlight proves that SIGTERM (ctx cancel) lets a
// request that is already running finish, with an uncancelled context, and
// that Stopping closes for long-lived streams.
func TestRun_drainsRequestsInFlight(t *testing.T) {
	s := newServer(t)
	entered := make(chan struct{})
	release := make(chan struct{})
	s.Handle("GET /slow", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-release
		if err := r.Context().Err(); err != nil {
			http.Error(w, "request context cancelled during drain: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "done")
	}))
	r := start(t, s)
	type result struct {
		code int
		body string
	}
	got := make(chan result, 1)
	go func() {
		resp, err := http.Get(r.baseURL + "/slow")
		if err != nil {
			got <- result{body: err.Error()}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		got <- result{resp.StatusCode, string(b)}
	}()
	<-entered
	r.cancel()
	select {
	case <-s.Stopping():
	case <-time.After(5 * time.Second):
		t.Fatal("Stopping() not closed after shutdown began")
	}
	close(release)
	if res := <-got; res.code != http.StatusOK || res.body != "done" {
		t.Errorf("request in flight at shutdown = %d %q, want 200 \"done\"", res.code, res.body)
	}
}

// TestGateway_oversizedBodyIs413 proves the gateway's body cap answers 413,
// as generated handlers report a body read failure as InvalidArgument.
func TestGateway_oversizedBodyIs413(t *testing.T) {
	s, err := New(Options{Logger: slog.New(slog.DiscardHandler), MaxBodyBytes: 1024})
	if err != nil {
		t.Fatal(err)
	}
	err = s.Gateway.HandlePath(http.MethodPost, "/v1/echo", func(w http.ResponseWriter, r *http.Request, _ map[string]string) {
		if _, err := io.ReadAll(r.Body); err != nil {
			// What generated handlers do with a read error.
			runtime.HTTPError(r.Context(), s.Gateway, &runtime.JSONPb{}, w, r, status.Error(codes.InvalidArgument, err.Error()))
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	if err != nil {
		t.Fatal(err)
	}
	r := start(t, s)
	for _, tc := range []struct {
		size int
		want int
	}{{100, http.StatusOK}, {4096, http.StatusRequestEntityTooLarge}} {
		resp, err := http.Post(r.baseURL+"/v1/echo", "application/json", strings.NewReader(strings.Repeat("x", tc.size)))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("POST /v1/echo with %d bytes = %d, want %d", tc.size, resp.StatusCode, tc.want)
		}
	}
}

func TestFlags_rejectUnknownLogLevel(t *testing.T) {
	var f Flags
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	f.Register(fs, "", "", "")
	if f.LogLevel != "info" {
		t.Errorf("default log level = %q, want info", f.LogLevel)
	}
	if err := fs.Parse([]string{"--log-level", "verbose"}); err == nil {
		t.Error("--log-level verbose accepted, want an error")
	}
	if err := fs.Parse([]string{"--log-level", "WARN"}); err != nil || f.LogLevel != "warn" {
		t.Errorf("--log-level WARN = %q, %v; want warn", f.LogLevel, err)
	}
}

// TestRun_healthFollowsReadiness proves that a failing readiness check
// turns the declared services NOT_SERVING over gRPC (what Kubernetes gRPC
// probes see) and back, while the server-wide entry stays SERVING.
func TestRun_healthFollowsReadiness(t *testing.T) {
	s, err := New(Options{Logger: slog.New(slog.DiscardHandler), ReadinessInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	s.HealthService("parley.test.v1.TestService")
	var mu sync.Mutex
	var failing error
	s.AddReadinessCheck("store", func(context.Context) error { mu.Lock(); defer mu.Unlock(); return failing })
	r := start(t, s)
	hc := healthpb.NewHealthClient(r.grpcConn)
	waitFor := func(svc string, want healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		var got healthpb.HealthCheckResponse_ServingStatus
		for time.Now().Before(deadline) {
			resp, err := hc.Check(t.Context(), &healthpb.HealthCheckRequest{Service: svc}, grpc.WaitForReady(true))
			if err == nil {
				got = resp.GetStatus()
				if got == want {
					return
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
		t.Fatalf("health of %q = %v, want %v", svc, got, want)
	}
	waitFor("parley.test.v1.TestService", healthpb.HealthCheckResponse_SERVING)
	mu.Lock()
	failing = errors.New("store closed")
	mu.Unlock()
	waitFor("parley.test.v1.TestService", healthpb.HealthCheckResponse_NOT_SERVING)
	waitFor("", healthpb.HealthCheckResponse_SERVING)
	mu.Lock()
	failing = nil
	mu.Unlock()
	waitFor("parley.test.v1.TestService", healthpb.HealthCheckResponse_SERVING)
}

// A drain hook runs once shutdown has started (Stopping is closed), with a
// context bounded by ShutdownTimeout, and Run does not return before it does:
// what a hook waits for (streams on hijacked connections writing their last
// event) is over when Run returns.
func TestRun_waitsForDrainHooks(t *testing.T) {
	s := newServer(t)
	entered, release := make(chan struct{}), make(chan struct{})
	var (
		stoppingClosed, bounded bool
		grpcErr                 error
		hc                      healthpb.HealthClient
	)
	s.OnDrain(func(ctx context.Context) {
		select {
		case <-s.Stopping():
			stoppingClosed = true
		default:
		}
		dl, ok := ctx.Deadline()
		bounded = ok && time.Until(dl) <= s.ShutdownTimeout()
		// gRPC still answers (NOT_SERVING): the hooks run before it stops.
		_, grpcErr = hc.Check(ctx, &healthpb.HealthCheckRequest{})
		close(entered)
		<-release
	})
	r := start(t, s)
	hc = healthpb.NewHealthClient(r.grpcConn)
	r.cancel()
	<-entered
	select {
	case err := <-r.done:
		t.Fatalf("Run() = %v while a drain hook was still running", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	if err := <-r.done; err != nil {
		t.Errorf("Run() = %v, want nil", err)
	}
	r.done <- nil // for Cleanup
	if !stoppingClosed || !bounded || grpcErr != nil {
		t.Errorf("hook saw Stopping closed %v, a deadline within ShutdownTimeout %v, a gRPC call's error %v; want closed, bounded, none", stoppingClosed, bounded, grpcErr)
	}
}
