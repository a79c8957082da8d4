package server

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/services/dispatcher/internal/inbound"
)

// Deliverer is what the Agora HTTP routes call: the Server in process
// (straight into the inbound pipeline), or RemoteDeliverer in a separate
// gateway. An error is a transport or server fault; Agora errors travel in
// the reply.
type Deliverer interface {
	Deliver(ctx context.Context, e inbound.Envelope) (inbound.Reply, error)
}

// RemoteDeliverer reaches the dispatcher's DeliverEnvelope over gRPC.
type RemoteDeliverer struct {
	C dispatcherv1.DispatcherServiceClient
}

// Deliver implements Deliverer.
func (r RemoteDeliverer) Deliver(ctx context.Context, e inbound.Envelope) (inbound.Reply, error) {
	resp, err := r.C.DeliverEnvelope(ctx, &dispatcherv1.DeliverEnvelopeRequest{
		Agent: e.Agent, Peer: e.Peer, ConversationId: e.ConversationID, EndConversation: e.End, EnvelopeJson: e.JSON,
	})
	if err != nil {
		return inbound.Reply{}, err
	}
	return inbound.Reply{Status: int(resp.GetHttpStatus()), Body: resp.GetReplyJson()}, nil
}

// HTTPOptions configures the Agora routes.
type HTTPOptions struct {
	// MaxBodyBytes caps a request body; it must be positive
	// (--agora-max-body-bytes owns the default).
	MaxBodyBytes int64
	// PeerHeader, when set, names a header set by a trusted proxy whose
	// first comma-separated value identifies the caller; otherwise the
	// caller is its remote IP.
	PeerHeader string
}

// AgoraRoutes returns the hand-written Agora routes (Go ServeMux patterns)
// and their handlers. The registry owns GET .../.wellknown and /wellknown.
func AgoraRoutes(d Deliverer, opts HTTPOptions) map[string]http.Handler {
	h := &agoraHTTP{d: d, opts: opts}
	return map[string]http.Handler{
		"POST /agora/{client}/{agent}":                      http.HandlerFunc(h.post),
		"POST /agora/{client}/{agent}/{$}":                  http.HandlerFunc(h.post),
		"POST /agora/{client}/{agent}/conversations/{id}":   http.HandlerFunc(h.post),
		"DELETE /agora/{client}/{agent}/conversations/{id}": http.HandlerFunc(h.del),
	}
}

type agoraHTTP struct {
	d    Deliverer
	opts HTTPOptions
}

func (h *agoraHTTP) peer(r *http.Request) string {
	if h.opts.PeerHeader != "" {
		if v := r.Header.Get(h.opts.PeerHeader); v != "" {
			first, _, _ := strings.Cut(v, ",")
			return strings.TrimSpace(first)
		}
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

func (h *agoraHTTP) post(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.opts.MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeRaw(w, http.StatusRequestEntityTooLarge, []byte(`{"status":"failure","body":"request body too large","error":"request body too large"}`))
			return
		}
		writeRaw(w, http.StatusBadRequest, []byte(`{"status":"failure","body":"unreadable request body","error":"unreadable request body"}`))
		return
	}
	h.serve(w, r, inbound.Envelope{
		Agent:          AgentName(r.PathValue("client"), r.PathValue("agent")),
		ConversationID: r.PathValue("id"),
		JSON:           body,
		Peer:           h.peer(r),
	})
}

func (h *agoraHTTP) del(w http.ResponseWriter, r *http.Request) {
	h.serve(w, r, inbound.Envelope{
		Agent:          AgentName(r.PathValue("client"), r.PathValue("agent")),
		ConversationID: r.PathValue("id"),
		End:            true,
		Peer:           h.peer(r),
	})
}

func (h *agoraHTTP) serve(w http.ResponseWriter, r *http.Request, e inbound.Envelope) {
	resp, err := h.d.Deliver(r.Context(), e)
	if err != nil {
		code, msg := deliverErrorReply(err)
		m, _ := json.Marshal(msg)
		writeRaw(w, code, []byte(`{"status":"failure","body":`+string(m)+`,"error":`+string(m)+`}`))
		return
	}
	writeRaw(w, resp.Status, resp.Body)
}

// deliverErrorReply maps a Deliver error (Agora errors travel in its
// reply, so this is a transport or server fault) to an HTTP status, through
// the one gRPC-to-HTTP table (grpcerr.HTTPStatus), and a message that says
// no more than the status (specs/agora.md, section 8).
func deliverErrorReply(err error) (int, string) {
	code := grpcerr.HTTPStatus(err)
	switch code {
	case http.StatusBadRequest:
		return code, "malformed request"
	case http.StatusNotFound:
		return code, "not found"
	case http.StatusTooManyRequests:
		return code, "too many requests; retry later"
	case http.StatusServiceUnavailable:
		return code, "the dispatcher is unavailable"
	case http.StatusGatewayTimeout:
		return code, "the dispatcher did not answer in time"
	}
	return http.StatusInternalServerError, "internal error"
}

func writeRaw(w http.ResponseWriter, code int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(body)
}
