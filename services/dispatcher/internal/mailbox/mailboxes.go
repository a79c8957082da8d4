package mailbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
)

// Errors of the mailboxes, besides ErrFull and ErrCursorAhead.
var (
	// ErrInvalid wraps a message or recipient list that cannot be stored.
	ErrInvalid = errors.New("invalid message")
	// ErrReplaced ends a Receive whose agent connected again elsewhere:
	// one stream per agent, the newest wins.
	ErrReplaced = errors.New("another connection of this agent took over")
	// ErrStopping ends a Receive because the server is shutting down.
	ErrStopping = errors.New("the server is shutting down")
)

// Options tune the mailboxes. The dispatcher's config owns the defaults
// (--mailbox-retention and the rest); New fills in only the clock.
type Options struct {
	// Bound is each agent's size bound; zero fields are unbounded.
	Bound Bound
	// Retention is how long an acknowledged message stays readable before
	// compaction deletes it; zero compacts it at the next sweep.
	Retention time.Duration
	// Now is the clock; time.Now.
	Now func() time.Time
	// Streams orders the receive streams across the replicas that share
	// the store; nil orders them on this replica only.
	Streams Streams
}

// Streams orders an agent's receive streams across replicas (PostgreSQL),
// so that one stream per agent holds on all of them: the newest wins.
type Streams interface {
	// OpenStream returns the epoch of a new stream of agent, greater than
	// every epoch returned before on any replica, and tells the other
	// replicas, which call Supersede with it.
	OpenStream(ctx context.Context, agent string) (uint64, error)
	// CloseStream says that agent's stream of epoch ended: it is
	// forgotten unless a newer stream of agent replaced it.
	CloseStream(ctx context.Context, agent string, epoch uint64) error
	// CloseStreams is CloseStream for many streams at once, in as few
	// round trips as it can: the streams of a replica that stops.
	CloseStreams(ctx context.Context, ended []StreamEnd) error
}

// StreamEnd names a stream that ended: its agent and epoch.
type StreamEnd struct {
	Agent string
	Epoch uint64
}

// closeStreamTimeout bounds CloseStream when a stream ends; a stream not
// forgotten then is swept later (the PostgreSQL store's SweepStreams).
const closeStreamTimeout = 5 * time.Second

// Mailboxes are the agents' durable mailboxes, and the connections that
// read them: one per agent at a time.
type Mailboxes struct {
	store Store
	opts  Options

	mu    sync.Mutex       // guards conns, epoch, opening and the stop fields
	conns map[string]*Conn // the connected agent's newest connection
	epoch uint64           // the last local epoch, without opts.Streams
	// opening holds the agents with a stream between OpenStream and
	// connect, and the greatest epoch Supersede named for each meanwhile:
	// a newer stream's notification may arrive before the older stream
	// is connected here. Bounded by the streams opening at once.
	opening map[string]*opening

	// The streams that end because the server stops (ReceiveOptions.Stop)
	// wait in stopped for EndStreams to close them in batches, unless
	// EndStreams already returned (ended); it waits on left for them.
	stopped []StreamEnd
	ended   bool
	left    chan struct{} // one pending signal: a connection went
}

// opening is an agent's streams being opened here.
type opening struct {
	n      int    // streams between OpenStream and connect
	newest uint64 // the greatest epoch Supersede named meanwhile
}

var _ Appender = (*Mailboxes)(nil)

// New returns the mailboxes kept in s.
func New(s Store, opts Options) *Mailboxes {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Mailboxes{store: s, opts: opts, conns: map[string]*Conn{}, opening: map[string]*opening{}, left: make(chan struct{}, 1)}
}

// Append implements Appender. Recipients are de-duplicated (first place
// wins). The message must carry its id, dialogue, category and type; a
// zero Time is set to now.
func (m *Mailboxes) Append(ctx context.Context, msg Message, recipients []string) ([]Refusal, error) {
	if err := validate(msg); err != nil {
		return nil, err
	}
	seen := make(map[string]struct{}, len(recipients))
	distinct := recipients[:0:0]
	for _, r := range recipients {
		if r == "" || strings.IndexByte(r, 0) >= 0 {
			return nil, fmt.Errorf("recipient %q is not an agent name: %w", r, ErrInvalid)
		}
		if _, dup := seen[r]; !dup {
			seen[r] = struct{}{}
			distinct = append(distinct, r)
		}
	}
	if len(distinct) == 0 {
		return nil, nil
	}
	if msg.Time.IsZero() {
		msg.Time = m.opts.Now()
	}
	delivered, refused, err := m.store.AppendMessage(ctx, msg, distinct, m.opts.Bound)
	if err != nil {
		return nil, err
	}
	m.wake(delivered)
	return refused, nil
}

