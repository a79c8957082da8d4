// Package httpapi serves the registry's hand-written HTTP routes, beside the
// generated REST gateway:
//
//	GET /protocols/{hash}                          a document's exact bytes
//	GET /agora/{client}/{agent}/.wellknown         discovery (alias /wellknown)
//
// The handlers read through Backend, which both the in-process server and a
// gRPC client (for the separate gateway process) satisfy.
package httpapi

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/serve"
	"github.com/parleyhq/parley/services/registry/internal/pd"
)

// Route patterns, for serve.Server.Handle.
const (
	ProtocolRoute       = "GET /protocols/{hash}"
	WellKnownRoute      = "GET /agora/{client}/{agent}/.wellknown"
	WellKnownAliasRoute = "GET /agora/{client}/{agent}/wellknown"
)

// Backend is what the handlers read. *server.Server implements it; so does
// ClientBackend over a gRPC connection.
type Backend interface {
	GetProtocol(context.Context, *registryv1.GetProtocolRequest) (*registryv1.Protocol, error)
	GetAgent(context.Context, *registryv1.GetAgentRequest) (*registryv1.Agent, error)
}

// ClientBackend adapts a gRPC client to Backend.
func ClientBackend(c registryv1.RegistryServiceClient) Backend { return clientBackend{c} }

type clientBackend struct {
	c registryv1.RegistryServiceClient
}

func (b clientBackend) GetProtocol(ctx context.Context, req *registryv1.GetProtocolRequest) (*registryv1.Protocol, error) {
	return b.c.GetProtocol(ctx, req)
}

func (b clientBackend) GetAgent(ctx context.Context, req *registryv1.GetAgentRequest) (*registryv1.Agent, error) {
	return b.c.GetAgent(ctx, req)
}

// Protocols serves GET (and HEAD) /protocols/{hash}: the exact stored bytes
// as text/plain; charset=utf-8 (without the charset, the Python reference
// decodes as Latin-1 and fails the hash check on non-ASCII documents). The
// hash may be hex or percent-escaped base64. The ETag is the SHA-1, so a
// matching If-None-Match gets 304 for a stored document (a missing one is
// 404 whatever the header says); documents never change, so caches may
// keep them.
func Protocols(b Backend) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h, err := pd.ParseHash(r.PathValue("hash"))
		if err != nil {
			writeError(w, r, status.Error(codes.InvalidArgument, "hash: "+err.Error()))
			return
		}
		etag := `"` + h.Hex() + `"`
		hdr := w.Header()
		p, err := b.GetProtocol(r.Context(), &registryv1.GetProtocolRequest{Name: "protocols/" + h.Hex()})
		if err != nil {
			writeError(w, r, err)
			return
		}
		if etagMatches(r.Header.Get("If-None-Match"), etag) {
			hdr["Etag"] = []string{etag}
			hdr["Cache-Control"] = []string{"public, max-age=31536000, immutable"}
			w.WriteHeader(http.StatusNotModified)
			return
		}
		content := p.GetContent()
		hdr["Content-Type"] = []string{"text/plain; charset=utf-8"}
		hdr["Etag"] = []string{etag}
		hdr["Cache-Control"] = []string{"public, max-age=31536000, immutable"}
		hdr["X-Content-Type-Options"] = []string{"nosniff"}
		hdr["Content-Length"] = []string{strconv.Itoa(len(content))}
		w.WriteHeader(http.StatusOK)
		if r.Method != http.MethodHead {
			_, _ = w.Write(content)
		}
	})
}

// etagMatches implements If-None-Match's weak comparison for one strong tag.
func etagMatches(header, etag string) bool {
	if header == "" {
		return false
	}
	for _, t := range strings.Split(header, ",") {
		t = strings.TrimSpace(t)
		if t == "*" || strings.TrimPrefix(t, "W/") == etag {
			return true
		}
	}
	return false
}

// writeError answers in the gateway's error body and status
// (serve.WriteError); errors are never cached.
func writeError(w http.ResponseWriter, r *http.Request, err error) {
	w.Header().Set("Cache-Control", "no-store")
	serve.WriteError(w, r, err)
}

func writeJSON(w http.ResponseWriter, code int, v any, cacheControl string) {
	body, err := json.Marshal(v)
	if err != nil {
		http.Error(w, `{"code":13,"message":"internal error"}`, http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", cacheControl)
	w.WriteHeader(code)
	_, _ = w.Write(append(body, '\n'))
}
