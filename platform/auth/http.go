package auth

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"strings"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/parleyhq/parley/platform/grpcerr"
)

// Middleware records the caller's address for the checks that follow
// (Route, Gateway) and for per-address rate limits. It wraps the whole
// HTTP handler.
func (a *Authenticator) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, err := net.SplitHostPort(r.RemoteAddr)
		if err != nil {
			host = r.RemoteAddr
		}
		next.ServeHTTP(w, r.WithContext(WithRemoteAddr(r.Context(), host)))
	})
}

// Route checks a hand-written route, registered under pattern (Go
// ServeMux syntax, the policy key), before h runs. The rule's resource is
// a path value.
func (a *Authenticator) Route(pattern string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, err := a.check(r.Context(), call{
			method:   pattern,
			header:   r.Header.Get("Authorization"),
			remote:   RemoteAddr(r.Context()),
			resource: routeResource(r),
		})
		if err != nil {
			WriteError(w, err)
			return
		}
		h.ServeHTTP(w, r.WithContext(WithPrincipal(r.Context(), p)))
	})
}

// routeResource reads a hand-written route's resource from its path
// values: a bare name is one value ("id"); a template joins several
// ("clients/{client}/agents/{agent}"). A template value holding "/" (an
// escaped %2F) reads as "", which no caller owns, so a segment cannot
// reach into another resource's name.
func routeResource(r *http.Request) func(string) string {
	return func(field string) string {
		if !strings.Contains(field, "{") {
			return r.PathValue(field)
		}
		bad := false
		name := bareVariable.ReplaceAllStringFunc(field, func(v string) string {
			val := r.PathValue(v[1 : len(v)-1])
			bad = bad || val == "" || strings.Contains(val, "/")
			return val
		})
		if bad {
			return ""
		}
		return name
	}
}

// Gateway is grpc-gateway middleware checking each call against the rule
// of the RPC the route maps to, so that the in-process gateway, which
// calls handlers directly and skips gRPC interceptors, is held to the same
// policy. The rule's resource is read from the path parameters, then from
// the query string when the gateway fills that field from the query, and
// otherwise from the body, decoded as the gateway will decode it (the body
// is buffered, within the gateway's size cap, and handed on unchanged), so
// a query naming the caller's agent cannot stand in for a body naming
// another.
func (a *Authenticator) Gateway(next runtime.HandlerFunc) runtime.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request, params map[string]string) {
		// Only the compiled pattern is known before the handler runs; its
		// String form is the annotation's, normalised as gatewayRoutes does.
		var pattern string
		if pat, ok := runtime.HTTPPattern(r.Context()); ok {
			pattern = pat.String()
		}
		route, ok := a.routes[r.Method+" "+pattern]
		if !ok {
			route = gatewayRoute{method: r.Method + " " + pattern, body: "*"} // no RPC: refused as unlisted
		}
		p, err := a.check(r.Context(), call{
			method: route.method,
			header: r.Header.Get("Authorization"),
			remote: RemoteAddr(r.Context()),
			resource: func(field string) string {
				if v, ok := params[field]; ok {
					return v
				}
				if route.queryFills(field) {
					return r.URL.Query().Get(field)
				}
				return route.bodyResource(bufferBody(r), field)
			},
		})
		if err != nil {
			WriteError(w, err)
			return
		}
		next(w, r.WithContext(WithPrincipal(r.Context(), p)), params)
	}
}

// WriteError writes a refusal as the gateway writes errors: the JSON of
// the google.rpc.Status, with the HTTP status of its code (401, 403, 429).
func WriteError(w http.ResponseWriter, err error) {
	st := status.Convert(err)
	if st.Code() == codes.Unauthenticated {
		w.Header().Set("WWW-Authenticate", `Bearer realm="parley"`)
	}
	grpcerr.WriteHTTP(w, grpcerr.HTTPStatus(err), st)
}

// bufferBody reads r's body and puts back an identical one for the
// handler, including a read error (an oversized body stays oversized). On
// error it returns nil.
func bufferBody(r *http.Request) []byte {
	if r.Body == nil || r.Body == http.NoBody {
		return nil
	}
	b, err := io.ReadAll(r.Body)
	_ = r.Body.Close()
	if err != nil {
		r.Body = io.NopCloser(io.MultiReader(bytes.NewReader(b), errReader{err}))
		return nil
	}
	r.Body = io.NopCloser(bytes.NewReader(b))
	return b
}

// errReader fails every read with err.
type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }
