package app_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/serve"
	"github.com/parleyhq/parley/services/dispatcher/app"
	"github.com/parleyhq/parley/services/dispatcher/config"
)

const pd = "---\nname: Echo\ndescription: echoes\nmultiround: false\n---\nEcho."
const pdHex = "1f4a1ba5d3a3b2d4e8b1fa1c7f4b0f36de86e0c3" // arbitrary: the fake does not hash pd

// fakeRegistry stands in for the registry, built in parallel: one agent
// that accepts any protocol it has a routine for, and one protocol.
type fakeRegistry struct {
	registryv1.UnimplementedRegistryServiceServer
}

func (fakeRegistry) GetAgent(_ context.Context, req *registryv1.GetAgentRequest) (*registryv1.Agent, error) {
	if req.GetName() != "clients/acme/agents/echo" && req.GetName() != "clients/acme/agents/other" {
		return nil, status.Error(codes.NotFound, "no such agent")
	}
	return &registryv1.Agent{Name: req.GetName(), SupportPolicy: registryv1.SupportPolicy_SUPPORT_POLICY_IMPLEMENTED}, nil
}

func (fakeRegistry) ResolveProtocol(_ context.Context, req *registryv1.ResolveProtocolRequest) (*registryv1.Protocol, error) {
	if req.GetHash() != pdHex {
		return nil, status.Error(codes.NotFound, "unknown protocol")
	}
	return &registryv1.Protocol{Name: "protocols/" + pdHex, Content: []byte(pd), Sha1Hex: pdHex}, nil
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// startDispatcher runs the dispatcher app on serve.Server over loopback and
// returns a gRPC client and the HTTP base URL.
// Extra args are dispatcher flags.
func startDispatcher(t *testing.T, args ...string) (dispatcherv1.DispatcherServiceClient, string) {
	t.Helper()
	e := startDispatcherApp(t, args...)
	return e.client, e.base
}

// dispatcherEnv is a running dispatcher: the app, a gRPC client, the HTTP
// base URL, and stop, which shuts the server down (once; the cleanup
// calls it too).
type dispatcherEnv struct {
	app    *app.App
	conn   *grpc.ClientConn
	client dispatcherv1.DispatcherServiceClient
	base   string
	stop   func()
}

// startDispatcherApp is startDispatcher with the app and a stop.
func startDispatcherApp(t *testing.T, args ...string) dispatcherEnv {
	t.Helper()
	regLis := listen(t)
	regSrv := grpc.NewServer()
	registryv1.RegisterRegistryServiceServer(regSrv, fakeRegistry{})
	go func() { _ = regSrv.Serve(regLis) }()
	t.Cleanup(regSrv.Stop)
	regConn, err := grpc.NewClient(regLis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { regConn.Close() })
	return startDispatcherWithPeers(t, app.Peers{Registry: regConn, Negotiator: regConn}, args...)
}

// startDispatcherWithPeers is startDispatcherApp with the peers given.
func startDispatcherWithPeers(t *testing.T, peers app.Peers, args ...string) dispatcherEnv {
	t.Helper()
	return startDispatcherServe(t, peers, serve.Options{}, args...)
}

// startDispatcherServe is startDispatcherWithPeers with the server's
// options given (its logger is always discarded).
func startDispatcherServe(t *testing.T, peers app.Peers, opts serve.Options, args ...string) dispatcherEnv {
	t.Helper()
	cfg, err := config.Load(append([]string{"--data", t.TempDir()}, args...), func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.DiscardHandler)
	a, err := app.New(cfg, logger, peers)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	opts.Logger = logger
	srv, err := serve.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := a.Register(ctx, srv); err != nil {
		t.Fatal(err)
	}
	grpcLis, httpLis := listen(t), listen(t)
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, grpcLis, httpLis) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	conn, err := grpc.NewClient(grpcLis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return dispatcherEnv{app: a, conn: conn, client: dispatcherv1.NewDispatcherServiceClient(conn), base: "http://" + httpLis.Addr().String(), stop: stop}
}

func httpDo(t *testing.T, method, url, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestApp_routineOverRESTThenEnvelopeOverAgora(t *testing.T) {
	client, base := startDispatcher(t)
	name := "clients/acme/agents/echo/routines/" + pdHex

	code, body := httpDo(t, "PUT", base+"/v1/"+name, `{"source":"def reply(q, m):\n    return {\"echo\": q}\n"}`)
	if code != 200 || !strings.Contains(body, `"version":"1"`) {
		t.Fatalf("PUT routine = %d %s, want 200 version 1", code, body)
	}
	r, err := client.GetRoutine(t.Context(), &dispatcherv1.GetRoutineRequest{Name: name})
	if err != nil || r.GetVersion() != 1 {
		t.Errorf("GetRoutine over gRPC = %v, %v", r, err)
	}
	code, body = httpDo(t, "POST", base+"/agora/acme/echo", `{"protocolHash":"`+pdHex+`","protocolSources":null,"body":{"a":1}}`)
	if code != 200 || body != `{"status":"success","body":{"echo":{"a":1}}}` {
		t.Errorf("POST envelope = %d %s", code, body)
	}
	code, body = httpDo(t, "POST", base+"/agora/acme/echo", `{"protocolHash":"`+strings.Repeat("0", 40)+`","body":"x"}`)
	if code != 200 || body != `{"status":"rejected"}` {
		t.Errorf("POST unknown protocol = %d %s, want rejected", code, body)
	}
	code, body = httpDo(t, "GET", base+"/v1/clients/acme/agents/echo/routines/bad", "")
	if code != 400 {
		t.Errorf("GET bad routine name = %d %s, want 400", code, body)
	}
	code, body = httpDo(t, "GET", base+"/metrics", "")
	if code != 200 || !strings.Contains(body, `parley_dispatcher_envelopes_total{path="routine"} 1`) || !strings.Contains(body, `parley_dispatcher_envelopes_total{path="rejected"} 1`) {
		t.Errorf("GET /metrics lacks the envelope counters:\n%.2000s", body)
	}
}
