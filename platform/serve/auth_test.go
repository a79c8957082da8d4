package serve

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"testing"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/parleyhq/parley/platform/auth"
)

// TestAuth_bothPaths proves one policy holds on gRPC, on the in-process
// gateway and on hand-written routes, with the operator token read from
// the data directory.
func TestAuth_bothPaths(t *testing.T) {
	dir := t.TempDir()
	policy := auth.Policy{
		"GET /healthz":                 {Allow: auth.Anyone},
		"GET /readyz":                  {Allow: auth.Anyone},
		"GET /metrics":                 {Allow: auth.Operator},
		"GET /agents/{agent}/secret":   {Allow: auth.Agent | auth.Operator, Resource: "agent"},
		"GET /v1/{name=things/*}":      {Allow: auth.Operator},
		"/grpc.health.v1.Health/Check": {Allow: auth.Operator},
	}
	s, err := New(Options{Logger: slog.New(slog.DiscardHandler), DataDir: dir, Policy: policy})
	if err != nil {
		t.Fatal(err)
	}
	agentKey, _, _, _ := auth.NewKey(auth.Agent)
	s.SetKeyVerifier(auth.VerifierFunc(func(_ context.Context, secret string) (auth.Principal, error) {
		if secret == agentKey {
			return auth.Principal{Kind: auth.Agent, Client: "clients/c", Agent: "clients/c/agents/a", Key: "clients/c/agents/a/keys/1"}, nil
		}
		return auth.Principal{}, auth.ErrInvalidCredential
	}))
	var seen auth.Principal
	s.Handle("GET /agents/{agent}/secret", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen, _ = auth.FromContext(r.Context())
		_, _ = io.WriteString(w, "ok")
	}))
	if err := s.Gateway.HandlePath(http.MethodGet, "/v1/{name=things/*}", func(w http.ResponseWriter, _ *http.Request, _ map[string]string) {
		_, _ = io.WriteString(w, "thing")
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.Gateway.HandlePath(http.MethodGet, "/v1/unlisted", func(w http.ResponseWriter, _ *http.Request, _ map[string]string) {
		_, _ = io.WriteString(w, "open?")
	}); err != nil {
		t.Fatal(err)
	}
	inProc, err := s.InProcessConn()
	if err != nil {
		t.Fatal(err)
	}
	defer inProc.Close()
	r := start(t, s)
	op, _, _, err := auth.LoadOperatorToken("", dir)
	if err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name, path, token string
		want              int
	}{
		{"health is public", "/healthz", "", http.StatusOK},
		{"metrics need the operator", "/metrics", "", http.StatusUnauthorized},
		{"metrics refuse an agent", "/metrics", agentKey, http.StatusForbidden},
		{"metrics with the operator token", "/metrics", op, http.StatusOK},
		{"route: own agent", "/agents/clients%2Fc%2Fagents%2Fa/secret", agentKey, http.StatusOK},
		{"route: another agent", "/agents/clients%2Fc%2Fagents%2Fb/secret", agentKey, http.StatusForbidden},
		{"route: anonymous", "/agents/x/secret", "", http.StatusUnauthorized},
		{"gateway: agent refused", "/v1/things/1", agentKey, http.StatusForbidden},
		{"gateway: operator", "/v1/things/1", op, http.StatusOK},
		{"gateway: route without an entry, operator", "/v1/unlisted", op, http.StatusForbidden},
		{"garbage credential", "/healthz", "nonsense", http.StatusUnauthorized},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, r.baseURL+tt.path, nil)
			if tt.token != "" {
				req.Header.Set("Authorization", "Bearer "+tt.token)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tt.want {
				t.Errorf("GET %s = %d %s, want %d", tt.path, resp.StatusCode, body, tt.want)
			}
		})
	}
	if seen.Agent != "clients/c/agents/a" {
		t.Errorf("the route's handler saw principal %+v, want the agent", seen)
	}

	hc := healthpb.NewHealthClient(r.grpcConn)
	if _, err := hc.Check(t.Context(), &healthpb.HealthCheckRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("gRPC Check without a credential = %v, want UNAUTHENTICATED", err)
	}
	ctx := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer "+op)
	if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("gRPC Check as the operator = %v", err)
	}
	if _, err := healthpb.NewHealthClient(inProc).Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("in-process Check = %v; the in-process connection calls as the operator", err)
	}
}
