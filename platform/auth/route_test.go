package auth

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
)

// A hand-written route's resource may be a template of its path values;
// a value holding an escaped "/" owns nothing.
func TestRoute_resourceTemplateJoinsPathValues(t *testing.T) {
	const pattern = "GET /v1/clients/{client}/agents/{agent}/messages:stream"
	agentKey, _, _, _ := NewKey(Agent)
	v := &fakeVerifier{keys: map[string]Principal{
		agentKey: {Kind: Agent, Client: "clients/acme", Agent: "clients/acme/agents/bot", Key: "clients/acme/agents/bot/keys/1"},
	}}
	a := New(Options{
		Verifier: v, Logger: slog.New(slog.DiscardHandler),
		Policy: Policy{pattern: {Allow: Agent | Operator, Resource: "clients/{client}/agents/{agent}"}},
	})
	mux := http.NewServeMux()
	mux.Handle(pattern, a.Route(pattern, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })))
	tests := []struct {
		name, path string
		want       int
	}{
		{"own agent", "/v1/clients/acme/agents/bot/messages:stream", http.StatusNoContent},
		{"another agent", "/v1/clients/acme/agents/other/messages:stream", http.StatusForbidden},
		{"another client", "/v1/clients/evil/agents/bot/messages:stream", http.StatusForbidden},
		{"escaped slash under own name", "/v1/clients/acme/agents/bot%2Fx/messages:stream", http.StatusForbidden},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, tt.path, nil)
			r.Header.Set("Authorization", "Bearer "+agentKey)
			w := httptest.NewRecorder()
			a.Middleware(mux).ServeHTTP(w, r)
			if w.Code != tt.want {
				t.Errorf("GET %s = %d, want %d", tt.path, w.Code, tt.want)
			}
		})
	}
}
