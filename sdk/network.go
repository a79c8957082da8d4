package sdk

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
)

// ErrReplaced is returned by Run, wrapped, when another connection of the
// same agent took its mailbox over: one receiver per agent at a time.
var ErrReplaced = errors.New("another connection of this agent took over its mailbox")

// NetworkOptions tune a NetworkAgent. Zero values take the defaults noted.
type NetworkOptions struct {
	// Key is the agent's key (parley_ak_…), sent with every call.
	Key string
	// Router routes received messages; a new, empty one when nil. Several
	// agents may share one.
	Router *Router
	// ClearBacklog drops what waits in the mailbox on the first connect,
	// so that only messages sent from then on arrive.
	ClearBacklog bool
	// MinBackoff and MaxBackoff bound the wait before a reconnect, which
	// doubles after each failed attempt (with jitter); 100 ms and 10 s.
	MinBackoff, MaxBackoff time.Duration
	// DedupWindow is how many recent message ids are remembered to drop
	// redeliveries; 10,000.
	DedupWindow int
	// AckDelay is how long handled messages are gathered before one call
	// acknowledges them all, apart from receiving, which does not wait
	// for it; 50 ms. Each acknowledgement is a durable write on the
	// server, so one per message would cost a disk sync per message.
	// Until acknowledged, a message comes again only to a new agent (after
	// a restart of this process); a reconnect resumes after the last
	// message handled.
	AckDelay time.Duration
	// OnError hears handler errors, messages no route takes (ErrNoRoute)
	// and failed connections before a reconnect; nil ignores them.
	OnError func(error)
	// Concurrency is how many messages, each of a different dialogue, are
	// handled at once; 1 (the default) handles every message in mailbox
	// order, one at a time. Above 1, handlers (and OnError) must be safe
	// to call concurrently; the messages of one dialogue are still handled
	// one at a time in mailbox order. Every message the dispatcher sends
	// names a dialogue; each notification opens one of its own, so
	// notifications too are handled side by side. At most 4×Concurrency more messages
	// wait for a handler; then receiving pauses until one starts. A
	// message is acknowledged, and counts for Cursor, only once it and
	// every message before it in the mailbox are handled, so a slow
	// handler holds the acknowledgement of the messages after it back.
	// When Run returns, the handlers' context ends and Run waits for them;
	// messages taken in but not started are left for a later Run or a new
	// agent.
	Concurrency int
}

// NetworkAgent receives an agent's network messages from its durable
// mailbox and routes them to handlers: in mailbox order, one at a time
// (or with NetworkOptions.Concurrency several dialogues at once, each in
// order), each acknowledged after its handler returns (gathered for
// NetworkOptions.AckDelay). It reconnects with backoff, resumes after the
// last cursor it handled (with Concurrency, the last it took in: those
// waiting for a handler stay queued across the reconnect), and drops
// redelivered ids.
type NetworkAgent struct {
	name    string
	client  dispatcherv1.DispatcherServiceClient
	opts    NetworkOptions
	router  *Router
	results *results

	mu     sync.Mutex // guards cursor, handled, acked, wake, seen, order, clear
	cursor uint64     // the last cursor received
	// handled is the cursor to acknowledge: the last whose batch was
	// handled, or with Concurrency the last at and below which every
	// message is handled.
	handled uint64
	acked   uint64        // the last cursor acknowledged
	wake    chan struct{} // the current stream's acknowledger's wakeup
	seen    map[string]struct{}
	order   []string // seen's ids, oldest first
	clear   bool     // ClearBacklog still to do

	acks  sync.WaitGroup // the streams' acknowledgers, which Run waits for
	ackMu sync.Mutex     // one AcknowledgeMessages call at a time, so that none overtakes a later cursor's
}

