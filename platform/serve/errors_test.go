package serve

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/parleyhq/parley/platform/grpcerr"
)

var errNotThere = grpcerr.New(codes.NotFound, `thing "x" not found`, "THING_NOT_FOUND", "test.parley.dev", nil)

// TestRouting_unknownRouteAndWrongMethod proves that an unknown path is 404
// and a known path with the wrong method is 405, in the JSON error body of
// the routes around them: the gateway's {code, message} by default, a
// registered shape (the Agent Protocol's {"message"}) under its prefix.
func TestRouting_unknownRouteAndWrongMethod(t *testing.T) {
	s := newServer(t)
	if err := s.Gateway.HandlePath(http.MethodGet, "/v1/things", func(w http.ResponseWriter, _ *http.Request, _ map[string]string) {
		w.WriteHeader(http.StatusOK)
	}); err != nil {
		t.Fatal(err)
	}
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	s.Handle("GET /plain/{id}", ok)
	s.Handle("POST /ap/v1/agent/tasks", ok)
	s.Handle("GET /ap/v1/agent/tasks", ok)
	s.HandleErrors("/ap/", func(w http.ResponseWriter, _ *http.Request, code int, msg string) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(map[string]string{"message": msg})
	})
	r := start(t, s)

	tests := []struct {
		name, method, path string
		wantCode           int
		wantAllow          string
		wantKeys           []string // top-level keys of the JSON body
	}{
		{"gateway route", "GET", "/v1/things", 200, "", nil},
		{"unknown path", "GET", "/nowhere", 404, "", []string{"code", "details", "message"}},
		{"gateway wrong method", "DELETE", "/v1/things", 405, "", []string{"code", "details", "message"}},
		{"hand-written wrong method", "POST", "/plain/7", 405, "GET, HEAD", []string{"code", "details", "message"}},
		{"healthz wrong method", "POST", "/healthz", 405, "GET, HEAD", []string{"code", "details", "message"}},
		{"agent protocol wrong method", "DELETE", "/ap/v1/agent/tasks", 405, "GET, HEAD, POST", []string{"message"}},
		{"agent protocol unknown path", "GET", "/ap/v1/agent/nothing", 404, "", []string{"message"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequestWithContext(t.Context(), tt.method, r.baseURL+tt.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tt.wantCode {
				t.Fatalf("%s %s = %d %s, want %d", tt.method, tt.path, resp.StatusCode, body, tt.wantCode)
			}
			if got := resp.Header.Get("Allow"); got != tt.wantAllow {
				t.Errorf("%s %s Allow = %q, want %q", tt.method, tt.path, got, tt.wantAllow)
			}
			if tt.wantKeys == nil {
				return
			}
			if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
				t.Errorf("%s %s Content-Type = %q, want application/json", tt.method, tt.path, ct)
			}
			var m map[string]any
			if err := json.Unmarshal(body, &m); err != nil {
				t.Fatalf("%s %s body %s is not a JSON object: %v", tt.method, tt.path, body, err)
			}
			var keys []string
			for k := range m {
				keys = append(keys, k)
			}
			if got, want := strings.Join(sorted(keys), ","), strings.Join(tt.wantKeys, ","); got != want {
				t.Errorf("%s %s body keys = %s (%s), want %s", tt.method, tt.path, got, body, want)
			}
		})
	}
}

func sorted(s []string) []string {
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
	return s
}

// TestWriteError_sameBodyAsGateway proves hand-written routes can answer
// with exactly the gateway's error body and status.
func TestWriteError_sameBodyAsGateway(t *testing.T) {
	s := newServer(t)
	s.Handle("GET /fails", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		WriteError(w, r, errNotThere)
	}))
	if err := s.Gateway.HandlePath(http.MethodGet, "/v1/fails", func(w http.ResponseWriter, r *http.Request, _ map[string]string) {
		// What generated handlers do with an error.
		_, m := runtime.MarshalerForRequest(s.Gateway, r)
		runtime.HTTPError(r.Context(), s.Gateway, m, w, r, errNotThere)
	}); err != nil {
		t.Fatal(err)
	}
	r := start(t, s)
	var bodies []string
	for _, p := range []string{"/fails", "/v1/fails"} {
		resp, err := http.Get(r.baseURL + p)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s = %d, want 404", p, resp.StatusCode)
		}
		bodies = append(bodies, string(b))
	}
	if bodies[0] != bodies[1] || !strings.Contains(bodies[0], `"message":"thing \"x\" not found"`) {
		t.Errorf("bodies = %q, want two equal gateway bodies with the message", bodies)
	}
}

// In `parley gateway` the gateway's backends are gRPC clients: when one
// cannot be reached, the status is the transport's, whose text names our
// addresses. Callers get one sentence; a service's own UNAVAILABLE (with a
// reason) keeps its message.
func TestErrorHandler_transportErrorNamesNothingOfOurs(t *testing.T) {
	s := newServer(t)
	for path, err := range map[string]error{
		"/v1/transport": status.Error(codes.Unavailable, `connection error: desc = "transport: Error while dialing: dial tcp 10.1.2.3:9090: connect: connection refused"`),
		"/v1/service":   grpcerr.New(codes.Unavailable, "the registry is unavailable; retry later", "REGISTRY_UNAVAILABLE", "test.parley.dev", nil),
	} {
		if err := s.Gateway.HandlePath(http.MethodGet, path, func(w http.ResponseWriter, r *http.Request, _ map[string]string) {
			_, m := runtime.MarshalerForRequest(s.Gateway, r)
			runtime.HTTPError(r.Context(), s.Gateway, m, w, r, err)
		}); err != nil {
			t.Fatal(err)
		}
	}
	r := start(t, s)
	for path, want := range map[string]string{
		"/v1/transport": "the service behind this route is unavailable; retry later",
		"/v1/service":   "the registry is unavailable; retry later",
	} {
		resp, err := http.Get(r.baseURL + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(b), want) || strings.Contains(string(b), "10.1.2.3") {
			t.Errorf("GET %s = %d %s, want 503 saying %q and no address", path, resp.StatusCode, b, want)
		}
	}
}
