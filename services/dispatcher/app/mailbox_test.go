package app_test

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/platform/serve"
	"github.com/parleyhq/parley/services/dispatcher/app"
	"github.com/parleyhq/parley/services/dispatcher/config"
	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
)

const echo = "clients/acme/agents/echo"

func send(t *testing.T, a *app.App, id string, to ...string) {
	t.Helper()
	m := mailbox.Message{ID: id, DialogueID: "d-" + id, Sender: "clients/acme/agents/other", Category: mailbox.CategoryMessage, Type: "new_message", Body: []byte(`{"text":"` + id + `"}`)}
	if refused, err := a.Mailboxes().Append(t.Context(), m, to); err != nil || len(refused) != 0 {
		t.Fatalf("Append(%s) = %v, %v", id, refused, err)
	}
}

// recvN reads stream batches until it has n messages, skipping keepalives.
func recvN(t *testing.T, s grpc.ServerStreamingClient[dispatcherv1.ReceiveMessagesResponse], n int) []*dispatcherv1.NetworkMessage {
	t.Helper()
	var out []*dispatcherv1.NetworkMessage
	for len(out) < n {
		resp, err := s.Recv()
		if err != nil {
			t.Fatalf("Recv after %d messages: %v", len(out), err)
		}
		out = append(out, resp.GetMessages()...)
	}
	return out
}

func cursors(ms []*dispatcherv1.NetworkMessage) string {
	var b strings.Builder
	for _, m := range ms {
		fmt.Fprintf(&b, "%d:%s ", m.GetCursor(), m.GetMessageId())
	}
	return b.String()
}

func reason(err error) string {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetReason()
		}
	}
	return ""
}

func TestReceiveMessages_backlogLiveAckAndResume(t *testing.T) {
	e := startDispatcherApp(t)
	a, client := e.app, e.client
	send(t, a, "m1", echo)
	send(t, a, "m2", echo, "clients/acme/agents/other")

	ctx, cancel := context.WithCancel(t.Context())
	stream, err := client.ReceiveMessages(ctx, &dispatcherv1.ReceiveMessagesRequest{Agent: echo})
	if err != nil {
		t.Fatal(err)
	}
	got := recvN(t, stream, 2)
	if cursors(got) != "1:m1 2:m2 " {
		t.Errorf("backlog = %q, want 1:m1 2:m2", cursors(got))
	}
	m := got[0]
	if m.GetRecipient() != echo || m.GetSender() != "clients/acme/agents/other" || m.GetCategory() != dispatcherv1.MessageCategory_MESSAGE_CATEGORY_MESSAGE ||
		m.GetMessageType() != "new_message" || string(m.GetBodyJson()) != `{"text":"m1"}` || m.GetDialogueId() != "d-m1" || m.GetCreateTime() == nil {
		t.Errorf("message = %v, want m1 as appended, to echo", m)
	}
	send(t, a, "m3", echo)
	if live := recvN(t, stream, 1); cursors(live) != "3:m3 " {
		t.Errorf("live = %q, want 3:m3", cursors(live))
	}
	mb, err := client.AcknowledgeMessages(t.Context(), &dispatcherv1.AcknowledgeMessagesRequest{Agent: echo, Cursor: 2})
	if err != nil || mb.GetAcknowledgedCursor() != 2 || mb.GetHeadCursor() != 3 || mb.GetPendingMessages() != 1 {
		t.Errorf("AcknowledgeMessages(2) = %v, %v; want acknowledged 2, head 3, 1 pending", mb, err)
	}
	cancel()

	// A new stream resumes after the acknowledged cursor.
	stream, err = client.ReceiveMessages(t.Context(), &dispatcherv1.ReceiveMessagesRequest{Agent: echo})
	if err != nil {
		t.Fatal(err)
	}
	if again := recvN(t, stream, 1); cursors(again) != "3:m3 " {
		t.Errorf("after reconnect = %q, want 3:m3 (1 and 2 acknowledged)", cursors(again))
	}
}

