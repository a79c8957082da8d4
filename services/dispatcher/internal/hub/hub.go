// Package hub tracks the SDK agents connected to this dispatcher (one
// stream each, through Connect) and carries requests to them: envelopes
// and Agent Protocol steps out, answers back. The stream is any value with
// Send and Recv (the gRPC server stream in production); internal/server
// maps this package's errors to statuses.
package hub

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/services/dispatcher/internal/agora"
	"github.com/parleyhq/parley/services/dispatcher/internal/directory"
	"github.com/parleyhq/parley/services/dispatcher/internal/metrics"
)

// Errors of the hub.
var (
	// ErrAgentGone: the connected agent went away before answering.
	ErrAgentGone = errors.New("the connected agent disconnected")
	// ErrAgentStuck: the connected agent's outbound queue is full.
	ErrAgentStuck = errors.New("the connected agent is not reading its stream")
	// ErrNoHello: the stream did not start with a valid hello.
	ErrNoHello = errors.New("the first message must be a hello")
	// ErrBadHello: the hello names an invalid agent or protocol hash.
	ErrBadHello = errors.New("invalid hello")
	// ErrDuplicateHello: a second hello on the stream.
	ErrDuplicateHello = errors.New("hello may only be sent once")
	// ErrStopping: the dispatcher is shutting down.
	ErrStopping = errors.New("the dispatcher is shutting down; reconnect")
	// ErrDropped: the agent did not read its stream and was dropped.
	ErrDropped = errors.New("the agent did not read its stream; reconnect")
)

// Stream is one agent's bidirectional stream.
type Stream interface {
	Send(*dispatcherv1.ConnectResponse) error
	Recv() (*dispatcherv1.ConnectRequest, error)
}

// Options configures a Hub. Queue and Timeout must be positive: the
// dispatcher's config owns their defaults and New substitutes none.
type Options struct {
	// Queue bounds each agent's queue of requests not yet written to its
	// stream. A full queue fails requests at once, and one full for
	// Timeout drops the connection.
	Queue int
	// Timeout is how long a connected agent has to answer.
	Timeout time.Duration
	// Stopping, when it closes, ends every stream with ErrStopping.
	Stopping <-chan struct{}
	Logger   *slog.Logger
	Metrics  *metrics.Metrics
}

// Hub tracks connected SDK agents.
type Hub struct {
	opts Options

	mu    sync.RWMutex // guards conns
	conns map[string][]*Conn
}

// New returns an empty Hub.
func New(opts Options) *Hub {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Metrics == nil {
		opts.Metrics = metrics.New(nil)
	}
	return &Hub{opts: opts, conns: map[string][]*Conn{}}
}

// Start sets the channel whose closing ends every stream (see
// Options.Stopping), for a Hub built before its server existed. Call it
// before serving any stream.
func (h *Hub) Start(stopping <-chan struct{}) { h.opts.Stopping = stopping }

// Timeout is how long a connected agent has to answer.
func (h *Hub) Timeout() time.Duration { return h.opts.Timeout }

// Conn is one Connect stream.
type Conn struct {
	agent  string
	hashes map[string]bool // sha1 hex
	nl     bool
	steps  bool
	stream Stream

	// out is the bounded outbound queue; one goroutine (sendLoop) drains it
	// into the stream, so a client that stops reading blocks only that
	// goroutine, never a request.
	out       chan outbound
	stuckFor  time.Duration // queue full this long: drop the connection
	fullSince atomic.Int64  // unix nanos when an enqueue first found the queue full; 0 when not
	dropped   chan struct{} // closed by drop
	dropOnce  sync.Once
	nextID    atomic.Uint64

	mu      sync.Mutex // guards pending
	pending map[string]chan *dispatcherv1.ConnectRequest
}

func (h *Hub) add(c *Conn) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.conns[c.agent] = append(h.conns[c.agent], c)
	h.opts.Metrics.Connected.Inc()
}

