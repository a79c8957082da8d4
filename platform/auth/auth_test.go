package auth

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/parleyhq/parley/platform/grpcerr"
)

// fakeVerifier knows a set of live keys; tests revoke them.
type fakeVerifier struct {
	mu   sync.Mutex
	keys map[string]Principal
}

func (f *fakeVerifier) VerifyKey(_ context.Context, secret string) (Principal, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.keys[secret]
	if !ok {
		return Principal{}, ErrInvalidCredential
	}
	return p, nil
}

func (f *fakeVerifier) revoke(secret string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.keys, secret)
}

type fixture struct {
	health   healthpb.HealthClient
	verifier *fakeVerifier
	operator string
	agentKey string
	otherKey string
	logs     *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// newFixture serves the gRPC health service on loopback behind an
// Authenticator whose policy protects Check and Watch by the request's
// service field, which stands for a resource name here.
func newFixture(t *testing.T, policy Policy, failBurst int) *fixture {
	t.Helper()
	op, err := NewOperatorToken()
	if err != nil {
		t.Fatal(err)
	}
	agentKey, _, _, _ := NewKey(Agent)
	otherKey, _, _, _ := NewKey(Agent)
	v := &fakeVerifier{keys: map[string]Principal{
		agentKey: {Kind: Agent, Client: "clients/acme", Agent: "clients/acme/agents/bot", Key: "clients/acme/agents/bot/keys/1"},
		otherKey: {Kind: Agent, Client: "clients/evil", Agent: "clients/evil/agents/x", Key: "clients/evil/agents/x/keys/2"},
	}}
	logs := &syncBuffer{}
	a := New(Options{
		OperatorToken: op, Verifier: v, Policy: policy,
		Logger:   slog.New(slog.NewJSONHandler(logs, nil)),
		FailRate: 1e-9, FailBurst: failBurst, Recheck: 10 * time.Millisecond,
	})
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(a.UnaryInterceptor()), grpc.ChainStreamInterceptor(a.StreamInterceptor()))
	hs := health.NewServer()
	hs.SetServingStatus("clients/acme/agents/bot", healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(srv, hs)
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
	t.Cleanup(func() { conn.Close() })
	return &fixture{health: healthpb.NewHealthClient(conn), verifier: v, operator: op, agentKey: agentKey, otherKey: otherKey, logs: logs}
}

func withAuth(ctx context.Context, header string) context.Context {
	if header == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", header)
}

var ownedCheck = Policy{
	"/grpc.health.v1.Health/Check": {Allow: Agent | Operator, Resource: "service"},
	"/grpc.health.v1.Health/Watch": {Allow: Agent | Operator, Resource: "service"},
}

func TestUnary_codesPerCaller(t *testing.T) {
	f := newFixture(t, ownedCheck, 100)
	clientKey, _, _, _ := NewKey(Client)
	mine := "clients/acme/agents/bot"
	tests := []struct {
		name    string
		header  string
		service string
		code    codes.Code
		reason  string
	}{
		{"anonymous", "", mine, codes.Unauthenticated, ReasonMissing},
		{"not bearer", "Basic abc", mine, codes.Unauthenticated, ReasonMalformed},
		{"wrong prefix", "Bearer parley_zz_" + strings.Repeat("a", 60), mine, codes.Unauthenticated, ReasonMalformed},
		{"huge header", "Bearer " + strings.Repeat("a", 10000), mine, codes.Unauthenticated, ReasonMalformed},
		{"unknown key", "Bearer " + clientKey, mine, codes.Unauthenticated, ReasonInvalid},
		{"wrong operator token", "Bearer " + OperatorPrefix + strings.Repeat("A", 43), mine, codes.Unauthenticated, ReasonInvalid},
		{"another agent's key", "Bearer " + f.otherKey, mine, codes.PermissionDenied, ReasonNotOwner},
		{"own key, missing resource checked before existence", "Bearer " + f.agentKey, "clients/acme/agents/bot/x", codes.NotFound, ""},
		{"own key", "Bearer " + f.agentKey, mine, codes.OK, ""},
		{"operator", "Bearer " + f.operator, mine, codes.OK, ""},
		{"lowercase scheme", "bearer " + f.agentKey, mine, codes.OK, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := f.health.Check(withAuth(t.Context(), tt.header), &healthpb.HealthCheckRequest{Service: tt.service})
			if status.Code(err) != tt.code || grpcerr.Reason(err) != tt.reason {
				t.Errorf("Check(%s) = %v (reason %q), want %v %q", tt.name, err, grpcerr.Reason(err), tt.code, tt.reason)
			}
		})
	}
	logs := f.logs.String()
	for _, secret := range []string{f.agentKey, f.otherKey, f.operator, clientKey} {
		if strings.Contains(logs, secret) {
			t.Errorf("logs hold a credential: %s", logs)
		}
	}
	if !strings.Contains(logs, `"reason":"RESOURCE_NOT_OWNED"`) || !strings.Contains(logs, `"principal":"clients/evil/agents/x"`) {
		t.Errorf("logs lack the refusal with its principal and reason: %s", logs)
	}
}