func TestReceiveMessages_secondStreamTakesOver(t *testing.T) {
	e := startDispatcherApp(t)
	a, client := e.app, e.client
	send(t, a, "m1", echo)
	first, err := client.ReceiveMessages(t.Context(), &dispatcherv1.ReceiveMessagesRequest{Agent: echo})
	if err != nil {
		t.Fatal(err)
	}
	recvN(t, first, 1)
	second, err := client.ReceiveMessages(t.Context(), &dispatcherv1.ReceiveMessagesRequest{Agent: echo})
	if err != nil {
		t.Fatal(err)
	}
	recvN(t, second, 1)
	endsReplaced(t, first, "first stream after takeover")
	send(t, a, "m2", echo)
	if got := recvN(t, second, 1); cursors(got) != "2:m2 " {
		t.Errorf("second stream = %q, want 2:m2", cursors(got))
	}
}

func TestMailboxRPCs_refuseBadInput(t *testing.T) {
	e := startDispatcherApp(t)
	a, client, base := e.app, e.client, e.base
	send(t, a, "m1", echo)
	tests := []struct {
		name string
		call func() error
		want codes.Code
	}{
		{"receive, bad agent name", func() error {
			s, err := client.ReceiveMessages(t.Context(), &dispatcherv1.ReceiveMessagesRequest{Agent: "agents/echo"})
			if err != nil {
				return err
			}
			_, err = s.Recv()
			return err
		}, codes.InvalidArgument},
		{"acknowledge, bad agent name", func() error {
			_, err := client.AcknowledgeMessages(t.Context(), &dispatcherv1.AcknowledgeMessagesRequest{Agent: "clients/acme/agents/Echo!", Cursor: 1})
			return err
		}, codes.InvalidArgument},
		{"acknowledge past the head", func() error {
			_, err := client.AcknowledgeMessages(t.Context(), &dispatcherv1.AcknowledgeMessagesRequest{Agent: echo, Cursor: 2})
			return err
		}, codes.FailedPrecondition},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.call(); status.Code(err) != tt.want {
				t.Errorf("got %v, want %v", err, tt.want)
			}
		})
	}
	// Nothing was acknowledged by the refused calls.
	mb, err := client.AcknowledgeMessages(t.Context(), &dispatcherv1.AcknowledgeMessagesRequest{Agent: echo})
	if err != nil || mb.GetAcknowledgedCursor() != 0 || mb.GetPendingMessages() != 1 {
		t.Errorf("state after refusals = %v, %v; want nothing acknowledged", mb, err)
	}
	code, body := httpDo(t, "POST", base+"/v1/"+echo+"/messages:acknowledge", `{"cursor":"1"}`)
	if code != 200 || !strings.Contains(body, `"acknowledgedCursor":"1"`) {
		t.Errorf("POST :acknowledge = %d %s, want 200 with acknowledgedCursor 1", code, body)
	}
	code, body = httpDo(t, "POST", base+"/v1/"+echo+"/messages:acknowledge", `{"cursor":"9"}`)
	if code != 400 || !strings.Contains(body, "CURSOR_AHEAD") {
		t.Errorf("POST :acknowledge past head = %d %s, want 400 CURSOR_AHEAD", code, body)
	}
}

// sse reads server-sent events from a response.
type sse struct {
	resp *http.Response
	r    *bufio.Reader
}