func validate(msg Message) error {
	var missing []string
	for _, f := range []struct{ name, v string }{
		{"id", msg.ID}, {"dialogue id", msg.DialogueID}, {"category", string(msg.Category)}, {"type", msg.Type},
	} {
		if f.v == "" {
			missing = append(missing, f.name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("message has no %s: %w", strings.Join(missing, ", "), ErrInvalid)
	}
	return nil
}

// Bound returns each agent's size bound, for writers that append through
// the store in a transaction of their own (dialogue records).
func (m *Mailboxes) Bound() Bound { return m.opts.Bound }

// Delivered tells the connected recipients of deliveries that another
// writer appended through the store (a dialogue record's transaction).
func (m *Mailboxes) Delivered(ds []Delivery) { m.wake(ds) }

// wake tells the connected recipients that their mailbox grew.
func (m *Mailboxes) wake(delivered []Delivery) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.conns) == 0 {
		return
	}
	for _, d := range delivered {
		if c := m.conns[d.Agent]; c != nil {
			c.offer(d)
		}
	}
}

// Nudge wakes the connections of agents (every connection when agents is
// nil) to read their mailbox from the store: another replica appended to
// it. Agents not connected here are ignored.
func (m *Mailboxes) Nudge(agents []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if agents == nil {
		for _, c := range m.conns {
			c.poke()
		}
		return
	}
	for _, a := range agents {
		if c := m.conns[a]; c != nil {
			c.poke()
		}
	}
}

// Read returns up to limit messages of agent after cursor after.
func (m *Mailboxes) Read(ctx context.Context, agent string, after uint64, limit int) ([]Delivery, error) {
	return m.store.ReadMailbox(ctx, agent, after, limit)
}

// Acknowledge moves agent's acknowledged cursor forward to cursor.
func (m *Mailboxes) Acknowledge(ctx context.Context, agent string, cursor uint64) (State, error) {
	return m.store.AcknowledgeMailbox(ctx, agent, cursor)
}

// ClearBacklog acknowledges everything in agent's mailbox.
func (m *Mailboxes) ClearBacklog(ctx context.Context, agent string) (State, error) {
	return m.store.ClearMailbox(ctx, agent)
}

// State returns agent's mailbox state.
func (m *Mailboxes) State(ctx context.Context, agent string) (State, error) {
	return m.store.GetMailbox(ctx, agent)
}

// Compact deletes the acknowledged messages older than the retention, in
// transactions of at most batch references, and returns how many it
// deleted.
func (m *Mailboxes) Compact(ctx context.Context, batch int) (int, error) {
	if batch <= 0 {
		batch = 1000
	}
	before := m.opts.Now().Add(-m.opts.Retention)
	total := 0
	for {
		n, err := m.store.CompactMailboxes(ctx, before, batch)
		total += n
		if err != nil || n < batch {
			return total, err
		}
	}
}

// maxHanded bounds the deliveries Append hands a connection directly;
// past it the connection reads its mailbox from the store instead.
const maxHanded = 64

// Conn is an agent's connection to its mailbox. A newer connection of the
// same agent, on any replica, replaces it.
type Conn struct {
	m        *Mailboxes
	agent    string
	epoch    uint64        // the stream's place in the agent's order
	wake     chan struct{} // one pending wakeup at most
	replaced chan struct{} // closed when a newer connection took over

	// Append hands new deliveries over with the wakeup, so that a fan-out
	// to many connected agents costs no store read each; the store stays
	// the truth whenever these do not continue the stream exactly.
	mu       sync.Mutex // guards handed and overflow
	handed   []Delivery
	overflow bool // deliveries were not handed: read the store
}

// offer hands d to the connection and wakes it.
func (c *Conn) offer(d Delivery) {
	c.mu.Lock()
	if len(c.handed) < maxHanded {
		c.handed = append(c.handed, d)
	} else {
		c.overflow = true
	}
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default: // a wakeup is already pending
	}
}

