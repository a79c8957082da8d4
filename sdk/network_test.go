package sdk_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/sdk"
)

const bob = "clients/acme/agents/bob"

func TestRouter_lookupOrder(t *testing.T) {
	const proto = "3a732bde0e63d2e838d1a722feebf3d67b52b211"
	r := sdk.NewRouter()
	named := func(name string) sdk.HandlerFunc {
		return func(context.Context, sdk.Message) (any, error) { return name, nil }
	}
	routes := []struct {
		key  sdk.RouteKey
		name string
	}{
		{sdk.RouteKey{Type: "offer", Category: sdk.CategoryService, Protocol: proto, RecipientType: "consumer"}, "generic offer"},
		{sdk.RouteKey{Agent: bob, Type: "offer", Category: sdk.CategoryService, Protocol: proto, RecipientType: "consumer"}, "bob's offer"},
		{sdk.RouteKey{Type: "new_message", Category: sdk.CategoryMessage, RecipientType: "recipient"}, "generic new message"},
		{sdk.RouteKey{Type: sdk.TypeProtocolError}, "generic protocol error"},
		{sdk.RouteKey{Agent: bob, Type: sdk.TypeGeneralError}, "bob's general error"},
	}
	for _, rt := range routes {
		if err := r.Handle(rt.key, rt.name, named(rt.name)); err != nil {
			t.Fatalf("Handle(%+v) = %v", rt.key, err)
		}
	}
	if err := r.Handle(routes[1].key, "again", named("again")); !errors.Is(err, sdk.ErrDuplicateRoute) {
		t.Errorf("Handle(the same key twice) = %v, want ErrDuplicateRoute", err)
	}
	if err := r.Handle(sdk.RouteKey{Type: "x"}, "nil", nil); err == nil {
		t.Error("Handle(nil handler) = nil, want an error")
	}
	if err := r.Handle(sdk.RouteKey{Type: "x"}, "", named("x")); err == nil {
		t.Error("Handle(empty name) = nil, want an error")
	}
	tests := []struct {
		name string
		msg  sdk.Message
		want string // the route that handles it; "" dropped
	}{
		{"agent key first", sdk.Message{Recipient: bob, Type: "offer", Category: sdk.CategoryService, Protocol: proto, RecipientType: "consumer"}, "bob's offer"},
		{"generic key for another agent", sdk.Message{Recipient: "clients/acme/agents/carol", Type: "offer", Category: sdk.CategoryService, Protocol: proto, RecipientType: "consumer"}, "generic offer"},
		{"generic key", sdk.Message{Recipient: bob, Type: "new_message", Category: sdk.CategoryMessage, RecipientType: "recipient"}, "generic new message"},
		{"a protocol's message without a route: protocol_error", sdk.Message{Recipient: bob, Type: "offer", Category: sdk.CategoryService, Protocol: proto, RecipientType: "supplier"}, "generic protocol error"},
		{"a protocol_error message", sdk.Message{Recipient: bob, Type: sdk.TypeProtocolError, Category: sdk.CategoryMessage}, "generic protocol error"},
		{"no protocol, no route: general_error", sdk.Message{Recipient: bob, Type: "hello", Category: sdk.CategoryMessage}, "bob's general error"},
		{"another agent has no general_error", sdk.Message{Recipient: "clients/acme/agents/carol", Type: "hello", Category: sdk.CategoryMessage}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := routeOf(t, r, tt.msg); got != tt.want {
				t.Errorf("route of %+v = %q, want %q", tt.msg, got, tt.want)
			}
		})
	}
}

func TestRouter_ignoreMissingRoutesDropsAProtocolsStrays(t *testing.T) {
	const proto = "3a732bde0e63d2e838d1a722feebf3d67b52b211"
	r := sdk.NewRouter()
	if err := r.Handle(sdk.RouteKey{Type: sdk.TypeGeneralError}, "general", func(context.Context, sdk.Message) (any, error) { return "general", nil }); err != nil {
		t.Fatal(err)
	}
	m := sdk.Message{Recipient: bob, Type: "offer", Protocol: proto}
	if got := routeOf(t, r, m); got != "general" {
		t.Fatalf("before IgnoreMissingRoutes: %q, want general", got)
	}
	r.IgnoreMissingRoutes(proto)
	if got := routeOf(t, r, m); got != "" {
		t.Errorf("after IgnoreMissingRoutes: %q, want dropped", got)
	}
}

