package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/services/dispatcher/internal/directory"
	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
)

// MailboxOptions tune the receive streams. Every field must be positive;
// the dispatcher's config owns the defaults (--mailbox-stream-*).
type MailboxOptions struct {
	// Batch is the most messages one stream response (or SSE flush)
	// carries.
	Batch int
	// Keepalive is how long a stream may stay silent before an empty batch
	// (an SSE comment) is sent.
	Keepalive time.Duration
	// MaxDuration ends a stream that has been open this long with
	// DEADLINE_EXCEEDED, so that clients reconnect (and re-authenticate).
	MaxDuration time.Duration
	// WriteTimeout bounds one SSE write: a client that stops reading is
	// cut off.
	WriteTimeout time.Duration
}

// NetworkMessage is d as its recipient receives it.
func NetworkMessage(d mailbox.Delivery) *dispatcherv1.NetworkMessage {
	m := d.Message
	return &dispatcherv1.NetworkMessage{
		MessageId:     m.ID,
		DialogueId:    m.DialogueID,
		Sender:        m.Sender,
		Recipient:     d.Agent,
		Category:      categories[string(m.Category)],
		MessageType:   m.Type,
		Protocol:      m.Protocol,
		RecipientType: m.RecipientType,
		BodyJson:      m.Body,
		InReplyTo:     m.InReplyTo,
		CreateTime:    timestamppb.New(m.Time),
		Cursor:        d.Cursor,
	}
}

func (s *Server) mailboxAgent(agent string) error {
	if s.opts.Delivery == nil {
		return status.Error(codes.Unimplemented, "this dispatcher has no mailboxes")
	}
	if !directory.ValidAgentName(agent) {
		return invalid("agent", "must be clients/{client}/agents/{agent}")
	}
	return nil
}

// receive runs one receive stream of agent, whichever the transport.
func (s *Server) receive(ctx context.Context, agent string, opts mailbox.ReceiveOptions, send func([]mailbox.Delivery) error) error {
	mo := s.opts.MailboxOptions
	ctx, cancel := context.WithTimeout(ctx, mo.MaxDuration)
	defer cancel()
	opts.Batch, opts.Keepalive, opts.Stop = mo.Batch, mo.Keepalive, s.opts.Stopping
	return s.opts.Delivery.Receive(ctx, agent, opts, send)
}

// ReceiveMessages implements dispatcherv1.DispatcherServiceServer.
func (s *Server) ReceiveMessages(req *dispatcherv1.ReceiveMessagesRequest, stream grpc.ServerStreamingServer[dispatcherv1.ReceiveMessagesResponse]) error {
	if err := s.mailboxAgent(req.GetAgent()); err != nil {
		return err
	}
	ctx := stream.Context()
	err := s.receive(ctx, req.GetAgent(), mailbox.ReceiveOptions{After: req.GetAfterCursor(), ClearBacklog: req.GetClearBacklog()},
		func(ds []mailbox.Delivery) error {
			resp := &dispatcherv1.ReceiveMessagesResponse{Messages: make([]*dispatcherv1.NetworkMessage, len(ds))}
			for i, d := range ds {
				resp.Messages[i] = NetworkMessage(d)
			}
			return stream.Send(resp)
		})
	return s.toStatus(ctx, err)
}

// AcknowledgeMessages implements dispatcherv1.DispatcherServiceServer.
func (s *Server) AcknowledgeMessages(ctx context.Context, req *dispatcherv1.AcknowledgeMessagesRequest) (*dispatcherv1.Mailbox, error) {
	if err := s.mailboxAgent(req.GetAgent()); err != nil {
		return nil, err
	}
	var (
		st  mailbox.State
		err error
	)
	if req.GetClearBacklog() {
		st, err = s.opts.Delivery.ClearBacklog(ctx, req.GetAgent())
	} else {
		st, err = s.opts.Delivery.Acknowledge(ctx, req.GetAgent(), req.GetCursor())
	}
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return &dispatcherv1.Mailbox{
		Agent: req.GetAgent(), HeadCursor: st.Head, AcknowledgedCursor: st.Acked,
		PendingMessages: st.Pending, PendingBytes: st.PendingBytes,
	}, nil
}