func (h *Hub) remove(c *Conn) {
	h.mu.Lock()
	defer h.mu.Unlock()
	list := h.conns[c.agent]
	for i, x := range list {
		if x == c {
			h.conns[c.agent] = append(list[:i:i], list[i+1:]...)
			h.opts.Metrics.Connected.Dec()
			break
		}
	}
	if len(h.conns[c.agent]) == 0 {
		delete(h.conns, c.agent)
	}
}

// pick returns the most recently connected stream of agent that matches.
func (h *Hub) pick(agent string, match func(*Conn) bool) *Conn {
	h.mu.RLock()
	defer h.mu.RUnlock()
	list := h.conns[agent]
	for i := len(list) - 1; i >= 0; i-- {
		if match(list[i]) {
			return list[i]
		}
	}
	return nil
}

// Handler returns a stream of agent that handles the protocol, or nil.
func (h *Hub) Handler(agent, hexHash string) *Conn {
	return h.pick(agent, func(c *Conn) bool { return c.hashes[hexHash] })
}

// NL returns a stream of agent that handles natural language, or nil.
func (h *Hub) NL(agent string) *Conn {
	return h.pick(agent, func(c *Conn) bool { return c.nl })
}

// Steps returns a stream of agent that executes steps, or nil.
func (h *Hub) Steps(agent string) *Conn {
	return h.pick(agent, func(c *Conn) bool { return c.steps })
}

// Call sends msg (whose request id is set by fill) and waits for the answer
// until timeout or ctx ends.
func (c *Conn) Call(ctx context.Context, timeout time.Duration, fill func(id string, deadline *timestamppb.Timestamp) *dispatcherv1.ConnectResponse) (*dispatcherv1.ConnectRequest, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	id := strconv.FormatUint(c.nextID.Add(1), 10)
	ch := make(chan *dispatcherv1.ConnectRequest, 1)
	c.mu.Lock()
	if c.pending == nil {
		c.mu.Unlock()
		return nil, ErrAgentGone
	}
	c.pending[id] = ch
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		if c.pending != nil {
			delete(c.pending, id)
		}
		c.mu.Unlock()
	}()
	dl, _ := ctx.Deadline()
	if err := c.enqueue(ctx, fill(id, timestamppb.New(dl))); err != nil {
		return nil, err
	}
	select {
	case r, ok := <-ch:
		if !ok {
			return nil, ErrAgentGone
		}
		return r, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("the connected agent did not answer in time: %w", ctx.Err())
	}
}

// outbound is a queued message and the context of the request it carries.
type outbound struct {
	ctx context.Context //nolint:containedctx // the request's, to skip sending what it gave up on
	msg *dispatcherv1.ConnectResponse
}

// enqueue queues msg for the sender, failing at once when the queue is
// full. A queue that stays full for stuckFor drops the connection.
func (c *Conn) enqueue(ctx context.Context, msg *dispatcherv1.ConnectResponse) error {
	select {
	case <-c.dropped:
		return ErrAgentGone
	default:
	}
	select {
	case c.out <- outbound{ctx: ctx, msg: msg}:
		return nil
	default:
	}
	now := time.Now().UnixNano()
	if c.fullSince.CompareAndSwap(0, now) {
		return ErrAgentStuck
	}
	if time.Duration(now-c.fullSince.Load()) >= c.stuckFor {
		c.drop()
	}
	return ErrAgentStuck
}

// sendLoop drains the outbound queue into the stream until done closes or
// a send fails (then the connection is dropped).
func (c *Conn) sendLoop(done <-chan struct{}) {
	for {
		select {
		case <-done:
			return
		case o := <-c.out:
			c.fullSince.Store(0) // the queue has room again
			if o.ctx.Err() != nil {
				continue // its request gave up while it waited
			}
			if err := c.stream.Send(o.msg); err != nil {
				c.drop()
				return
			}
		}
	}
}

