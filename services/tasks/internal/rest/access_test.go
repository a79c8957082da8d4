package rest

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/parleyhq/parley/platform/auth"
)

// TestGuard covers what the permission matrix in cmd/parley cannot reach
// through a running server: a registry that cannot answer, and a server
// without access control.
func TestGuard(t *testing.T) {
	const agent = "clients/acme/agents/bot"
	reached := func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) }
	for _, tc := range []struct {
		name  string
		token func(context.Context, string) (bool, error)
		ctx   func(context.Context) context.Context
		want  int
	}{
		{"token, anonymous", fixedToken(true, nil), asKind(auth.Principal{Kind: auth.Anonymous}), http.StatusUnauthorized},
		{"token, own agent", fixedToken(true, nil), asKind(auth.Principal{Kind: auth.Agent, Client: "clients/acme", Agent: agent}), http.StatusTeapot},
		{"token, another client", fixedToken(true, nil), asKind(auth.Principal{Kind: auth.Client, Client: "clients/rival"}), http.StatusForbidden},
		{"token, access control off", fixedToken(true, nil), func(ctx context.Context) context.Context { return ctx }, http.StatusTeapot},
		{"public, anonymous", fixedToken(false, nil), asKind(auth.Principal{Kind: auth.Anonymous}), http.StatusTeapot},
		{"registry down", fixedToken(false, status.Error(codes.Unavailable, "down")), asKind(auth.Principal{Kind: auth.Anonymous}), http.StatusServiceUnavailable},
	} {
		h := New(nil, Options{DefaultAgent: agent, MaxPageSize: 100, MaxUploadBytes: 1 << 20, TokenRequired: tc.token})
		r := httptest.NewRequestWithContext(tc.ctx(t.Context()), http.MethodGet, "/ap/v1/agent/tasks", nil)
		w := httptest.NewRecorder()
		h.guard(reached).ServeHTTP(w, r)
		if w.Code != tc.want {
			t.Errorf("%s: GET /ap/v1/agent/tasks = %d %s, want %d", tc.name, w.Code, w.Body, tc.want)
		}
	}
}

func fixedToken(token bool, err error) func(context.Context, string) (bool, error) {
	return func(context.Context, string) (bool, error) { return token, err }
}

func asKind(p auth.Principal) func(context.Context) context.Context {
	return func(ctx context.Context) context.Context { return auth.WithPrincipal(ctx, p) }
}