// poke wakes the connection to read the store: what was handed to it may
// not continue the stream (another replica appended in between).
func (c *Conn) poke() {
	c.mu.Lock()
	c.overflow = true
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// takeHanded returns the deliveries handed over after cursor next, if they
// continue it without a gap; ok is false when the store must be read.
func (c *Conn) takeHanded(next uint64) (ds []Delivery, ok bool) {
	c.mu.Lock()
	ds, overflow := c.handed, c.overflow
	c.handed, c.overflow = nil, false
	c.mu.Unlock()
	for len(ds) > 0 && ds[0].Cursor <= next {
		ds = ds[1:] // already sent from the store
	}
	if overflow || len(ds) == 0 {
		return nil, false
	}
	for i, d := range ds {
		if d.Cursor != next+1+uint64(i) {
			return nil, false // concurrent appends woke out of order
		}
	}
	return ds, true
}

// open returns the agent's new connection, registered in place of (and
// ending) any older one; a connection older than one registered here or
// named by Supersede while it was being opened is replaced at once. The
// caller must close it.
func (m *Mailboxes) open(ctx context.Context, agent string) (*Conn, error) {
	if m.opts.Streams == nil {
		m.mu.Lock()
		m.epoch++
		epoch := m.epoch
		m.mu.Unlock()
		return m.connect(agent, epoch, nil), nil
	}
	m.mu.Lock()
	o := m.opening[agent]
	if o == nil {
		o = &opening{}
		m.opening[agent] = o
	}
	o.n++
	m.mu.Unlock()
	epoch, err := m.opts.Streams.OpenStream(ctx, agent)
	if err != nil {
		m.mu.Lock()
		m.opened(agent, o)
		m.mu.Unlock()
		return nil, err
	}
	return m.connect(agent, epoch, o), nil
}

// opened ends one of agent's openings (o); m.mu is held.
func (m *Mailboxes) opened(agent string, o *opening) {
	if o.n--; o.n == 0 {
		delete(m.opening, agent)
		m.went()
	}
}

// went tells EndStreams that a connection or an opening went; m.mu is
// held.
func (m *Mailboxes) went() {
	select {
	case m.left <- struct{}{}:
	default:
	}
}

// connect registers the agent's connection of epoch, replacing (and
// ending) any older one; a connection older than the one registered, or
// than o.newest, is replaced at once.
func (m *Mailboxes) connect(agent string, epoch uint64, o *opening) *Conn {
	c := &Conn{m: m, agent: agent, epoch: epoch, wake: make(chan struct{}, 1), replaced: make(chan struct{})}
	m.mu.Lock()
	defer m.mu.Unlock()
	if o != nil {
		m.opened(agent, o)
		if o.newest > epoch {
			close(c.replaced)
			return c
		}
	}
	if old := m.conns[agent]; old != nil {
		if old.epoch > epoch {
			close(c.replaced)
			return c
		}
		close(old.replaced)
	}
	m.conns[agent] = c
	return c
}

// Supersede ends the connection of agent here if it is older than epoch:
// a stream of agent opened on another replica. A stream of agent being
// opened here ends as it connects if its epoch is older. Other agents are
// ignored.
func (m *Mailboxes) Supersede(agent string, epoch uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if o := m.opening[agent]; o != nil {
		o.newest = max(o.newest, epoch)
	}
	if c := m.conns[agent]; c != nil && c.epoch < epoch {
		close(c.replaced)
		delete(m.conns, agent)
		m.went()
	}
}

// Recheck ends the connections here that the store no longer names, for
// a replica that missed notifications: checked is StreamEpochs as taken
// before the store was read, newest each agent's stream in the store
// then. A connection ends (ErrReplaced, as a takeover ends it) when a
// newer stream replaced it (Supersede), or when its agent's row is gone
// or names another stream: a newer stream opened elsewhere and, by the
// time the store was read, ended too (its end deleted the row). A
// connection's own row is written before it connects and deleted only
// after it left, by its replica's sweep of rows unstamped for minutes, or
// by another stream's end; so a live connection still listed in checked
// is never ended for a row of its own. One that connected after checked
// was taken is left alone.
func (m *Mailboxes) Recheck(checked, newest map[string]uint64) {
	for agent, epoch := range newest {
		m.Supersede(agent, epoch)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for agent, epoch := range checked {
		if e, ok := newest[agent]; ok && e == epoch {
			continue
		}
		if c := m.conns[agent]; c != nil && c.epoch == epoch {
			close(c.replaced)
			delete(m.conns, agent)
			m.went()
		}
	}
}

// StreamEpochs returns the epoch of each agent's connection here, for a
// replica that missed notifications to check them (Recheck).
func (m *Mailboxes) StreamEpochs() map[string]uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]uint64, len(m.conns))
	for a, c := range m.conns {
		out[a] = c.epoch
	}
	return out
}

// close unregisters c unless a newer connection already replaced it; with
// Streams it then ends c's stream there too (a replaced one has a newer
// stream to keep): when the server is stopping, through EndStreams, unless
// it returned already. ctx may have ended: the stream ends anyway.
func (c *Conn) close(ctx context.Context, stopping <-chan struct{}) {
	c.m.mu.Lock()
	current := c.m.conns[c.agent] == c
	batched := false
	if current {
		delete(c.m.conns, c.agent)
		c.m.went()
		if c.m.opts.Streams != nil && closed(stopping) && !c.m.ended {
			c.m.stopped = append(c.m.stopped, StreamEnd{Agent: c.agent, Epoch: c.epoch})
			batched = true
		}
	}
	c.m.mu.Unlock()
	if current && !batched && c.m.opts.Streams != nil {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeStreamTimeout)
		defer cancel()
		// A failure leaves the stream's record to the store's sweep.
		_ = c.m.opts.Streams.CloseStream(ctx, c.agent, c.epoch)
	}
}

