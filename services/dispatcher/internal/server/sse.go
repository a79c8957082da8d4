package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
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
	return map[string]http.Handler{StreamPattern: sseHandler{src: localMailboxes{s}, writeTimeout: s.opts.MailboxOptions.WriteTimeout, streams: &s.sseStreams}}
}

// StopStreams ends the SSE streams served on connections of their own
// (HTTP/1.x) and waits for them: the HTTP server's shutdown does not wait
// for them. A graceful stop has ended them already (Start's channel); the
// app calls it before closing the store.
func (s *Server) StopStreams() { s.sseStreams.stop() }

// streamSet tracks the SSE streams served on a hijacked connection, on a
// goroutine of their own. Its zero value is ready to use.
type streamSet struct {
	wg     sync.WaitGroup
	ctx    context.Context // done once stop is called
	cancel context.CancelFunc
	initMu sync.Mutex
}

// done returns a context that ends when stop is called.
func (ss *streamSet) done() context.Context {
	ss.initMu.Lock()
	defer ss.initMu.Unlock()
	if ss.ctx == nil {
		ss.ctx, ss.cancel = context.WithCancel(context.Background())
	}
	return ss.ctx
}

func (ss *streamSet) stop() { ss.stopWithin(context.Background()) }

// stopWithin ends the streams and waits until each has written its last
// event and closed its connection, or until ctx ends.
func (ss *streamSet) stopWithin(ctx context.Context) {
	ss.done()
	ss.cancel()
	finished := make(chan struct{})
	go func() { ss.wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-ctx.Done():
	}
}