func TestUnary_noPolicyEntryIsRefused(t *testing.T) {
	f := newFixture(t, Policy{}, 100)
	_, err := f.health.Check(withAuth(t.Context(), "Bearer "+f.operator), &healthpb.HealthCheckRequest{})
	if status.Code(err) != codes.PermissionDenied || grpcerr.Reason(err) != ReasonNoPolicy {
		t.Errorf("Check with no policy entry, as operator = %v; want PERMISSION_DENIED %s", err, ReasonNoPolicy)
	}
}

func TestUnary_failedAuthIsRateLimitedPerAddress(t *testing.T) {
	f := newFixture(t, ownedCheck, 5)
	bad := withAuth(t.Context(), "Bearer nonsense")
	for i := range 5 {
		if _, err := f.health.Check(bad, &healthpb.HealthCheckRequest{}); status.Code(err) != codes.Unauthenticated {
			t.Fatalf("failure #%d = %v, want UNAUTHENTICATED", i+1, err)
		}
	}
	_, err := f.health.Check(bad, &healthpb.HealthCheckRequest{})
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("failure past the burst = %v, want RESOURCE_EXHAUSTED", err)
	}
	// Even a good key waits while the address is limited: guessing stops.
	_, err = f.health.Check(withAuth(t.Context(), "Bearer "+f.agentKey), &healthpb.HealthCheckRequest{Service: "clients/acme/agents/bot"})
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("good key from a limited address = %v, want RESOURCE_EXHAUSTED", err)
	}
	// Calls without a credential are not failures and stay unaffected.
	if _, err := f.health.Check(t.Context(), &healthpb.HealthCheckRequest{}); status.Code(err) != codes.Unauthenticated || grpcerr.Reason(err) != ReasonMissing {
		t.Errorf("no credential from a limited address = %v, want UNAUTHENTICATED %s", err, ReasonMissing)
	}
}

func TestStream_resourceCheckedOnFirstMessage(t *testing.T) {
	f := newFixture(t, ownedCheck, 100)
	s, err := f.health.Watch(withAuth(t.Context(), "Bearer "+f.otherKey), &healthpb.HealthCheckRequest{Service: "clients/acme/agents/bot"})
	if err == nil {
		_, err = s.Recv()
	}
	if status.Code(err) != codes.PermissionDenied {
		t.Errorf("Watch(another agent's resource) = %v, want PERMISSION_DENIED", err)
	}
}

func TestStream_revokedKeyEndsOpenStream(t *testing.T) {
	f := newFixture(t, ownedCheck, 100)
	s, err := f.health.Watch(withAuth(t.Context(), "Bearer "+f.agentKey), &healthpb.HealthCheckRequest{Service: "clients/acme/agents/bot"})
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := s.Recv(); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("Watch first message = %v, %v; want SERVING", resp, err)
	}
	f.verifier.revoke(f.agentKey)
	// The stream must end on its own (Recheck is 10ms); the test's own
	// deadline bounds the wait.
	_, err = s.Recv()
	if status.Code(err) != codes.Unauthenticated {
		t.Errorf("Recv after revoking the key = %v, want UNAUTHENTICATED", err)
	}
	if _, err := f.health.Check(withAuth(t.Context(), "Bearer "+f.agentKey), &healthpb.HealthCheckRequest{Service: "clients/acme/agents/bot"}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("Check with the revoked key = %v, want UNAUTHENTICATED", err)
	}
}

func TestParleyPolicy_rulesNameResourcesOwnersCanHold(t *testing.T) {
	for method, rule := range ParleyPolicy() {
		if rule.Allow == 0 {
			t.Errorf("%s allows nobody; say Operator if only the operator may call it", method)
		}
		if rule.Resource != "" && rule.Allow&(Agent|Client) == 0 {
			t.Errorf("%s names resource %q but allows neither agents nor clients, so it is never checked", method, rule.Resource)
		}
	}
}
