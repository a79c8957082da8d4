package auth

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/protobuf/types/known/typepb"
)

// TestGateway_resourceNotReadFromQueryTheRequestIgnores proves that a
// caller cannot pass the ownership check with a query parameter naming
// its own agent while the body, which the gateway decodes into the
// request, names another: routes with body "*" or a body field covering
// the resource never take it from the query.
func TestGateway_resourceNotReadFromQueryTheRequestIgnores(t *testing.T) {
	key, _, _, _ := NewKey(Client)
	v := &fakeVerifier{keys: map[string]Principal{
		key: {Kind: Client, Client: "clients/mine", Key: "clients/mine/keys/1"},
	}}
	const (
		start  = "/parley.test.v1.Svc/Start"
		create = "/parley.test.v1.Svc/Create"
		list   = "/parley.test.v1.Svc/List"
	)
	a := New(Options{Verifier: v, Policy: Policy{
		start:  {Allow: Client, Resource: "agent"},
		create: {Allow: Client, Resource: "task.agent"},
		list:   {Allow: Client, Resource: "agent"},
	}})
	a.routes = map[string]gatewayRoute{
		"POST /v1/negotiations:start": {method: start, body: "*"},
		"POST /v1/tasks":              {method: create, body: "task"},
		"GET /v1/ledger":              {method: list},
	}
	mux := runtime.NewServeMux(runtime.WithMiddlewares(a.Gateway))
	reached := 0
	ok := func(w http.ResponseWriter, _ *http.Request, _ map[string]string) { reached++ }
	for _, p := range [][2]string{{"POST", "/v1/negotiations:start"}, {"POST", "/v1/tasks"}, {"GET", "/v1/ledger"}} {
		if err := mux.HandlePath(p[0], p[1], ok); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		verb, url string
		want      int
	}{
		{"POST", "/v1/negotiations:start?agent=clients/mine/agents/a", http.StatusForbidden},
		{"POST", "/v1/tasks?task.agent=clients/mine/agents/a", http.StatusForbidden},
		{"GET", "/v1/ledger?agent=clients/mine/agents/a", http.StatusOK},
		{"GET", "/v1/ledger?agent=clients/other/agents/a", http.StatusForbidden},
	} {
		before := reached
		req := httptest.NewRequest(tc.verb, tc.url, strings.NewReader(`{"agent":"clients/victim/agents/b"}`))
		req.Header.Set("Authorization", "Bearer "+key)
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, req)
		if rec.Code != tc.want {
			t.Errorf("%s %s: status %d, want %d (%s)", tc.verb, tc.url, rec.Code, tc.want, rec.Body)
		}
		if got := reached > before; got != (tc.want == http.StatusOK) {
			t.Errorf("%s %s: handler reached = %v", tc.verb, tc.url, got)
		}
	}
}

// TestGateway_resourceReadFromTheDecodedBody: a resource the body carries
// is read as the gateway decodes it, so an owner passes over REST as over
// gRPC, another caller is refused, and a body that does not decode (two
// values, bad JSON) is refused rather than read one way here and another
// by the handler. The handler gets the body unchanged.
func TestGateway_resourceReadFromTheDecodedBody(t *testing.T) {
	key, _, _, _ := NewKey(Client)
	v := &fakeVerifier{keys: map[string]Principal{
		key: {Kind: Client, Client: "clients/mine", Key: "clients/mine/keys/1"},
	}}
	const whole, field = "/parley.test.v1.Svc/Whole", "/parley.test.v1.Svc/Field"
	a := New(Options{Verifier: v, Policy: Policy{
		whole: {Allow: Client, Resource: "source_context.file_name"},
		field: {Allow: Client, Resource: "source_context.file_name"},
	}})
	// typepb.Type stands in for a request: source_context.file_name is a
	// nested string like task.agent.
	input := (&typepb.Type{}).ProtoReflect().Type()
	a.routes = map[string]gatewayRoute{
		"POST /v1/whole": {method: whole, body: "*", input: input},
		"POST /v1/field": {method: field, body: "source_context", input: input},
	}
	mux := runtime.NewServeMux(runtime.WithMiddlewares(a.Gateway))
	var got string
	ok := func(_ http.ResponseWriter, r *http.Request, _ map[string]string) {
		b, _ := io.ReadAll(r.Body)
		got = string(b)
	}
	for _, p := range []string{"/v1/whole", "/v1/field"} {
		if err := mux.HandlePath("POST", p, ok); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		url, body string
		want      int
	}{
		{"/v1/whole", `{"sourceContext":{"fileName":"clients/mine/agents/a"}}`, http.StatusOK},
		{"/v1/whole", `{"source_context":{"file_name":"clients/mine/agents/a"}}`, http.StatusOK},
		{"/v1/whole", `{"sourceContext":{"fileName":"clients/victim/agents/b"}}`, http.StatusForbidden},
		{"/v1/whole", `{"sourceContext":{"fileName":"clients/mine/agents/a"}} {"sourceContext":{"fileName":"clients/victim/agents/b"}}`, http.StatusForbidden},
		{"/v1/whole", `{"sourceContext":`, http.StatusForbidden},
		{"/v1/whole", ``, http.StatusForbidden},
		{"/v1/field", `{"fileName":"clients/mine/agents/a","unknown":1}`, http.StatusOK},
		{"/v1/field", `{"fileName":"clients/victim/agents/b"}`, http.StatusForbidden},
	} {
		got = ""
		req := httptest.NewRequest("POST", tc.url, strings.NewReader(tc.body))
		req.Header.Set("Authorization", "Bearer "+key)
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, req)
		if rec.Code != tc.want {
			t.Errorf("POST %s %s: status %d, want %d (%s)", tc.url, tc.body, rec.Code, tc.want, rec.Body)
		}
		if tc.want == http.StatusOK && got != tc.body {
			t.Errorf("POST %s: the handler read body %q, want it unchanged: %q", tc.url, got, tc.body)
		}
	}
}