// closed reports whether ch is closed; a nil ch never is.
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// EndStreams closes in Streams, in batches, the streams that end because
// the server stops (ReceiveOptions.Stop closed): it waits until no
// connection is left here and all of them are closed, or until ctx ends.
// The server calls it once, when it starts stopping; a stream that ends
// after it returned is closed on its own again, and one it could not
// close is left to the store's sweep.
func (m *Mailboxes) EndStreams(ctx context.Context) error {
	defer func() {
		m.mu.Lock()
		m.ended, m.stopped = true, nil
		m.mu.Unlock()
	}()
	if m.opts.Streams == nil {
		return nil
	}
	for {
		m.mu.Lock()
		ended := m.stopped
		m.stopped = nil
		idle := len(m.conns) == 0 && len(m.opening) == 0
		if idle && len(ended) == 0 {
			m.ended = true // in the same hold: no stream ends unclosed
			m.mu.Unlock()
			return nil
		}
		m.mu.Unlock()
		if len(ended) > 0 {
			if err := m.opts.Streams.CloseStreams(ctx, ended); err != nil {
				return err
			}
			continue
		}
		select {
		case <-m.left:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Connected reports how many agents have a connection.
func (m *Mailboxes) Connected() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.conns)
}

// ReceiveOptions say where a Receive starts and how it paces itself.
type ReceiveOptions struct {
	// After is the cursor the agent has already seen; delivery starts
	// after it or after the acknowledged cursor, whichever is later.
	After uint64
	// ClearBacklog acknowledges the whole mailbox first, so that only
	// messages appended from now on are delivered.
	ClearBacklog bool
	// Batch is the most messages one send carries; must be positive
	// (--mailbox-stream-batch).
	Batch int
	// Keepalive is how long the stream may stay silent before an empty
	// batch is sent, so that proxies and clients see it alive; must be
	// positive (--mailbox-stream-keepalive).
	Keepalive time.Duration
	// Stop ends the Receive with ErrStopping when it closes (server
	// shutdown).
	Stop <-chan struct{}
}

// Receive connects agent and sends its mailbox through send, in cursor
// order, batch by batch, waiting for new messages without polling. An
// empty batch, sent first and after Keepalive of silence, is a keepalive. It returns ErrReplaced when the agent
// connects again (here, or on another replica with opts.Streams),
// ErrStopping when opts.Stop closes, ctx's error when ctx
// ends, or send's error.
func (m *Mailboxes) Receive(ctx context.Context, agent string, opts ReceiveOptions, send func([]Delivery) error) error {
	var (
		st  State
		err error
	)
	if opts.ClearBacklog {
		st, err = m.ClearBacklog(ctx, agent)
	} else {
		st, err = m.State(ctx, agent)
	}
	if err != nil {
		return err
	}
	// Connected after the clear, so that what is appended once Connected
	// counts the connection is never cleared; a message appended between
	// the two is found by the first read.
	conn, err := m.open(ctx, agent)
	if err != nil {
		return err
	}
	defer conn.close(ctx, opts.Stop)
	next := max(opts.After, st.Acked)
	// An empty batch first tells the client the stream is established,
	// whether or not messages wait.
	if err := send(nil); err != nil {
		return err
	}
	keepalive := time.NewTimer(opts.Keepalive)
	defer keepalive.Stop()
	read := true // whether to read the store before waiting
	for {
		// A replaced connection stops before reading, so two never
		// interleave sends for long.
		select {
		case <-conn.replaced:
			return ErrReplaced
		default:
		}
		if read {
			batch, err := m.store.ReadMailbox(ctx, agent, next, opts.Batch)
			if err != nil {
				return err
			}
			if len(batch) > 0 {
				if err := send(batch); err != nil {
					return err
				}
				next = batch[len(batch)-1].Cursor
				keepalive.Reset(opts.Keepalive)
				if len(batch) == opts.Batch {
					continue // more may be waiting
				}
			}
		}
		read = true
		select {
		case <-conn.wake:
			if ds, ok := conn.takeHanded(next); ok && len(ds) <= opts.Batch {
				if err := send(ds); err != nil {
					return err
				}
				next = ds[len(ds)-1].Cursor
				keepalive.Reset(opts.Keepalive)
				read = false
			}
		case <-conn.replaced:
			return ErrReplaced
		case <-opts.Stop:
			return ErrStopping
		case <-ctx.Done():
			return ctx.Err()
		case <-keepalive.C:
			if err := send(nil); err != nil {
				return err
			}
			keepalive.Reset(opts.Keepalive)
		}
	}
}