// StreamPattern is the server-sent-events route of the mailboxes.
const StreamPattern = "GET /v1/clients/{client}/agents/{agent}/messages:stream"

// MailboxRoutes returns the hand-written mailbox routes. The caller wraps
// them in serve.Stream: they outlive the server's write timeout and end
// on their own (client gone, takeover, shutdown, MaxDuration).
func (s *Server) MailboxRoutes() map[string]http.Handler {
	return map[string]http.Handler{StreamPattern: http.HandlerFunc(s.streamSSE)}
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

func sseEvent(d mailbox.Delivery) ([]byte, error) {
	m := d.Message
	body := json.RawMessage(m.Body)
	if !json.Valid(body) {
		// Bodies are JSON by contract; anything else goes as a string
		// rather than breaking the stream.
		body, _ = json.Marshal(string(m.Body))
	}
	data, err := json.Marshal(sseMessage{
		MessageID: m.ID, DialogueID: m.DialogueID, Sender: m.Sender, Recipient: d.Agent,
		Category: categories[string(m.Category)].String(), MessageType: m.Type, Protocol: m.Protocol,
		RecipientType: m.RecipientType, Body: body, InReplyTo: m.InReplyTo,
		CreateTime: m.Time.UTC().Format(time.RFC3339Nano), Cursor: strconv.FormatUint(d.Cursor, 10),
	})
	if err != nil {
		return nil, err
	}
	return fmt.Appendf(nil, "id: %d\nevent: message\ndata: %s\n\n", d.Cursor, data), nil
}

// streamSSE serves an agent's mailbox as server-sent events. The event id
// is the cursor. A reconnect's Last-Event-ID acknowledges that cursor (the
// client has the event), and delivery resumes after it; after_cursor
// resumes without acknowledging, clear_backlog=true skips the backlog.
// When the stream ends for a reason the client should know (takeover,
// shutdown), a final "end" event carries the status as JSON.
func (s *Server) streamSSE(w http.ResponseWriter, r *http.Request) {
	agent := AgentName(r.PathValue("client"), r.PathValue("agent"))
	fail := func(err error) { grpcerr.WriteHTTP(w, grpcerr.HTTPStatus(err), status.Convert(err)) }
	if err := s.mailboxAgent(agent); err != nil {
		fail(err)
		return
	}
	q := r.URL.Query()
	opts := mailbox.ReceiveOptions{ClearBacklog: q.Get("clear_backlog") == "true"}
	if v := q.Get("after_cursor"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			fail(invalid("after_cursor", "must be a cursor (a non-negative integer)"))
			return
		}
		opts.After = n
	}
	if v := r.Header.Get("Last-Event-ID"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			fail(invalid("Last-Event-ID", "must be a cursor this stream sent as an event id"))
			return
		}
		if _, err := s.opts.Delivery.Acknowledge(r.Context(), agent, n); err != nil {
			fail(s.toStatus(r.Context(), err))
			return
		}
		opts.After = max(opts.After, n)
	}
	mo := s.opts.MailboxOptions
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no") // proxies must not buffer the stream
	w.WriteHeader(http.StatusOK)
	write := func(b []byte) error {
		// Each write has its own deadline: a client that stops reading is
		// cut off instead of holding the stream forever.
		_ = rc.SetWriteDeadline(time.Now().Add(mo.WriteTimeout))
		if _, err := w.Write(b); err != nil {
			return err
		}
		return rc.Flush()
	}
	if err := write([]byte(": connected\n\n")); err != nil {
		return
	}
	err := s.receive(r.Context(), agent, opts, func(ds []mailbox.Delivery) error {
		if len(ds) == 0 {
			return write([]byte(": keepalive\n\n"))
		}
		var buf []byte
		for _, d := range ds {
			ev, err := sseEvent(d)
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
	st := status.Convert(s.toStatus(r.Context(), err))
	end, _ := json.Marshal(map[string]any{"code": st.Code().String(), "message": st.Message()})
	_ = write(fmt.Appendf(nil, "event: end\ndata: %s\n\n", end))
}
