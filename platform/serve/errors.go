package serve

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/parleyhq/parley/platform/grpcerr"
)

// The error body of Parley's HTTP routes (bar the Agent Protocol's, which
// its spec fixes as {"message": "..."}) is the gateway's: the JSON form of
// google.rpc.Status,
//
//	{"code": 5, "message": "agent \"clients/a/agents/b\" not found",
//	 "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo",
//	              "reason": "AGENT_NOT_FOUND", "domain": "registry.parley.dev"}]}
//
// where code is the gRPC code, message one sentence for people, and
// details carry the ErrorInfo whose reason clients branch on. The HTTP
// status comes from grpcerr.HTTPStatus.

// ErrorWriter writes an error answer of one route family: an HTTP status and
// a message, in that family's JSON shape.
type ErrorWriter func(w http.ResponseWriter, r *http.Request, code int, msg string)

type errorShape struct {
	prefix string
	write  ErrorWriter
}

// HandleErrors makes unknown paths and wrong methods under prefix (for
// example "/ap/") answer through write instead of the gateway's body, for
// route families whose spec fixes another error shape.
func (s *Server) HandleErrors(prefix string, write ErrorWriter) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.shapes = append(s.shapes, errorShape{prefix: prefix, write: write})
}

// shapeFor returns the writer registered for the longest prefix of path,
// or nil.
func (s *Server) shapeFor(path string) ErrorWriter {
	s.mu.Lock()
	defer s.mu.Unlock()
	var best errorShape
	for _, sh := range s.shapes {
		if strings.HasPrefix(path, sh.prefix) && len(sh.prefix) > len(best.prefix) {
			best = sh
		}
	}
	return best.write
}

// probeMethods are the methods tried to fill a 405's Allow header.
var probeMethods = []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete}

// allowedMethods lists the methods a hand-written route serves at r's path.
func (s *Server) allowedMethods(r *http.Request) []string {
	var allow []string
	for _, m := range probeMethods {
		if m == r.Method {
			continue
		}
		probe := *r
		probe.Method = m
		if _, pattern := s.routes.Handler(&probe); pattern != "" {
			allow = append(allow, m)
		}
	}
	return allow
}

// fallback serves what no hand-written route matched: a path a hand-written
// route serves under another method is 405 with Allow, a path under a
// prefix given to HandleErrors is 404 in that shape, and the rest goes to
// the gateway, which answers 404 and 405 in its own body.
func (s *Server) fallback(gateway http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		write := s.shapeFor(r.URL.Path)
		if allow := s.allowedMethods(r); len(allow) > 0 {
			w.Header().Set("Allow", strings.Join(allow, ", "))
			if write == nil {
				write = writeRoutingError
			}
			write(w, r, http.StatusMethodNotAllowed, fmt.Sprintf("method %s is not allowed here; use %s", r.Method, strings.Join(allow, " or ")))
			return
		}
		if write != nil {
			write(w, r, http.StatusNotFound, "no route for "+r.URL.Path)
			return
		}
		gateway.ServeHTTP(w, r)
	})
}

// writeRoutingError writes a 404 or 405 in the gateway's body.
func writeRoutingError(w http.ResponseWriter, _ *http.Request, code int, msg string) {
	c := codes.NotFound
	if code == http.StatusMethodNotAllowed {
		c = codes.Unimplemented // what the gateway reports for 405
	}
	writeStatus(w, code, status.New(c, msg))
}

// routingErrorHandler is the gateway's: 404 and 405 keep their HTTP status
// (the gateway's default would turn 405 into 501).
func routingErrorHandler(ctx context.Context, mux *runtime.ServeMux, m runtime.Marshaler, w http.ResponseWriter, r *http.Request, code int) {
	switch code {
	case http.StatusMethodNotAllowed:
		writeRoutingError(w, r, code, fmt.Sprintf("method %s is not allowed here", r.Method))
	default:
		runtime.DefaultRoutingErrorHandler(ctx, mux, m, w, r, code)
	}
}

// errorHandler is the gateway's error handler: the gateway's JSON status
// body with the HTTP status of grpcerr.HTTPStatus.
func errorHandler(ctx context.Context, mux *runtime.ServeMux, m runtime.Marshaler, w http.ResponseWriter, r *http.Request, err error) {
	// The gateway turns a body read failure into an InvalidArgument status
	// holding the reader's message, so http.MaxBytesReader's error arrives
	// as text, not as *http.MaxBytesError.
	code := grpcerr.HTTPStatus(err)
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) || (status.Code(err) == codes.InvalidArgument && strings.Contains(status.Convert(err).Message(), "http: request body too large")) {
		err = status.Errorf(codes.InvalidArgument, "request body exceeds the limit of %d bytes", maxBody(r))
		code = http.StatusRequestEntityTooLarge
	}
	// An UNAVAILABLE without a reason is the gRPC transport's (`parley
	// gateway` cannot reach a service), and its text names our addresses.
	if status.Code(err) == codes.Unavailable && grpcerr.Reason(err) == "" {
		err = status.Error(codes.Unavailable, "the service behind this route is unavailable; retry later")
	}
	runtime.DefaultHTTPErrorHandler(ctx, mux, m, &codeOverride{ResponseWriter: w, code: code}, r, err)
}

// WriteError answers a hand-written route's error exactly as the gateway
// would: the JSON google.rpc.Status body with the grpcerr.HTTPStatus code.
// An error that is not a status is reported as "internal error".
func WriteError(w http.ResponseWriter, _ *http.Request, err error) {
	st, ok := status.FromError(err)
	if !ok || st.Code() == codes.Unknown {
		st = status.New(codes.Internal, "internal error")
	}
	writeStatus(w, grpcerr.HTTPStatus(st.Err()), st)
}

func writeStatus(w http.ResponseWriter, code int, st *status.Status) {
	grpcerr.WriteHTTP(w, code, st)
}

type maxBodyKey struct{}

// maxBody reports the body cap recorded for r by the gateway route.
func maxBody(r *http.Request) int64 {
	n, _ := r.Context().Value(maxBodyKey{}).(int64)
	return n
}

type codeOverride struct {
	http.ResponseWriter
	code int
}

func (c *codeOverride) WriteHeader(int) { c.ResponseWriter.WriteHeader(c.code) }
