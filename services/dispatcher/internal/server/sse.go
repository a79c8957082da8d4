package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/services/dispatcher/internal/directory"
	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
)

// StreamPattern is the server-sent-events route of the mailboxes.
const StreamPattern = "GET /v1/clients/{client}/agents/{agent}/messages:stream"

// mailboxSource is where an SSE stream reads a mailbox: this server's own
// mailboxes, or, in a gateway process, the dispatcher's RPCs. Errors are
// gRPC statuses.
type mailboxSource interface {
	// acknowledge moves agent's acknowledged cursor forward to cursor.
	acknowledge(ctx context.Context, agent string, cursor uint64) error
	// receive streams agent's mailbox to send, batch by batch; an empty
	// batch is a keepalive, and the first one says the stream is
	// established.
	receive(ctx context.Context, agent string, after uint64, clearBacklog bool, send func([]*dispatcherv1.NetworkMessage) error) error
}

// MailboxRoutes returns the hand-written mailbox routes. The caller wraps
// them in serve.Stream: they outlive the server's write timeout and end
// on their own (client gone, takeover, shutdown, MaxDuration).
func (s *Server) MailboxRoutes() map[string]http.Handler {
	return map[string]http.Handler{StreamPattern: sseHandler{src: localMailboxes{s}, writeTimeout: s.opts.MailboxOptions.WriteTimeout}}
}

// RemoteMailboxRoutes returns the mailbox routes of a gateway process,
// which reads the dispatcher's mailboxes over c (ReceiveMessages and
// AcknowledgeMessages), forwarding each caller's own credential. Streams
// end when stopping closes. writeTimeout bounds one SSE write
// (--mailbox-stream-write-timeout). The caller wraps them in serve.Stream.
func RemoteMailboxRoutes(c dispatcherv1.DispatcherServiceClient, stopping <-chan struct{}, writeTimeout time.Duration) map[string]http.Handler {
	return map[string]http.Handler{StreamPattern: sseHandler{src: remoteMailboxes{c: c, stopping: stopping}, writeTimeout: writeTimeout}}
}

// localMailboxes reads this server's own mailboxes.
type localMailboxes struct{ s *Server }

func (l localMailboxes) acknowledge(ctx context.Context, agent string, cursor uint64) error {
	if err := l.s.mailboxAgent(agent); err != nil {
		return err
	}
	if _, err := l.s.opts.Delivery.Acknowledge(ctx, agent, cursor); err != nil {
		return l.s.toStatus(ctx, err)
	}
	return nil
}

func (l localMailboxes) receive(ctx context.Context, agent string, after uint64, clearBacklog bool, send func([]*dispatcherv1.NetworkMessage) error) error {
	if err := l.s.mailboxAgent(agent); err != nil {
		return err
	}
	err := l.s.receive(ctx, agent, mailbox.ReceiveOptions{After: after, ClearBacklog: clearBacklog}, func(ds []mailbox.Delivery) error {
		ms := make([]*dispatcherv1.NetworkMessage, len(ds))
		for i, d := range ds {
			ms[i] = NetworkMessage(d)
		}
		return send(ms)
	})
	return l.s.toStatus(ctx, err)
}

// remoteMailboxes reads the dispatcher's mailboxes over gRPC with the
// caller's own credential: the dispatcher checks it, as for any call.
type remoteMailboxes struct {
	c        dispatcherv1.DispatcherServiceClient
	stopping <-chan struct{}
}

// callContext forwards the request's Authorization header, as the gateway
// does for its generated routes.
func callContext(ctx context.Context, r *http.Request) context.Context {
	if v := r.Header.Get("Authorization"); v != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", v)
	}
	return ctx
}

func (rm remoteMailboxes) acknowledge(ctx context.Context, agent string, cursor uint64) error {
	_, err := rm.c.AcknowledgeMessages(ctx, &dispatcherv1.AcknowledgeMessagesRequest{Agent: agent, Cursor: cursor})
	return err
}

func (rm remoteMailboxes) receive(ctx context.Context, agent string, after uint64, clearBacklog bool, send func([]*dispatcherv1.NetworkMessage) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stopped := make(chan struct{})
	go func() {
		select {
		case <-rm.stopping:
			close(stopped)
			cancel()
		case <-ctx.Done():
		}
	}()
	stream, err := rm.c.ReceiveMessages(ctx, &dispatcherv1.ReceiveMessagesRequest{Agent: agent, AfterCursor: after, ClearBacklog: clearBacklog})
	for err == nil {
		var resp *dispatcherv1.ReceiveMessagesResponse
		if resp, err = stream.Recv(); err == nil {
			err = send(resp.GetMessages())
		}
	}
	select {
	case <-stopped:
		return status.Error(codes.Unavailable, "the gateway is shutting down; reconnect")
	default:
	}
	if errors.Is(err, io.EOF) {
		return status.Error(codes.Unavailable, "the dispatcher ended the stream; reconnect")
	}
	return err
}