// routeOf runs m through a NetworkAgent on a fake dispatcher and returns
// the name of the route that took it, or "" when none did.
func routeOf(t *testing.T, r *sdk.Router, m sdk.Message) string {
	t.Helper()
	f := &fakeMailbox{}
	f.script = []connScript{{send: [][]*dispatcherv1.NetworkMessage{{netMsg(1, "m1", m)}}}}
	noRoute := make(chan struct{}, 1)
	a := newAgent(t, f, m.Recipient, sdk.NetworkOptions{Router: r, OnError: func(err error) {
		if errors.Is(err, sdk.ErrNoRoute) {
			noRoute <- struct{}{}
		}
	}})
	stop := runAgent(t, a)
	defer stop()
	// Every route here passes its own name back; a dropped message reports
	// ErrNoRoute.
	names := []string{"bob's offer", "generic offer", "generic new message", "generic protocol error", "bob's general error", "general"}
	done := make(chan string, 1)
	go func() {
		name, _, err := a.ExpectMultiple(t.Context(), names, 30*time.Second)
		if err != nil {
			name = "error: " + err.Error()
		}
		done <- name
	}()
	select {
	case got := <-done:
		return got
	case <-noRoute:
		return ""
	}
}

func netMsg(cursor uint64, id string, m sdk.Message) *dispatcherv1.NetworkMessage {
	cats := map[sdk.Category]dispatcherv1.MessageCategory{
		sdk.CategoryMessage: dispatcherv1.MessageCategory_MESSAGE_CATEGORY_MESSAGE,
		sdk.CategoryService: dispatcherv1.MessageCategory_MESSAGE_CATEGORY_SERVICE,
	}
	return &dispatcherv1.NetworkMessage{
		MessageId: id, DialogueId: "d", Recipient: m.Recipient, Category: cats[m.Category], MessageType: m.Type,
		Protocol: m.Protocol, RecipientType: m.RecipientType, BodyJson: []byte(`{}`), Cursor: cursor,
	}
}

// connScript is what the fake does on one ReceiveMessages call: send these
// batches (after the first, empty one), then end with err (nil: stay open
// until the client goes).
type connScript struct {
	send [][]*dispatcherv1.NetworkMessage
	err  error
	hold chan struct{} // when set, the stream ends (with err) only once it closes
}

// fakeMailbox is a dispatcher on loopback that plays one script per
// ReceiveMessages call and records requests and acknowledgements.
type fakeMailbox struct {
	dispatcherv1.UnimplementedDispatcherServiceServer
	script []connScript

	// ackGate, when set, holds each AcknowledgeMessages until it closes.
	ackGate chan struct{}

	mu       sync.Mutex
	requests []*dispatcherv1.ReceiveMessagesRequest
	acks     []uint64
}

func (f *fakeMailbox) ReceiveMessages(req *dispatcherv1.ReceiveMessagesRequest, stream grpc.ServerStreamingServer[dispatcherv1.ReceiveMessagesResponse]) error {
	f.mu.Lock()
	n := len(f.requests)
	f.requests = append(f.requests, req)
	f.mu.Unlock()
	if n >= len(f.script) {
		<-stream.Context().Done()
		return nil
	}
	sc := f.script[n]
	if err := stream.Send(&dispatcherv1.ReceiveMessagesResponse{}); err != nil {
		return err
	}
	for _, batch := range sc.send {
		if err := stream.Send(&dispatcherv1.ReceiveMessagesResponse{Messages: batch}); err != nil {
			return err
		}
	}
	if sc.hold != nil {
		select {
		case <-sc.hold:
		case <-stream.Context().Done():
		}
	}
	if sc.err != nil {
		return sc.err
	}
	<-stream.Context().Done()
	return nil
}

func (f *fakeMailbox) AcknowledgeMessages(ctx context.Context, req *dispatcherv1.AcknowledgeMessagesRequest) (*dispatcherv1.Mailbox, error) {
	if f.ackGate != nil {
		select {
		case <-f.ackGate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.acks = append(f.acks, req.GetCursor())
	return &dispatcherv1.Mailbox{Agent: req.GetAgent(), AcknowledgedCursor: req.GetCursor()}, nil
}

func (f *fakeMailbox) lastAck() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.acks) == 0 {
		return 0
	}
	return f.acks[len(f.acks)-1]
}

func newAgent(t *testing.T, f *fakeMailbox, name string, opts sdk.NetworkOptions) *sdk.NetworkAgent {
	t.Helper()
	conn := serveDispatcher(t, f)
	if opts.MinBackoff == 0 {
		opts.MinBackoff = time.Millisecond
	}
	a, err := sdk.NewNetworkAgent(conn, name, opts)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// runAgent runs a until the returned stop is called, which checks that Run
// returned nil.
func runAgent(t *testing.T, a *sdk.NetworkAgent) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run after cancel = %v, want nil", err)
		}
	}
}

