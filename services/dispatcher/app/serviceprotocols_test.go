package app_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/serve"
	"github.com/parleyhq/parley/services/dispatcher/app"
)

// Until the built-in service protocols are stored in the registry (the fake
// registry here never stores them), NewRequest under one of them is
// UNAVAILABLE, which a caller retries, not INVALID_ARGUMENT.
func TestApp_newRequestBeforeTheBuiltinProtocolsAreRegisteredIsUnavailable(t *testing.T) {
	client, _ := startDispatcher(t)
	_, err := client.NewRequest(t.Context(), &dispatcherv1.NewRequestRequest{
		Sender: "clients/acme/agents/echo", To: &dispatcherv1.DistributionList{Direct: []string{"clients/acme/agents/other"}},
		Protocol: "allocate", TaskJson: `{"what":"deliver"}`,
	})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "not registered") {
		t.Fatalf("NewRequest(allocate) before registration: error = %v, want UNAVAILABLE saying it is not registered yet", err)
	}
}

// startingRegistry is a registry that takes the built-in service protocols
// only once accepting is set, as one still starting would not.
type startingRegistry struct {
	fakeRegistry
	accepting *atomic.Bool
}

func (r startingRegistry) CreateProtocol(_ context.Context, req *registryv1.CreateProtocolRequest) (*registryv1.Protocol, error) {
	if !r.accepting.Load() {
		return nil, status.Error(codes.Unavailable, "registry starting")
	}
	return &registryv1.Protocol{Content: req.GetProtocol().GetContent()}, nil
}

// The dispatcher is not ready (/readyz 503, its gRPC health NOT_SERVING)
// until it has stored the built-in service protocols in the registry, so
// that a balancer sends it no service transactions it would refuse: first
// with the registry not up at all, then up but not taking them yet; ready
// once it takes them.
func TestApp_notReadyUntilTheBuiltinProtocolsAreRegistered(t *testing.T) {
	// The registry's address is bound but nothing serves it yet.
	regLis := listen(t)
	regConn, err := grpc.NewClient(regLis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { regConn.Close() })
	e := startDispatcherServe(t, app.Peers{Registry: regConn, Negotiator: regConn}, serve.Options{ReadinessInterval: 20 * time.Millisecond})

	readyz := func() (int, map[string]string) {
		t.Helper()
		code, body := httpDo(t, "GET", e.base+"/readyz", "")
		var r struct {
			Failures map[string]string `json:"failures"`
		}
		if err := json.Unmarshal([]byte(body), &r); err != nil {
			t.Fatalf("/readyz body %q: %v", body, err)
		}
		return code, r.Failures
	}
	hc := healthpb.NewHealthClient(e.conn)
	dispatcherHealth := func() healthpb.HealthCheckResponse_ServingStatus {
		t.Helper()
		resp, err := hc.Check(t.Context(), &healthpb.HealthCheckRequest{Service: app.ServiceName})
		if err != nil {
			t.Fatalf("health Check(%s): %v", app.ServiceName, err)
		}
		return resp.GetStatus()
	}
	// waitFor polls cond until it holds; the deadline only bounds a hang.
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("still not %s after 30s", what)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	if code, failures := readyz(); code != http.StatusServiceUnavailable || !strings.Contains(failures["service-protocols"], "not registered") {
		t.Errorf("/readyz with the registry not up = %d %v, want 503 with service-protocols not registered", code, failures)
	}

	// The registry answers, health included, but does not take them yet:
	// only the service protocols keep the dispatcher out of service.
	var accepting atomic.Bool
	regSrv := grpc.NewServer()
	registryv1.RegisterRegistryServiceServer(regSrv, startingRegistry{accepting: &accepting})
	healthpb.RegisterHealthServer(regSrv, health.NewServer())
	go func() { _ = regSrv.Serve(regLis) }()
	t.Cleanup(regSrv.Stop)
	waitFor("reporting only the service protocols", func() bool {
		code, failures := readyz()
		_, named := failures["service-protocols"]
		return code == http.StatusServiceUnavailable && named && len(failures) == 1
	})
	if st := dispatcherHealth(); st != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("dispatcher gRPC health with the service protocols not registered = %v, want NOT_SERVING", st)
	}

	accepting.Store(true)
	waitFor("ready once the registry takes them", func() bool {
		code, _ := readyz()
		return code == http.StatusOK && dispatcherHealth() == healthpb.HealthCheckResponse_SERVING
	})
}