func openSSE(t *testing.T, url, lastEventID string) *sse {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if lastEventID != "" {
		req.Header.Set("Last-Event-ID", lastEventID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return &sse{resp: resp, r: bufio.NewReader(resp.Body)}
}

// next returns the next event's id, type and data, skipping comments.
func (s *sse) next(t *testing.T) (id, event, data string) {
	t.Helper()
	for {
		line, err := s.r.ReadString('\n')
		if err != nil {
			t.Fatalf("reading the event stream: %v", err)
		}
		line = strings.TrimRight(line, "\n")
		switch {
		case line == "" && (id != "" || event != "" || data != ""):
			return id, event, data
		case strings.HasPrefix(line, "id: "):
			id = line[4:]
		case strings.HasPrefix(line, "event: "):
			event = line[7:]
		case strings.HasPrefix(line, "data: "):
			data = line[6:]
		}
	}
}

// startGateway runs `parley gateway`'s dispatcher routes against e over
// gRPC and returns the gateway's base URL.
func startGateway(t *testing.T, e dispatcherEnv) string {
	t.Helper()
	var cfg config.Config
	fs := flag.NewFlagSet("parley gateway", flag.ContinueOnError)
	cfg.RegisterGatewayFlags(fs)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	srv, err := serve.New(serve.Options{Logger: slog.New(slog.DiscardHandler), ShutdownTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := app.RegisterGateway(ctx, srv, e.conn, nil, cfg); err != nil {
		t.Fatal(err)
	}
	grpcLis, httpLis := listen(t), listen(t)
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, grpcLis, httpLis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("gateway Run() error = %v", err)
		}
	})
	return "http://" + httpLis.Addr().String()
}

// The SSE route reads a mailbox, resumes with Last-Event-ID and ends on a
// takeover the same way on the dispatcher's own HTTP port and on a separate
// gateway process that reaches the dispatcher over gRPC.
func TestStreamSSE_resumesWithLastEventID(t *testing.T) {
	for _, via := range []string{"dispatcher", "gateway"} {
		t.Run(via, func(t *testing.T) {
			e := startDispatcherApp(t)
			base := e.base
			if via == "gateway" {
				base = startGateway(t, e)
			}
			testStreamSSE(t, e, base)
		})
	}
}

func testStreamSSE(t *testing.T, e dispatcherEnv, base string) {
	a, client := e.app, e.client
	send(t, a, "m1", echo)
	send(t, a, "m2", echo)
	url := base + "/v1/" + echo + "/messages:stream"
	s := openSSE(t, url, "")
	if s.resp.StatusCode != 200 || s.resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("GET stream = %d %s, want 200 text/event-stream", s.resp.StatusCode, s.resp.Header.Get("Content-Type"))
	}
	id, event, data := s.next(t)
	if id != "1" || event != "message" || !strings.Contains(data, `"messageId":"m1"`) || !strings.Contains(data, `"body":{"text":"m1"}`) ||
		!strings.Contains(data, `"category":"MESSAGE_CATEGORY_MESSAGE"`) || !strings.Contains(data, `"cursor":"1"`) {
		t.Errorf("first event = id %q event %q data %s; want m1 with its JSON body", id, event, data)
	}
	s.resp.Body.Close()

	// The reconnect says it saw event 1: that acknowledges it, and m2 follows.
	s = openSSE(t, url, "1")
	if id, _, data := s.next(t); id != "2" || !strings.Contains(data, `"messageId":"m2"`) {
		t.Errorf("after Last-Event-ID 1: id %q data %s, want m2", id, data)
	}
	send(t, a, "m3", echo)
	if id, _, _ := s.next(t); id != "3" {
		t.Errorf("live event id %q, want 3", id)
	}
	mb, err := client.AcknowledgeMessages(t.Context(), &dispatcherv1.AcknowledgeMessagesRequest{Agent: echo})
	if err != nil || mb.GetAcknowledgedCursor() != 1 {
		t.Errorf("after the SSE reconnect: %v, %v; want acknowledged cursor 1", mb, err)
	}

	// A gRPC stream of the same agent takes over; the SSE stream ends
	// with an end event that says why.
	grpcStream, err := client.ReceiveMessages(t.Context(), &dispatcherv1.ReceiveMessagesRequest{Agent: echo})
	if err != nil {
		t.Fatal(err)
	}
	recvN(t, grpcStream, 1)
	if _, event, data := s.next(t); event != "end" || !strings.Contains(data, "Aborted") {
		t.Errorf("SSE after takeover: event %q data %s, want end Aborted", event, data)
	}
}

func TestStreamSSE_refusesBadInput(t *testing.T) {
	for _, via := range []string{"dispatcher", "gateway"} {
		t.Run(via, func(t *testing.T) {
			e := startDispatcherApp(t)
			base := e.base
			if via == "gateway" {
				base = startGateway(t, e)
			}
			testStreamSSERefusals(t, base)
		})
	}
}

func testStreamSSERefusals(t *testing.T, base string) {
	tests := []struct {
		name, path, lastEventID string
		want                    int
	}{
		{"bad agent id", "/v1/clients/acme/agents/Echo/messages:stream", "", 400},
		{"bad after_cursor", "/v1/" + echo + "/messages:stream?after_cursor=-1", "", 400},
		{"bad Last-Event-ID", "/v1/" + echo + "/messages:stream", "x", 400},
		{"Last-Event-ID past the head", "/v1/" + echo + "/messages:stream", "5", 400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := openSSE(t, base+tt.path, tt.lastEventID)
			if s.resp.StatusCode != tt.want {
				t.Errorf("GET %s (Last-Event-ID %q) = %d, want %d", tt.path, tt.lastEventID, s.resp.StatusCode, tt.want)
			}
		})
	}
}