// NewNetworkAgent returns the agent name (clients/{client}/agents/{agent})
// receiving over conn. It does not connect until Run.
func NewNetworkAgent(conn grpc.ClientConnInterface, name string, opts NetworkOptions) (*NetworkAgent, error) {
	if conn == nil {
		return nil, errors.New("network agent: conn is nil")
	}
	if name == "" {
		return nil, errors.New("network agent: name is empty")
	}
	if opts.Router == nil {
		opts.Router = NewRouter()
	}
	if opts.MinBackoff <= 0 {
		opts.MinBackoff = 100 * time.Millisecond
	}
	if opts.MaxBackoff < opts.MinBackoff {
		opts.MaxBackoff = max(10*time.Second, opts.MinBackoff)
	}
	if opts.DedupWindow <= 0 {
		opts.DedupWindow = 10_000
	}
	if opts.AckDelay <= 0 {
		opts.AckDelay = 50 * time.Millisecond
	}
	opts.Concurrency = max(opts.Concurrency, 1)
	return &NetworkAgent{
		name: name, client: dispatcherv1.NewDispatcherServiceClient(conn), opts: opts, router: opts.Router,
		results: newResults(), seen: map[string]struct{}{}, clear: opts.ClearBacklog,
	}, nil
}

// Name returns the agent's name.
func (a *NetworkAgent) Name() string { return a.name }

// Handle registers a route on the agent's Router; see Router.Handle.
func (a *NetworkAgent) Handle(key RouteKey, name string, h HandlerFunc) error {
	return a.router.Handle(key, name, h)
}

// Cursor returns the mailbox cursor of the last message handled; with
// Concurrency, the last at and below which every message is handled.
func (a *NetworkAgent) Cursor() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.opts.Concurrency > 1 {
		return a.handled
	}
	return a.cursor
}

// Expect returns the next value a handler of the route named name passed
// back to this agent. A zero timeout returns at once, a negative one waits
// until ctx ends; ErrNothingExpected when none came.
func (a *NetworkAgent) Expect(ctx context.Context, name string, timeout time.Duration) (any, error) {
	_, v, err := a.results.expect(ctx, []string{name}, timeout)
	return v, err
}

// ExpectMultiple returns the first value passed back by a handler of any
// of the routes named, with the route's name.
func (a *NetworkAgent) ExpectMultiple(ctx context.Context, names []string, timeout time.Duration) (string, any, error) {
	return a.results.expect(ctx, names, timeout)
}

func (a *NetworkAgent) callContext(ctx context.Context) context.Context {
	if a.opts.Key == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+a.opts.Key)
}

func (a *NetworkAgent) report(err error) {
	if a.opts.OnError != nil {
		a.opts.OnError(err)
	}
}

// Run receives and handles messages until ctx ends (returning nil) or the
// server refuses the agent for good: its key or name (wrapping
// ErrNotAuthorized, or INVALID_ARGUMENT), or a takeover by another
// connection (ErrReplaced). Anything else reconnects after a backoff.
func (a *NetworkAgent) Run(ctx context.Context) error {
	defer a.acks.Wait() // the last acknowledgements
	var d *dialogues
	if a.opts.Concurrency > 1 {
		// The handlers' context ends when Run returns, for whatever reason.
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		d = newDialogues(a.opts.Concurrency, a.route, a.handledUpTo)
		defer func() {
			cancel()
			a.stop(ctx, d)
		}()
	}
	backoff := a.opts.MinBackoff
	for {
		established, err := a.receive(ctx, d)
		if ctx.Err() != nil {
			return nil
		}
		switch status.Code(err) {
		case codes.Unauthenticated, codes.PermissionDenied:
			return fmt.Errorf("receive: %w: %s", ErrNotAuthorized, status.Convert(err).Message())
		case codes.InvalidArgument, codes.Unimplemented:
			return fmt.Errorf("receive: %w", err)
		case codes.Aborted:
			return fmt.Errorf("receive: %w: %s", ErrReplaced, status.Convert(err).Message())
		}
		if established {
			backoff = a.opts.MinBackoff
		}
		a.report(fmt.Errorf("receive: %w; reconnecting", err))
		if sleep(ctx, backoff) != nil {
			return nil
		}
		backoff = min(2*backoff, a.opts.MaxBackoff)
	}
}