func msgs(from, to uint64) []*dispatcherv1.NetworkMessage {
	var out []*dispatcherv1.NetworkMessage
	for c := from; c <= to; c++ {
		out = append(out, netMsg(c, fmt.Sprintf("m%d", c), sdk.Message{Recipient: bob, Type: "new_message", Category: sdk.CategoryMessage}))
	}
	return out
}

// The stream breaks; the agent reconnects after the last cursor it
// handled, and a redelivered id is handled once.
func TestNetworkAgent_reconnectsResumesAndDropsRedeliveries(t *testing.T) {
	f := &fakeMailbox{script: []connScript{
		{send: [][]*dispatcherv1.NetworkMessage{msgs(1, 2)}, err: status.Error(codes.Unavailable, "server restarting")},
		{send: [][]*dispatcherv1.NetworkMessage{msgs(2, 3)}}, // 2 again: at least once
	}}
	var (
		mu      sync.Mutex
		handled []string
	)
	a := newAgent(t, f, bob, sdk.NetworkOptions{})
	err := a.Handle(sdk.RouteKey{Type: "new_message", Category: sdk.CategoryMessage}, "inbox", func(_ context.Context, m sdk.Message) (any, error) {
		mu.Lock()
		handled = append(handled, m.ID)
		mu.Unlock()
		return m.ID, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := runAgent(t, a)
	var got []string
	for range 3 {
		v, err := a.Expect(t.Context(), "inbox", 30*time.Second)
		if err != nil {
			t.Fatalf("Expect after %v: %v", got, err)
		}
		got = append(got, v.(string))
	}
	// The acknowledgement follows the handler: wait for it.
	deadline := time.Now().Add(30 * time.Second)
	for f.lastAck() != 3 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	stop()
	if fmt.Sprint(got) != "[m1 m2 m3]" {
		t.Errorf("values passed back = %v, want [m1 m2 m3]", got)
	}
	if v, err := a.Expect(t.Context(), "inbox", 0); !errors.Is(err, sdk.ErrNothingExpected) {
		t.Errorf("Expect with nothing queued = %v, %v; want ErrNothingExpected (m2 handled once)", v, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.requests) < 2 || f.requests[1].GetAfterCursor() != 2 || f.requests[1].GetAgent() != bob {
		t.Errorf("reconnect request = %v, want agent bob after cursor 2", f.requests)
	}
	if last := f.acks[len(f.acks)-1]; last != 3 {
		t.Errorf("acknowledged cursors %v, want the last to be 3", f.acks)
	}
	if f.acks[0] != 2 {
		t.Errorf("acknowledged cursors %v, want the first batch's 2 first", f.acks)
	}
	if a.Cursor() != 3 {
		t.Errorf("Cursor() = %d, want 3", a.Cursor())
	}
}

func TestNetworkAgent_stopsOnRefusalAndTakeover(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want error
	}{
		{"another agent's mailbox", status.Error(codes.PermissionDenied, "not yours"), sdk.ErrNotAuthorized},
		{"bad key", status.Error(codes.Unauthenticated, "bad key"), sdk.ErrNotAuthorized},
		{"taken over", status.Error(codes.Aborted, "another connection took over"), sdk.ErrReplaced},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeMailbox{script: []connScript{{err: tt.err}}}
			a := newAgent(t, f, bob, sdk.NetworkOptions{})
			if err := a.Run(t.Context()); !errors.Is(err, tt.want) {
				t.Errorf("Run = %v, want %v", err, tt.want)
			}
		})
	}
}