// RemoteMailboxRoutes returns the mailbox routes of a gateway process,
// which reads the dispatcher's mailboxes over c (ReceiveMessages and
// AcknowledgeMessages), forwarding each caller's own credential. Streams
// end when stopping closes. writeTimeout bounds one SSE write
// (--mailbox-stream-write-timeout). The caller wraps them in serve.Stream,
// and calls stop before the process exits (serve.Server.OnDrain): it ends
// the streams served on hijacked connections, which net/http's shutdown
// does not wait for, and waits until each has written its end event, or
// until ctx ends.
func RemoteMailboxRoutes(c dispatcherv1.DispatcherServiceClient, stopping <-chan struct{}, writeTimeout time.Duration) (routes map[string]http.Handler, stop func(ctx context.Context)) {
	streams := &streamSet{}
	routes = map[string]http.Handler{StreamPattern: sseHandler{src: remoteMailboxes{c: c, stopping: stopping}, writeTimeout: writeTimeout, streams: streams}}
	return routes, streams.stopWithin
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
	// streams tracks the HTTP/1.x streams, served on hijacked connections.
	streams *streamSet
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
	if r.Method == http.MethodHead {
		// The GET pattern answers HEAD too: the stream's head, and no
		// stream, which would take over the agent's live one (or, on a
		// hijacked connection, write a body after a HEAD's response).
		setStreamHeaders(w.Header())
		w.WriteHeader(http.StatusOK)
		return
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
	clearBacklog := q.Get("clear_backlog") == "true"
	if r.ProtoMajor == 1 {
		h.serveOwn(ctx, w, r, agent, after, clearBacklog)
		return
	}
	sink := h.responseSink(w)
	err := h.src.receive(ctx, agent, after, clearBacklog, func(ms []*dispatcherv1.NetworkMessage) error {
		return sink.send(ms)
	})
	if r.Context().Err() != nil {
		return // the client left
	}
	if !sink.started {
		fail(err)
		return
	}
	_ = sink.write(endEvent(err))
}

// serveOwn serves an HTTP/1.x stream from a goroutine of its own. Once
// the stream is established, the handler hijacks the connection, writes
// the response head itself and returns: net/http's state for the
// connection (its 4 KB read and write buffers, the response's chunking
// buffer, the goroutine that watches for the client leaving, and the
// handler's goroutine with the stack the request grew) is then released,
// and an idle stream holds only its goroutine and the connection, as a
// gRPC stream does. The body runs until the connection closes
// (Connection: close, no chunking). A client that left is noticed when a
// write fails, a keepalive at the latest. Where a hijack is not possible,
// the handler writes for the stream's goroutine and waits for it.
func (h sseHandler) serveOwn(ctx context.Context, w http.ResponseWriter, r *http.Request, agent string, after uint64, clearBacklog bool) {
	// The stream outlives the request: its context keeps the request's
	// values and ends when the client leaves before the hijack, or when
	// the streams stop.
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	leftEarly := context.AfterFunc(r.Context(), cancel)
	stopWatch := context.AfterFunc(h.streams.done(), cancel)
	established := make(chan struct{})
	sinks := make(chan *sseWriter, 1)
	refused := make(chan error, 1) // the stream ended before it was established
	finished := make(chan struct{})
	h.streams.wg.Add(1)
	go func() {
		defer h.streams.wg.Done()
		defer close(finished)
		defer stopWatch()
		defer cancel()
		var sink *sseWriter
		err := h.src.receive(sctx, agent, after, clearBacklog, func(ms []*dispatcherv1.NetworkMessage) error {
			if sink == nil {
				close(established)
				if sink = <-sinks; sink == nil {
					return context.Canceled // the client left before the hijack
				}
			}
			return sink.send(ms)
		})
		if sink == nil {
			refused <- err
			return
		}
		if sctx.Err() == nil || sink.close != nil {
			_ = sink.write(endEvent(err))
		}
		if sink.close != nil {
			sink.close()
		}
	}()
	select {
	case err := <-refused:
		leftEarly()
		if r.Context().Err() == nil {
			grpcerr.WriteHTTP(w, grpcerr.HTTPStatus(err), status.Convert(err))
		}
		return
	case <-established:
	}
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil { // not possible here (a test's recorder): write for the stream
		sinks <- h.responseSink(w)
		<-finished
		return
	}
	if !leftEarly() { // the client has left already
		conn.Close()
		sinks <- nil
		return
	}
	_ = brw // dropped, with the rest of net/http's state for the connection
	hd := w.Header().Clone()
	setStreamHeaders(hd)
	hd.Set("Connection", "close")
	head := []byte("HTTP/1.1 200 OK\r\n")
	var b bytes.Buffer
	_ = hd.Write(&b)
	head = append(append(head, b.Bytes()...), "\r\n"...)
	sink := &sseWriter{
		write: func(p []byte) error {
			_ = conn.SetWriteDeadline(time.Now().Add(h.writeTimeout))
			_, err := conn.Write(p)
			return err
		},
		close: func() { conn.Close() },
		head:  head,
	}
	sinks <- sink
}

// setStreamHeaders sets the headers of an SSE response in hd.
func setStreamHeaders(hd http.Header) {
	hd.Set("Content-Type", "text/event-stream")
	hd.Set("Cache-Control", "no-store")
	hd.Set("X-Accel-Buffering", "no") // proxies must not buffer the stream
}

// sseWriter writes a stream's batches: the head and a ": connected"
// comment first, then an event per message, or a keepalive comment for
// an empty batch.
type sseWriter struct {
	write   func([]byte) error
	close   func() // nil when writing through the ResponseWriter
	head    []byte // the response head, for a hijacked connection
	started bool
	// begin writes the head through a ResponseWriter.
	begin func()
}

// responseSink writes through w, each write with its own deadline: a
// client that stops reading is cut off instead of holding the stream
// forever.
func (h sseHandler) responseSink(w http.ResponseWriter) *sseWriter {
	rc := http.NewResponseController(w)
	return &sseWriter{
		write: func(b []byte) error {
			_ = rc.SetWriteDeadline(time.Now().Add(h.writeTimeout))
			if _, err := w.Write(b); err != nil {
				return err
			}
			return rc.Flush()
		},
		begin: func() {
			setStreamHeaders(w.Header())
			w.WriteHeader(http.StatusOK)
		},
	}
}

func (s *sseWriter) send(ms []*dispatcherv1.NetworkMessage) error {
	var buf []byte
	if !s.started {
		s.started = true
		if s.begin != nil {
			s.begin()
		}
		buf = append(s.head, ": connected\n\n"...)
		s.head = nil
	}
	if len(ms) == 0 {
		buf = append(buf, ": keepalive\n\n"...)
	}
	for _, m := range ms {
		ev, err := sseEvent(m)
		if err != nil {
			return err
		}
		buf = append(buf, ev...)
	}
	return s.write(buf)
}

// endEvent is the last event of an established stream: why it ended.
func endEvent(err error) []byte {
	st := status.Convert(err)
	end, _ := json.Marshal(map[string]any{"code": st.Code().String(), "message": st.Message()})
	return fmt.Appendf(nil, "event: end\ndata: %s\n\n", end)
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