func (c *Conn) drop() { c.dropOnce.Do(func() { close(c.dropped) }) }

func (c *Conn) deliver(id string, m *dispatcherv1.ConnectRequest) {
	c.mu.Lock()
	ch := c.pending[id]
	c.mu.Unlock()
	if ch != nil {
		select {
		case ch <- m:
		default: // a duplicate answer; the first one won
		}
	}
}

func (c *Conn) closePending() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ch := range c.pending {
		close(ch)
	}
	c.pending = nil
}

// Serve runs one agent's stream until it ends, the agent is dropped or
// the hub stops: the first message must be a hello. It returns nil when
// the agent hung up, ErrStopping, ErrDropped, a hello error, or the
// stream's error.
func (h *Hub) Serve(stream Stream) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	hello := first.GetHello()
	if hello == nil {
		return ErrNoHello
	}
	if !directory.ValidAgentName(hello.GetAgent()) {
		return fmt.Errorf("%w: hello.agent must be clients/{client}/agents/{agent}", ErrBadHello)
	}
	c := &Conn{
		agent:    hello.GetAgent(),
		hashes:   map[string]bool{},
		nl:       hello.GetNaturalLanguage(),
		steps:    hello.GetSteps(),
		stream:   stream,
		pending:  map[string]chan *dispatcherv1.ConnectRequest{},
		out:      make(chan outbound, h.opts.Queue),
		stuckFor: h.opts.Timeout,
		dropped:  make(chan struct{}),
	}
	for i, hash := range hello.GetProtocolHashes() {
		raw, form, err := agora.ParseHash(hash)
		if err != nil || form != agora.HashHex && form != agora.HashBase64 {
			return fmt.Errorf("%w: hello.protocol_hashes[%d] must be a SHA-1 as 40 hex or 28 base64 characters", ErrBadHello, i)
		}
		c.hashes[(&agora.Envelope{Hash: raw}).HexHash()] = true
	}
	// Registered before ready: an agent that has its ready may be called
	// at once. What delivery queues meanwhile waits in c.out; the send
	// loop starts after ready, so ready is still the first message.
	done := make(chan struct{})
	h.add(c)
	defer func() {
		h.remove(c)
		c.closePending()
		close(done)
	}()
	err = stream.Send(&dispatcherv1.ConnectResponse{Kind: &dispatcherv1.ConnectResponse_Ready{Ready: &dispatcherv1.ConnectReady{Agent: c.agent}}})
	if err != nil {
		return err
	}
	go c.sendLoop(done)
	recvErr := make(chan error, 1)
	go func() { recvErr <- c.recvLoop() }()
	// A stream whose context ends (the client hung up, or its key was
	// revoked and the auth interceptor ended it) ends here as a hang-up;
	// returning unblocks the loops, as for a dropped agent.
	var ended <-chan struct{}
	if cs, ok := stream.(interface{ Context() context.Context }); ok {
		ended = cs.Context().Done()
	}
	select {
	case err := <-recvErr:
		return err
	case <-ended:
		return nil
	case <-h.opts.Stopping:
		return ErrStopping
	case <-c.dropped:
		// Returning ends the stream, which unblocks a pending Send and Recv.
		h.opts.Logger.Warn("dropping a connected agent that does not read its stream", slog.String("agent", c.agent))
		return ErrDropped
	}
}

// recvLoop reads the agent's answers until the stream ends.
func (c *Conn) recvLoop() error {
	for {
		m, err := c.stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, context.Canceled) {
				return nil
			}
			return err
		}
		switch k := m.GetKind().(type) {
		case *dispatcherv1.ConnectRequest_EnvelopeReply:
			c.deliver(k.EnvelopeReply.GetRequestId(), m)
		case *dispatcherv1.ConnectRequest_StepReply:
			c.deliver(k.StepReply.GetRequestId(), m)
		case *dispatcherv1.ConnectRequest_Hello:
			return ErrDuplicateHello
		}
	}
}