func TestNetworkAgent_handlerPanicsAndErrorsAreReportedNotFatal(t *testing.T) {
	for _, concurrency := range []int{1, 4} {
		t.Run(fmt.Sprintf("concurrency %d", concurrency), func(t *testing.T) {
			f := &fakeMailbox{script: []connScript{{send: [][]*dispatcherv1.NetworkMessage{msgs(1, 3)}}}}
			reported := make(chan error, 10)
			a := newAgent(t, f, bob, sdk.NetworkOptions{Concurrency: concurrency, OnError: func(err error) { reported <- err }})
			n := 0 // one dialogue: its handlers run one at a time
			err := a.Handle(sdk.RouteKey{Type: "new_message", Category: sdk.CategoryMessage}, "inbox", func(_ context.Context, m sdk.Message) (any, error) {
				n++
				switch n {
				case 1:
					panic("bad handler")
				case 2:
					return nil, errors.New("could not handle")
				}
				return m.ID, nil
			})
			if err != nil {
				t.Fatal(err)
			}
			stop := runAgent(t, a)
			defer stop()
			if v, err := a.Expect(t.Context(), "inbox", 30*time.Second); err != nil || v != "m3" {
				t.Errorf("Expect = %v, %v; want m3 after a panic and an error", v, err)
			}
			for range 2 {
				select {
				case err := <-reported:
					if err == nil {
						t.Error("OnError(nil)")
					}
				case <-time.After(30 * time.Second):
					t.Fatal("the panic and the error were not both reported")
				}
			}
		})
	}
}

func TestExpect_timeoutsAndNoSharedStateBetweenAgents(t *testing.T) {
	r := sdk.NewRouter()
	if err := r.Handle(sdk.RouteKey{Type: "new_message", Category: sdk.CategoryMessage}, "inbox", func(_ context.Context, m sdk.Message) (any, error) {
		return json.RawMessage(m.Body), nil
	}); err != nil {
		t.Fatal(err)
	}
	f := &fakeMailbox{script: []connScript{{send: [][]*dispatcherv1.NetworkMessage{msgs(1, 1)}}}}
	busy := newAgent(t, f, bob, sdk.NetworkOptions{Router: r})
	idle := newAgent(t, &fakeMailbox{}, "clients/acme/agents/carol", sdk.NetworkOptions{Router: r})
	defer runAgent(t, busy)()
	defer runAgent(t, idle)()
	if _, err := busy.Expect(t.Context(), "inbox", 30*time.Second); err != nil {
		t.Fatalf("busy Expect = %v", err)
	}
	if v, err := idle.Expect(t.Context(), "inbox", time.Millisecond); !errors.Is(err, sdk.ErrNothingExpected) {
		t.Errorf("idle agent's Expect = %v, %v; want ErrNothingExpected (the other agent's value is not its)", v, err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := idle.Expect(ctx, "inbox", -1); !errors.Is(err, context.Canceled) {
		t.Errorf("Expect(cancelled ctx, no timeout) = %v, want context.Canceled", err)
	}
	if _, _, err := idle.ExpectMultiple(t.Context(), nil, 0); err == nil {
		t.Error("ExpectMultiple(no names) = nil error, want one")
	}
}

func TestNewNetworkAgent_refusesBadInput(t *testing.T) {
	if _, err := sdk.NewNetworkAgent(nil, bob, sdk.NetworkOptions{}); err == nil {
		t.Error("NewNetworkAgent(nil conn) = nil error")
	}
	conn, err := grpc.NewClient("127.0.0.1:1", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := sdk.NewNetworkAgent(conn, "", sdk.NetworkOptions{}); err == nil {
		t.Error("NewNetworkAgent(empty name) = nil error")
	}
}

// Receiving does not wait for acknowledgements: while the server holds
// them, every batch is still handled; once it lets them through, the
// handled messages are acknowledged in fewer calls than batches, the last
// one naming the last cursor.
func TestNetworkAgent_acknowledgesApartFromReceiving(t *testing.T) {
	var batches [][]*dispatcherv1.NetworkMessage
	for c := uint64(1); c <= 10; c++ {
		batches = append(batches, msgs(c, c))
	}
	f := &fakeMailbox{script: []connScript{{send: batches}}, ackGate: make(chan struct{})}
	a := newAgent(t, f, bob, sdk.NetworkOptions{AckDelay: 10 * time.Millisecond})
	err := a.Handle(sdk.RouteKey{Type: "new_message", Category: sdk.CategoryMessage}, "inbox", func(_ context.Context, m sdk.Message) (any, error) {
		return m.ID, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := runAgent(t, a)
	defer stop()
	for i := range 10 {
		if _, err := a.Expect(t.Context(), "inbox", 30*time.Second); err != nil {
			t.Fatalf("Expect #%d while acknowledgements are held: %v", i+1, err)
		}
	}
	close(f.ackGate)
	deadline := time.Now().Add(30 * time.Second) // bounds a broken run only
	for f.lastAck() != 10 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.acks) == 0 || f.acks[len(f.acks)-1] != 10 || len(f.acks) >= 10 {
		t.Errorf("acknowledged cursors %v, want fewer calls than the 10 batches, the last naming 10", f.acks)
	}
}
