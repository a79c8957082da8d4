package e2e

import (
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/parleyhq/parley/e2e/parleytest"
	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/platform/pgdb/pgdbtest"
)

// switchProxy forwards TCP connections to target while up; while down it
// closes each connection at once, as a database that is not there would.
type switchProxy struct {
	ln     net.Listener
	target string
	up     atomic.Bool
	wg     sync.WaitGroup

	mu    sync.Mutex
	conns map[net.Conn]bool // open client and server sides, for cut
}

func newSwitchProxy(t *testing.T, target string) *switchProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &switchProxy{ln: ln, target: target, conns: map[net.Conn]bool{}}
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

// cut takes the database away: new connections are refused and open ones
// closed, as when its server or the network to it fails.
func (p *switchProxy) cut() {
	p.up.Store(false)
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
}

// track records c as open until the returned function runs.
func (p *switchProxy) track(c net.Conn) func() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.conns[c] = true
	return func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		delete(p.conns, c)
		c.Close()
	}
}

func (p *switchProxy) forward(c net.Conn) {
	defer p.track(c)()
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	defer p.track(s)()
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

// TestPostgreSQL_databaseLostUnderLoad: when the database goes away while
// writers are busy, calls fail UNAVAILABLE (STORE_UNAVAILABLE; the Agent
// Protocol route 503), never INTERNAL; once it is back they succeed again,
// and every write acknowledged before, during or after the outage is there.
func TestPostgreSQL_databaseLostUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("starts parley serve on PostgreSQL")
	}
	db := pgdbtest.Database(t)
	u, err := url.Parse(db)
	if err != nil {
		t.Fatal(err)
	}
	proxy := newSwitchProxy(t, u.Host)
	proxy.up.Store(true)
	u.Host = proxy.ln.Addr().String()
	srv := parleytest.Start(t, "", "--database-url", u.String())
	conn, err := grpc.NewClient(srv.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(parleytest.Bearer(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	reg := registryv1.NewRegistryServiceClient(conn)

	var (
		mu          sync.Mutex
		acked       []string
		unavailable int
		others      []error
		stop        atomic.Bool
		wg          sync.WaitGroup
	)
	for w := range 4 {
		wg.Go(func() {
			for k := 0; !stop.Load(); k++ {
				id := "w" + strconv.Itoa(w) + "-" + strconv.Itoa(k)
				_, err := reg.CreateAgent(t.Context(), &registryv1.CreateAgentRequest{Parent: "clients/load", AgentId: id, Agent: &registryv1.Agent{DisplayName: id}})
				mu.Lock()
				switch {
				case err == nil:
					acked = append(acked, "clients/load/agents/"+id)
				case status.Code(err) == codes.Unavailable && grpcerr.Reason(err) == grpcerr.ReasonStoreUnavailable:
					unavailable++
				default:
					others = append(others, err)
				}
				mu.Unlock()
			}
		})
	}
	progress := func() (int, int) {
		mu.Lock()
		defer mu.Unlock()
		return len(acked), unavailable
	}
	waitFor := func(what string, cond func(acked, unavailable int) bool) {
		t.Helper()
		for deadline := time.Now().Add(time.Minute); !cond(progress()); time.Sleep(20 * time.Millisecond) { // polling the writers
			if time.Now().After(deadline) {
				stop.Store(true)
				wg.Wait()
				a, n := progress()
				t.Fatalf("after a minute, still waiting for %s (%d acknowledged, %d unavailable, others %v)\n%s", what, a, n, others, srv.Log)
			}
		}
	}
	waitFor("writes to succeed", func(a, _ int) bool { return a >= 20 })
	proxy.cut()
	before, _ := progress()
	waitFor("calls to fail UNAVAILABLE", func(_, n int) bool { return n >= 20 })
	resp, err := http.Post(srv.URL("/ap/v1/agent/tasks"), "application/json", strings.NewReader(`{"input":"while down"}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("POST /ap/v1/agent/tasks with the database down = %d %s, want 503", resp.StatusCode, body)
	}
	proxy.up.Store(true)
	waitFor("writes to succeed again", func(a, _ int) bool { return a >= before+20 })
	stop.Store(true)
	wg.Wait()

	if len(others) > 0 {
		t.Errorf("%d calls failed otherwise than UNAVAILABLE STORE_UNAVAILABLE, first: %v\n%s", len(others), others[0], srv.Log)
	}
	for _, name := range acked {
		if _, err := reg.GetAgent(t.Context(), &registryv1.GetAgentRequest{Name: name}); err != nil {
			t.Errorf("GetAgent(%q), acknowledged before, during or after the outage = %v", name, err)
		}
	}
	t.Logf("%d writes acknowledged, %d refused UNAVAILABLE", len(acked), unavailable)
}