// sseHandler serves an agent's mailbox as server-sent events. The event id
// is the cursor. A reconnect's Last-Event-ID acknowledges that cursor (the
// client has the event), and delivery resumes after it; after_cursor
// resumes without acknowledging, clear_backlog=true skips the backlog.
// Until the stream is established a refusal is an HTTP error; after it,
// when the stream ends for a reason the client should know (takeover,
// shutdown), a final "end" event carries the status as JSON.
type sseHandler struct {
	src          mailboxSource
	writeTimeout time.Duration
}

func (h sseHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	agent := AgentName(r.PathValue("client"), r.PathValue("agent"))
	fail := func(err error) { grpcerr.WriteHTTP(w, grpcerr.HTTPStatus(err), status.Convert(err)) }
	if !directory.ValidAgentName(agent) {
		fail(invalid("agent", "must be clients/{client}/agents/{agent}"))
		return
	}
	q := r.URL.Query()
	var after uint64
	if v := q.Get("after_cursor"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			fail(invalid("after_cursor", "must be a cursor (a non-negative integer)"))
			return
		}
		after = n
	}
	ctx := callContext(r.Context(), r)
	if v := r.Header.Get("Last-Event-ID"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			fail(invalid("Last-Event-ID", "must be a cursor this stream sent as an event id"))
			return
		}
		if err := h.src.acknowledge(ctx, agent, n); err != nil {
			fail(err)
			return
		}
		after = max(after, n)
	}
	rc := http.NewResponseController(w)
	write := func(b []byte) error {
		// Each write has its own deadline: a client that stops reading is
		// cut off instead of holding the stream forever.
		_ = rc.SetWriteDeadline(time.Now().Add(h.writeTimeout))
		if _, err := w.Write(b); err != nil {
			return err
		}
		return rc.Flush()
	}
	started := false
	err := h.src.receive(ctx, agent, after, q.Get("clear_backlog") == "true", func(ms []*dispatcherv1.NetworkMessage) error {
		if !started {
			started = true
			hd := w.Header()
			hd.Set("Content-Type", "text/event-stream")
			hd.Set("Cache-Control", "no-store")
			hd.Set("X-Accel-Buffering", "no") // proxies must not buffer the stream
			w.WriteHeader(http.StatusOK)
			if err := write([]byte(": connected\n\n")); err != nil {
				return err
			}
		}
		if len(ms) == 0 {
			return write([]byte(": keepalive\n\n"))
		}
		var buf []byte
		for _, m := range ms {
			ev, err := sseEvent(m)
			if err != nil {
				return err
			}
			buf = append(buf, ev...)
		}
		return write(buf)
	})
	if r.Context().Err() != nil {
		return // the client left
	}
	if !started {
		fail(err)
		return
	}
	st := status.Convert(err)
	end, _ := json.Marshal(map[string]any{"code": st.Code().String(), "message": st.Message()})
	_ = write(fmt.Appendf(nil, "event: end\ndata: %s\n\n", end))
}

// sseMessage is a NetworkMessage as an SSE event's data, in the gateway's
// JSON field names, with the body as the JSON value it is (not base64).
type sseMessage struct {
	MessageID     string          `json:"messageId"`
	DialogueID    string          `json:"dialogueId"`
	Sender        string          `json:"sender,omitempty"`
	Recipient     string          `json:"recipient"`
	Category      string          `json:"category"`
	MessageType   string          `json:"messageType"`
	Protocol      string          `json:"protocol,omitempty"`
	RecipientType string          `json:"recipientType,omitempty"`
	Body          json.RawMessage `json:"body"`
	InReplyTo     string          `json:"inReplyTo,omitempty"`
	CreateTime    string          `json:"createTime"`
	Cursor        string          `json:"cursor"` // a string, as the gateway writes 64-bit integers
}

func sseEvent(m *dispatcherv1.NetworkMessage) ([]byte, error) {
	body := json.RawMessage(m.GetBodyJson())
	if !json.Valid(body) {
		// Bodies are JSON by contract; anything else goes as a string
		// rather than breaking the stream.
		body, _ = json.Marshal(string(m.GetBodyJson()))
	}
	data, err := json.Marshal(sseMessage{
		MessageID: m.GetMessageId(), DialogueID: m.GetDialogueId(), Sender: m.GetSender(), Recipient: m.GetRecipient(),
		Category: m.GetCategory().String(), MessageType: m.GetMessageType(), Protocol: m.GetProtocol(),
		RecipientType: m.GetRecipientType(), Body: body, InReplyTo: m.GetInReplyTo(),
		CreateTime: m.GetCreateTime().AsTime().UTC().Format(time.RFC3339Nano), Cursor: strconv.FormatUint(m.GetCursor(), 10),
	})
	if err != nil {
		return nil, err
	}
	return fmt.Appendf(nil, "id: %d\nevent: message\ndata: %s\n\n", m.GetCursor(), data), nil
}
