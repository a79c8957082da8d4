package server

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

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/services/dispatcher/internal/agora"
)

// errAgentGone: the connected agent went away before answering.
var errAgentGone = errors.New("the connected agent disconnected")

// hub tracks connected SDK agents.
type hub struct {
	metrics *metrics

	mu    sync.RWMutex // guards conns
	conns map[string][]*agentConn
}

func newHub(m *metrics) *hub { return &hub{metrics: m, conns: map[string][]*agentConn{}} }

// agentConn is one Connect stream.
type agentConn struct {
	agent  string
	hashes map[string]bool // sha1 hex
	nl     bool
	steps  bool
	stream dispatcherv1.DispatcherService_ConnectServer

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

func (h *hub) add(c *agentConn) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.conns[c.agent] = append(h.conns[c.agent], c)
	h.metrics.connected.Inc()
}

func (h *hub) remove(c *agentConn) {
	h.mu.Lock()
	defer h.mu.Unlock()
	list := h.conns[c.agent]
	for i, x := range list {
		if x == c {
			h.conns[c.agent] = append(list[:i:i], list[i+1:]...)
			h.metrics.connected.Dec()
			break
		}
	}
	if len(h.conns[c.agent]) == 0 {
		delete(h.conns, c.agent)
	}
}

// pick returns the most recently connected stream of agent that matches.
func (h *hub) pick(agent string, match func(*agentConn) bool) *agentConn {
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

func (h *hub) handlerFor(agent, hexHash string) *agentConn {
	return h.pick(agent, func(c *agentConn) bool { return c.hashes[hexHash] })
}

func (h *hub) nlHandler(agent string) *agentConn {
	return h.pick(agent, func(c *agentConn) bool { return c.nl })
}

func (h *hub) stepHandler(agent string) *agentConn {
	return h.pick(agent, func(c *agentConn) bool { return c.steps })
}

// call sends msg (whose request id is set by fill) and waits for the answer
// until timeout or ctx ends.
func (c *agentConn) call(ctx context.Context, timeout time.Duration, fill func(id string, deadline *timestamppb.Timestamp) *dispatcherv1.ConnectResponse) (*dispatcherv1.ConnectRequest, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	id := strconv.FormatUint(c.nextID.Add(1), 10)
	ch := make(chan *dispatcherv1.ConnectRequest, 1)
	c.mu.Lock()
	if c.pending == nil {
		c.mu.Unlock()
		return nil, errAgentGone
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
			return nil, errAgentGone
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

// errAgentStuck: the connected agent's outbound queue is full.
var errAgentStuck = errors.New("the connected agent is not reading its stream")

// enqueue queues msg for the sender, failing at once when the queue is
// full. A queue that stays full for stuckFor drops the connection.
func (c *agentConn) enqueue(ctx context.Context, msg *dispatcherv1.ConnectResponse) error {
	select {
	case <-c.dropped:
		return errAgentGone
	default:
	}
	select {
	case c.out <- outbound{ctx: ctx, msg: msg}:
		return nil
	default:
	}
	now := time.Now().UnixNano()
	if c.fullSince.CompareAndSwap(0, now) {
		return errAgentStuck
	}
	if time.Duration(now-c.fullSince.Load()) >= c.stuckFor {
		c.drop()
	}
	return errAgentStuck
}

// sendLoop drains the outbound queue into the stream until done closes or
// a send fails (then the connection is dropped).
func (c *agentConn) sendLoop(done <-chan struct{}) {
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

func (c *agentConn) drop() { c.dropOnce.Do(func() { close(c.dropped) }) }

func (c *agentConn) deliver(id string, m *dispatcherv1.ConnectRequest) {
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

func (c *agentConn) closePending() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ch := range c.pending {
		close(ch)
	}
	c.pending = nil
}

// Connect implements DispatcherServiceServer.
func (s *Server) Connect(stream dispatcherv1.DispatcherService_ConnectServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	hello := first.GetHello()
	if hello == nil {
		return invalid("hello", "the first message must be a hello")
	}
	if !validAgentName(hello.GetAgent()) {
		return invalid("hello.agent", "must be clients/{client}/agents/{agent}")
	}
	c := &agentConn{
		agent:    hello.GetAgent(),
		hashes:   map[string]bool{},
		nl:       hello.GetNaturalLanguage(),
		steps:    hello.GetSteps(),
		stream:   stream,
		pending:  map[string]chan *dispatcherv1.ConnectRequest{},
		out:      make(chan outbound, s.opts.HandlerQueue),
		stuckFor: s.opts.HandlerTimeout,
		dropped:  make(chan struct{}),
	}
	for i, h := range hello.GetProtocolHashes() {
		raw, form, err := agora.ParseHash(h)
		if err != nil || form != agora.HashHex && form != agora.HashBase64 {
			return invalid(fmt.Sprintf("hello.protocol_hashes[%d]", i), "must be a SHA-1 as 40 hex or 28 base64 characters")
		}
		c.hashes[(&agora.Envelope{Hash: raw}).HexHash()] = true
	}
	err = stream.Send(&dispatcherv1.ConnectResponse{Kind: &dispatcherv1.ConnectResponse_Ready{Ready: &dispatcherv1.ConnectReady{Agent: c.agent}}})
	if err != nil {
		return err
	}
	done := make(chan struct{})
	go c.sendLoop(done)
	s.hub.add(c)
	defer func() {
		s.hub.remove(c)
		c.closePending()
		close(done)
	}()
	recvErr := make(chan error, 1)
	go func() { recvErr <- c.recvLoop() }()
	select {
	case err := <-recvErr:
		return err
	case <-s.opts.Stopping:
		return status.Error(codes.Unavailable, "the dispatcher is shutting down; reconnect")
	case <-c.dropped:
		// Returning ends the stream, which unblocks a pending Send and Recv.
		s.logger.Warn("dropping a connected agent that does not read its stream", slog.String("agent", c.agent))
		return grpcerr.New(codes.ResourceExhausted, "the agent did not read its stream; reconnect", "AGENT_STUCK", Domain, nil)
	}
}

// recvLoop reads the agent's answers until the stream ends.
func (c *agentConn) recvLoop() error {
	for {
		m, err := c.stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, context.Canceled) || status.Code(err) == codes.Canceled {
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
			return grpcerr.New(codes.InvalidArgument, "hello may only be sent once", "DUPLICATE_HELLO", Domain, nil)
		}
	}
}