// A shutdown ends open streams at once with UNAVAILABLE, so the drain need
// not wait for agents to hang up.
func TestReceiveMessages_endsOnShutdown(t *testing.T) {
	e := startDispatcherApp(t)
	send(t, e.app, "m1", echo)
	stream, err := e.client.ReceiveMessages(t.Context(), &dispatcherv1.ReceiveMessagesRequest{Agent: echo})
	if err != nil {
		t.Fatal(err)
	}
	recvN(t, stream, 1)
	sseStream := openSSE(t, e.base+"/v1/clients/acme/agents/other/messages:stream", "")
	if _, err := sseStream.r.ReadString('\n'); err != nil { // ": connected"
		t.Fatal(err)
	}
	stopped := make(chan struct{})
	go func() { e.stop(); close(stopped) }()
	for {
		_, err := stream.Recv()
		if err == nil {
			continue
		}
		if status.Code(err) != codes.Unavailable || reason(err) != "SHUTTING_DOWN" {
			t.Errorf("stream at shutdown: %v (reason %q), want UNAVAILABLE SHUTTING_DOWN", err, reason(err))
		}
		break
	}
	if _, event, data := sseStream.next(t); event != "end" || !strings.Contains(data, "Unavailable") {
		t.Errorf("SSE at shutdown: event %q data %s, want end Unavailable", event, data)
	}
	<-stopped
}

// parley_dispatcher_bbolt_commits_total counts dispatcher.db's commits:
// a message appended to a mailbox is one more;
// parley_dispatcher_bbolt_pages_written_total the pages they wrote, at
// least a data page and the meta page each; and
// parley_dispatcher_bbolt_fdatasyncs_total the syncs that made them
// durable, the journal's or bbolt's.
func TestMetrics_countBboltCommitsPagesAndSyncs(t *testing.T) {
	e := startDispatcherApp(t)
	const commits, pages, syncs = "parley_dispatcher_bbolt_commits_total", "parley_dispatcher_bbolt_pages_written_total", "parley_dispatcher_bbolt_fdatasyncs_total"
	before := scrape(t, e.base, commits, pages, syncs)
	send(t, e.app, "m1", echo)
	after := scrape(t, e.base, commits, pages, syncs)
	for _, c := range []struct {
		name string
		more float64
	}{{commits, 1}, {pages, 2}, {syncs, 1}} {
		if after[c.name] < before[c.name]+c.more {
			t.Errorf("%s after an append = %v, want at least %v", c.name, after[c.name], before[c.name]+c.more)
		}
	}
}

// scrape reads the named metrics (unlabelled) from base's /metrics.
func scrape(t *testing.T, base string, names ...string) map[string]float64 {
	t.Helper()
	_, body := httpDo(t, "GET", base+"/metrics", "")
	out := map[string]float64{}
	for _, line := range strings.Split(body, "\n") {
		name, v, ok := strings.Cut(line, " ")
		if !ok || !slices.Contains(names, name) {
			continue
		}
		var f float64
		if _, err := fmt.Sscan(v, &f); err != nil {
			t.Fatal(err)
		}
		out[name] = f
	}
	for _, name := range names {
		if _, ok := out[name]; !ok {
			t.Fatalf("GET /metrics lacks %s:\n%.2000s", name, body)
		}
	}
	return out
}

// endsReplaced reads s, past keepalives and batches sent before a
// takeover, until it ends, and checks that it ended ABORTED
// STREAM_REPLACED; what names the stream in the error.
func endsReplaced(t *testing.T, s grpc.ServerStreamingClient[dispatcherv1.ReceiveMessagesResponse], what string) {
	t.Helper()
	for {
		_, err := s.Recv()
		if err == nil {
			continue
		}
		if status.Code(err) != codes.Aborted || reason(err) != "STREAM_REPLACED" {
			t.Errorf("%s: %v (reason %q), want ABORTED STREAM_REPLACED", what, err, reason(err))
		}
		return
	}
}