// sleep waits a random time up to d, or until ctx ends (returning its
// error): full jitter, so that many agents cut off at once do not all try
// again at once.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(time.Duration(rand.Int64N(int64(d))) + time.Millisecond)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// stop ends Run with Concurrency: it waits for the handlers in flight,
// acknowledges what they handled, and forgets the messages never started
// (their ids and cursors), so that a later Run receives them again.
func (a *NetworkAgent) stop(ctx context.Context, d *dialogues) {
	d.wait()
	last, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	_ = a.ack(last) // a failure leaves them to come again
	cancel()
	dropped := d.drop()
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, m := range dropped {
		delete(a.seen, m.ID)
	}
	a.cursor = a.handled
}

// handledUpTo records that every message at and below cursor is handled
// (with Concurrency), and wakes the acknowledger.
func (a *NetworkAgent) handledUpTo(cursor uint64) {
	a.mu.Lock()
	a.handled = max(a.handled, cursor)
	wake := a.wake
	a.mu.Unlock()
	select {
	case wake <- struct{}{}:
	default: // a wakeup is pending already
	}
}

// receive runs one stream, handling its messages inline, or handing them
// to d when it is not nil; established reports whether the server
// accepted it (its first batch arrived). With d, the messages taken in
// stay there across reconnects: the next stream resumes after them.
func (a *NetworkAgent) receive(runCtx context.Context, d *dialogues) (established bool, err error) {
	ctx, cancel := context.WithCancel(runCtx)
	defer cancel()
	// The acknowledger ends with the stream, after a last
	// acknowledgement, which a reconnect does not wait for; Run does.
	handled := make(chan struct{}, 1)
	a.mu.Lock()
	req := &dispatcherv1.ReceiveMessagesRequest{Agent: a.name, AfterCursor: a.cursor, ClearBacklog: a.clear}
	a.wake = handled
	a.mu.Unlock()
	if d != nil {
		// Handlers may have finished while no stream was open.
		handled <- struct{}{}
	}
	stream, err := a.client.ReceiveMessages(a.callContext(ctx), req)
	if err != nil {
		return false, err
	}
	a.acks.Go(func() { a.acknowledge(ctx, handled) })
	for {
		resp, err := stream.Recv()
		if err != nil {
			return established, err
		}
		if !established {
			established = true
			a.mu.Lock()
			a.clear = false
			a.mu.Unlock()
		}
		if len(resp.GetMessages()) == 0 {
			continue // a keepalive
		}
		if d != nil {
			for _, pm := range resp.GetMessages() {
				m := fromProto(pm)
				m.Recipient = a.name
				if !a.admit(m) {
					d.pass(m) // handled before: its cursor is acknowledged in turn
					continue
				}
				// Handlers run on Run's context: they outlive the stream.
				if err := d.dispatch(runCtx, m); err != nil {
					a.mu.Lock()
					delete(a.seen, m.ID) // not taken in: a later Run receives it
					a.mu.Unlock()
					return established, err
				}
			}
			continue // the handlers record what they handle
		}
		for _, pm := range resp.GetMessages() {
			m := fromProto(pm)
			m.Recipient = a.name // routes are keyed by the agent receiving
			a.handle(ctx, m)
		}
		last := resp.GetMessages()[len(resp.GetMessages())-1].GetCursor()
		a.mu.Lock()
		a.handled = max(a.handled, last)
		a.mu.Unlock()
		select {
		case handled <- struct{}{}:
		default: // a wakeup is pending already
		}
	}
}

// acknowledge acknowledges the messages handled on one stream: after a
// wakeup on handled, it waits AckDelay for more and acknowledges the last
// handled cursor in one call. When ctx ends it acknowledges what is left
// on a context of its own. A failure is reported; the next
// acknowledgement covers those messages (unacknowledged ones come again
// only to a new agent, which drops none it has not seen).
func (a *NetworkAgent) acknowledge(ctx context.Context, handled <-chan struct{}) {
	for {
		select {
		case <-handled:
			t := time.NewTimer(a.opts.AckDelay)
			select {
			case <-t.C:
				if err := a.ack(ctx); err != nil && ctx.Err() == nil {
					a.report(fmt.Errorf("acknowledge: %w", err))
				}
				continue
			case <-ctx.Done():
				t.Stop()
			}
		case <-ctx.Done():
		}
		last, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_ = a.ack(last) // the stream ended; a failure leaves them to come again
		cancel()
		return
	}
}

