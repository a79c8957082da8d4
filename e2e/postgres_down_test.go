package e2e

import (
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/parleyhq/parley/e2e/parleytest"
	"github.com/parleyhq/parley/platform/pgdb/pgdbtest"
)

// switchProxy forwards TCP connections to target while up; while down it
// closes each connection at once, as a database that is not there would.
type switchProxy struct {
	ln     net.Listener
	target string
	up     atomic.Bool
	wg     sync.WaitGroup
}

func newSwitchProxy(t *testing.T, target string) *switchProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &switchProxy{ln: ln, target: target}
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if !p.up.Load() {
				c.Close()
				continue
			}
			p.wg.Go(func() { p.forward(c) })
		}
	})
	t.Cleanup(func() { ln.Close(); p.wg.Wait() })
	return p
}

func (p *switchProxy) forward(c net.Conn) {
	defer c.Close()
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	defer s.Close()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(s, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, s); done <- struct{}{} }()
	<-done
}

// TestPostgreSQL_databaseDownAtStart: `parley serve` whose database does
// not answer starts anyway, not ready (/readyz 503, health NOT_SERVING),
// keeps trying, and becomes ready once the database answers.
func TestPostgreSQL_databaseDownAtStart(t *testing.T) {
	db := pgdbtest.Database(t)
	u, err := url.Parse(db)
	if err != nil {
		t.Fatal(err)
	}
	proxy := newSwitchProxy(t, u.Host)
	u.Host = proxy.ln.Addr().String()
	srv := parleytest.Start(t, "", "--database-url", u.String())

	readyz := func() (int, string) {
		t.Helper()
		resp, err := http.Get(srv.URL("/readyz"))
		if err != nil {
			t.Fatalf("GET /readyz: %v\n%s", err, srv.Log)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := readyz(); code != http.StatusServiceUnavailable || !strings.Contains(body, "store") {
		t.Errorf("/readyz with the database down = %d %s, want 503 naming the stores", code, body)
	}
	conn, err := grpc.NewClient(srv.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(parleytest.Bearer(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	health := func(svc string) healthpb.HealthCheckResponse_ServingStatus {
		resp, err := healthpb.NewHealthClient(conn).Check(t.Context(), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil {
			t.Fatalf("health Check(%q): %v", svc, err)
		}
		return resp.GetStatus()
	}
	const registry = "parley.registry.v1.RegistryService"
	if got := health(registry); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("registry health with the database down = %v, want NOT_SERVING", got)
	}

	proxy.up.Store(true)
	// Retries back off up to 10s and health follows readiness every 5s:
	// a generous minute, a failure bound and not a measure.
	deadline := time.Now().Add(time.Minute)
	for {
		code, body := readyz()
		if code == http.StatusOK && health(registry) == healthpb.HealthCheckResponse_SERVING {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not ready a minute after the database came back: /readyz %d %s\n%s", code, body, srv.Log)
		}
		time.Sleep(200 * time.Millisecond) // between polls
	}
	select {
	case <-srv.Exited:
		t.Fatalf("parley serve exited: %v\n%s", srv.ExitErr, srv.Log)
	default:
	}
	if err := srv.Stop(10 * time.Second); err != nil {
		t.Errorf("SIGTERM: %v\n%s", err, srv.Log)
	}
}
