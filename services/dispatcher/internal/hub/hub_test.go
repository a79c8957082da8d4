package hub_test

import (
	"errors"
	"io"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/services/dispatcher/internal/hub"
)

// fakeStream is an agent's stream: in carries what the agent sends, out
// what the hub sends it.
type fakeStream struct {
	in  chan *dispatcherv1.ConnectRequest
	out chan *dispatcherv1.ConnectResponse
}

func newFakeStream() *fakeStream {
	return &fakeStream{in: make(chan *dispatcherv1.ConnectRequest, 8), out: make(chan *dispatcherv1.ConnectResponse, 8)}
}

func (f *fakeStream) Send(m *dispatcherv1.ConnectResponse) error { f.out <- m; return nil }

func (f *fakeStream) Recv() (*dispatcherv1.ConnectRequest, error) {
	m, ok := <-f.in
	if !ok {
		return nil, io.EOF
	}
	return m, nil
}

const agent = "clients/acme/agents/weather"

func hello(nl bool) *dispatcherv1.ConnectRequest {
	return &dispatcherv1.ConnectRequest{Kind: &dispatcherv1.ConnectRequest_Hello{Hello: &dispatcherv1.AgentHello{Agent: agent, NaturalLanguage: nl}}}
}

// recv returns the next message the hub sent, failing after a generous
// 10 s (a hang is a failure, not a timeout of go test).
func recv(t *testing.T, s *fakeStream) *dispatcherv1.ConnectResponse {
	t.Helper()
	select {
	case m := <-s.out:
		return m
	case <-time.After(10 * time.Second):
		t.Fatal("no message from the hub")
		return nil
	}
}

// testOptions are a Hub's options with explicit limits: New substitutes
// no defaults (the dispatcher's config owns them).
func testOptions() hub.Options { return hub.Options{Queue: 64, Timeout: 10 * time.Second} }

func TestHub_callRoundTrip(t *testing.T) {
	h := hub.New(testOptions())
	s := newFakeStream()
	s.in <- hello(true)
	done := make(chan error, 1)
	go func() { done <- h.Serve(s) }()
	if r := recv(t, s); r.GetReady().GetAgent() != agent {
		t.Fatalf("first message = %v, want ready", r)
	}
	// The stream is registered before ready is sent: an agent that has
	// its ready can be called at once.
	c := h.NL(agent)
	if c == nil {
		t.Fatal("the connected agent is not registered once it has its ready")
	}
	if h.Handler(agent, "aa") != nil || h.Steps(agent) != nil {
		t.Error("the stream said natural language only, but got a protocol or step handler")
	}
	answered := make(chan error, 1)
	go func() {
		m, err := c.Call(t.Context(), 10*time.Second, func(id string, _ *timestamppb.Timestamp) *dispatcherv1.ConnectResponse {
			return &dispatcherv1.ConnectResponse{Kind: &dispatcherv1.ConnectResponse_Envelope{Envelope: &dispatcherv1.EnvelopeRequest{RequestId: id}}}
		})
		if err == nil && string(m.GetEnvelopeReply().GetBodyJson()) != `"hi"` {
			err = errors.New("wrong answer " + m.String())
		}
		answered <- err
	}()
	req := recv(t, s).GetEnvelope()
	s.in <- &dispatcherv1.ConnectRequest{Kind: &dispatcherv1.ConnectRequest_EnvelopeReply{EnvelopeReply: &dispatcherv1.EnvelopeReply{RequestId: req.GetRequestId(), BodyJson: []byte(`"hi"`)}}}
	if err := <-answered; err != nil {
		t.Fatalf("Call = %v", err)
	}
	s.in <- hello(true)
	if err := <-done; !errors.Is(err, hub.ErrDuplicateHello) {
		t.Errorf("Serve after a second hello = %v, want ErrDuplicateHello", err)
	}
	if h.NL(agent) != nil {
		t.Error("the agent is still connected after its stream ended")
	}
}

func TestHub_refusals(t *testing.T) {
	h := hub.New(testOptions())
	s := newFakeStream()
	s.in <- &dispatcherv1.ConnectRequest{Kind: &dispatcherv1.ConnectRequest_EnvelopeReply{EnvelopeReply: &dispatcherv1.EnvelopeReply{}}}
	if err := h.Serve(s); !errors.Is(err, hub.ErrNoHello) {
		t.Errorf("Serve(no hello) = %v, want ErrNoHello", err)
	}
	s = newFakeStream()
	s.in <- &dispatcherv1.ConnectRequest{Kind: &dispatcherv1.ConnectRequest_Hello{Hello: &dispatcherv1.AgentHello{Agent: "bad"}}}
	if err := h.Serve(s); !errors.Is(err, hub.ErrBadHello) {
		t.Errorf("Serve(bad agent) = %v, want ErrBadHello", err)
	}

	stopping := make(chan struct{})
	o := testOptions()
	o.Stopping = stopping
	h = hub.New(o)
	s = newFakeStream()
	s.in <- hello(false)
	done := make(chan error, 1)
	go func() { done <- h.Serve(s) }()
	recv(t, s) // ready
	close(stopping)
	select {
	case err := <-done:
		if !errors.Is(err, hub.ErrStopping) {
			t.Errorf("Serve when stopping = %v, want ErrStopping", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not end when the hub stopped")
	}
}

// readyStream checks, as the hub sends ready, that delivery already sees
// the agent (in CI a request right after ready once found no handler).
type readyStream struct {
	*fakeStream
	h          *hub.Hub
	registered chan bool
}

func (r *readyStream) Send(m *dispatcherv1.ConnectResponse) error {
	if m.GetReady() != nil {
		r.registered <- r.h.NL(agent) != nil
	}
	return r.fakeStream.Send(m)
}

func TestHub_registeredBeforeReady(t *testing.T) {
	h := hub.New(testOptions())
	s := &readyStream{fakeStream: newFakeStream(), h: h, registered: make(chan bool, 1)}
	s.in <- hello(true)
	done := make(chan error, 1)
	go func() { done <- h.Serve(s) }()
	if r := recv(t, s.fakeStream); r.GetReady() == nil {
		t.Fatalf("first message = %v, want ready", r)
	}
	if !<-s.registered {
		t.Error("the hub sent ready before the agent was visible to delivery")
	}
	close(s.in)
	if err := <-done; err != nil {
		t.Errorf("Serve after the agent hung up = %v, want nil", err)
	}
}