// ack acknowledges the handled cursor, unless it is acknowledged already.
func (a *NetworkAgent) ack(ctx context.Context) error {
	a.ackMu.Lock()
	defer a.ackMu.Unlock()
	a.mu.Lock()
	cursor, acked := a.handled, a.acked
	a.mu.Unlock()
	if cursor <= acked {
		return nil
	}
	if _, err := a.client.AcknowledgeMessages(a.callContext(ctx), &dispatcherv1.AcknowledgeMessagesRequest{Agent: a.name, Cursor: cursor}); err != nil {
		return err
	}
	a.mu.Lock()
	a.acked = max(a.acked, cursor)
	a.mu.Unlock()
	return nil
}

// handle routes m unless its id was seen.
func (a *NetworkAgent) handle(ctx context.Context, m Message) {
	if a.admit(m) {
		a.route(ctx, m)
	}
}

// admit records m's id and cursor and reports whether it is new (its id
// not seen).
func (a *NetworkAgent) admit(m Message) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.cursor = max(a.cursor, m.Cursor)
	if _, dup := a.seen[m.ID]; dup {
		return false
	}
	a.seen[m.ID] = struct{}{}
	a.order = append(a.order, m.ID)
	if len(a.order) > a.opts.DedupWindow {
		delete(a.seen, a.order[0])
		a.order = a.order[1:]
	}
	return true
}

// route runs m's handler: its value goes to Expect, its error to
// OnError.
func (a *NetworkAgent) route(ctx context.Context, m Message) {
	rt, ok := a.router.lookup(m)
	if !ok {
		a.report(fmt.Errorf("message %s (type %q, category %q): %w", m.ID, m.Type, m.Category, ErrNoRoute))
		return
	}
	v, err := safeCall(ctx, rt.h, m)
	if err != nil {
		a.report(fmt.Errorf("route %q, message %s: %w", rt.name, m.ID, err))
	}
	if v != nil {
		a.results.push(rt.name, v)
	}
}

// safeCall runs h, turning a panic into an error so that one bad handler
// cannot end the agent.
func safeCall(ctx context.Context, h HandlerFunc, m Message) (v any, err error) {
	defer func() {
		if r := recover(); r != nil {
			v, err = nil, fmt.Errorf("handler panicked: %v", r)
		}
	}()
	return h(ctx, m)
}

var categoryNames = map[dispatcherv1.MessageCategory]Category{
	dispatcherv1.MessageCategory_MESSAGE_CATEGORY_MESSAGE:       CategoryMessage,
	dispatcherv1.MessageCategory_MESSAGE_CATEGORY_SUBSCRIPTION:  CategorySubscription,
	dispatcherv1.MessageCategory_MESSAGE_CATEGORY_SERVICE:       CategoryService,
	dispatcherv1.MessageCategory_MESSAGE_CATEGORY_NOTIFICATIONS: CategoryNotifications,
}

func fromProto(m *dispatcherv1.NetworkMessage) Message {
	out := Message{
		ID: m.GetMessageId(), DialogueID: m.GetDialogueId(), Sender: m.GetSender(), Recipient: m.GetRecipient(),
		Category: categoryNames[m.GetCategory()], Type: m.GetMessageType(), Protocol: m.GetProtocol(),
		RecipientType: m.GetRecipientType(), Body: m.GetBodyJson(), InReplyTo: m.GetInReplyTo(), Cursor: m.GetCursor(),
	}
	if t := m.GetCreateTime(); t.IsValid() {
		out.Time = t.AsTime()
	}
	return out
}
