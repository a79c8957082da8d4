// Package deadline fires the network's protocol deadlines: durable timers
// for the deadlines a state machine sets on a (dialogue, counterpart) pair
// (offer_timeout, proposal_timeout, ...), owned by the server.
//
// When a message sets a deadline, its pair's new state lists it (see
// protocolcontrol); the dialogue write that stores that state stores a
// timer for each of its pending deadlines in the same transaction
// (store.PairState.Timers), and Wake tells Run. Arm stores them apart
// (tests and tools). Run fires timers as they fall due, and again after a
// restart for those that fell due while the server was down. A timer that expires its
// pair is first told to Options.Expired (the pair's order records the
// expiry; idempotent, so a crash before the firing commits only repeats
// it). Due timers then fire in batches (Options.Batch), each batch one
// store transaction (store.TimerStore.FireTimers) that, for every timer in
// it:
//
//  1. asks the pair's machine whether the deadline expires (Machine.Expire:
//     a deadline already met, replaced, or whose pair has ended does not);
//  2. if it does, appends an explicit "<name>_expired" message (category
//     service, from the network) to both agents' mailboxes;
//  3. deletes the timer.
//
// The pair's stored state is not rewritten: the pending deadline it holds
// ended the pair at its instant, as protocolcontrol reads it (Check refuses
// later messages naming it, InspectAt reports the pair ended), so the
// state machine moved at the deadline, not when the timer got round to
// it. A timer fires once: its message and its deletion are one commit,
// and one commit serves the whole batch, so a backlog after a restart
// drains at many expiries per fsync. The message's id is derived
// from the timer, so it could not be appended twice even by a second
// firing. A message sent after the deadline is refused by the state machine
// itself (DEADLINE_PASSED for the types it guards, PAIR_ENDED naming it for
// the others), whether or not the timer has fired yet.
package deadline

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
	"github.com/parleyhq/parley/services/dispatcher/internal/protocolcontrol"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

// Machines returns the compiled state machine of a PD.
type Machines interface {
	Machine(ctx context.Context, hash string) (*protocolcontrol.Machine, error)
}

// Mailboxes is what firing needs of the mailboxes: their size bound (the
// expiry message is appended in the store transaction that moves the
// pair), and waking the readers of mailboxes it appended to.
type Mailboxes interface {
	Bound() mailbox.Bound
	Delivered(ds []mailbox.Delivery)
}

// Options configures a Scheduler. Zero values take the defaults noted.
type Options struct {
	// Now is the clock; time.Now when nil.
	Now func() time.Time
	// After waits like time.After; the test seam for Run. time.After when
	// nil.
	After func(time.Duration) <-chan time.Time
	// Logger reports timers that could not fire; discarded when nil.
	Logger *slog.Logger
	// Batch is how many due timers fire in one store transaction; 2048
	// when 0. With 100,000 deadlines due after a restart, 2048 drained
	// them in about half the time of 256 and cut the p99 lateness of
	// those falling due over the next 10 s about 3× (docs/benchmarks.md);
	// a batch holds the store's writer for its commit (about 45 µs of CPU
	// per expiry), which other writes wait out.
	Batch int
	// Idle is how long Run sleeps with no timer stored (Arm wakes it
	// sooner); a minute when 0.
	Idle time.Duration
	// Retry is how long Run waits after the store failed, and how long a
	// timer is put off after its first failure; a second when 0.
	Retry time.Duration
	// RetryMax bounds the back-off of a timer that keeps failing (its
	// wait doubles from Retry with each failure); five minutes (or Retry,
	// when longer) when less than Retry.
	RetryMax time.Duration
	// Failures counts the timers that failed to fire (each failure of
	// each timer); none when nil.
	Failures prometheus.Counter
	// Expired, when set, is told of each pair a timer expires (orders
	// record it) before the timer goes: the lapse is a fact from the
	// deadline on and the pair's state cannot move after it, so telling
	// first and firing second loses nothing to a crash between the two. A
	// retry tells it again with the same message id, so it must be
	// idempotent. When it fails, the timer stays stored and fires later.
	Expired func(ctx context.Context, e Expiry) error
}

// Expiry is a pair that a deadline expired.
type Expiry struct {
	Timer      store.Timer
	Prev, Next json.RawMessage // the pair's state before and after
	// Pair is Next, decoded: a hook with nothing to do for most pairs
	// (Pair.Order false: no order formed) need not decode it again.
	Pair      protocolcontrol.Pair
	MessageID string // the expiry message's id
}

// Scheduler arms and fires deadlines.
type Scheduler struct {
	store    store.TimerStore
	machines Machines
	mail     Mailboxes
	opts     Options
	wake     chan struct{} // capacity 1: a pending nudge for Run

	mu sync.Mutex // FireDue runs one at a time
}

// New returns a Scheduler keeping timers in st, expiring pairs with the
// machines of m and telling both agents through mail.
func New(st store.TimerStore, m Machines, mail Mailboxes, opts Options) *Scheduler {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.After == nil {
		opts.After = time.After
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Batch <= 0 {
		opts.Batch = 2048
	}
	if opts.Idle <= 0 {
		opts.Idle = time.Minute
	}
	if opts.Retry <= 0 {
		opts.Retry = time.Second
	}
	if opts.RetryMax < opts.Retry {
		opts.RetryMax = max(5*time.Minute, opts.Retry)
	}
	return &Scheduler{store: st, machines: m, mail: mail, opts: opts, wake: make(chan struct{}, 1)}
}

// Pair names a (dialogue, counterpart) pair whose state was just written.
type Pair struct {
	Dialogue    string
	Initiator   string
	Counterpart string
	Protocol    string // the PD's SHA-1
}

// Arm stores a timer for every pending deadline of the pair's state (as
// protocolcontrol wrote it) and wakes Run. Arming a deadline again is
// harmless; one the state no longer lists fires as a no-op.
func (s *Scheduler) Arm(ctx context.Context, p Pair, state json.RawMessage) error {
	ps, err := protocolcontrol.Inspect(state)
	if err != nil {
		return err
	}
	if len(ps.Deadlines) == 0 {
		return nil
	}
	timers := make([]store.Timer, 0, len(ps.Deadlines))
	for _, d := range ps.Deadlines {
		timers = append(timers, store.Timer{
			Dialogue: p.Dialogue, Initiator: p.Initiator, Counterpart: p.Counterpart,
			Protocol: p.Protocol, Name: d.Name, At: d.At,
		})
	}
	if err := s.store.PutTimers(ctx, timers); err != nil {
		return err
	}
	s.Wake()
	return nil
}

// Wake makes Run look for the next timer again: one was set (by Arm, or by
// another replica on the same database).
func (s *Scheduler) Wake() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// FireDue fires every timer due now, a batch per transaction, and returns
// how many expired a pair. A timer that fails (its machine unknown, its
// state corrupt, Options.Expired failing) stays stored, is counted
// (Options.Failures), and is put off in the store (RetryTimers):
// Options.Retry after its first failure, doubling with each failure after
// it up to Options.RetryMax. So timers that keep failing never stand in
// the way of the others, hold no memory, and keep their back-off across a
// restart. FireDue goes on with the others and returns the first error.
func (s *Scheduler) FireDue(ctx context.Context) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.opts.Now()
	due, err := s.store.DueTimers(ctx, now, s.opts.Batch)
	if err != nil || len(due) == 0 {
		return 0, err
	}
	var (
		expired  int
		firstErr error
		b        = s.prepare(ctx, due, now)
	)
	for {
		// While this batch commits (the store's single writer, most of an
		// expiry's CPU), the next is listed and its hook told, on another
		// core when there is one. It is listed after this batch's last
		// timer (DueTimersAfter), whether this batch has committed yet or
		// not: listed again, this batch's timers would not fire twice
		// (FireTimers passes over a timer gone) but would be told of again.
		// A timer put off is moved only after this batch commits, and one
		// that comes due meanwhile before the last (set by a message) is
		// left to the next FireDue (Arm and Wake call Run to it).
		var (
			next    *batch
			nextErr error
			fired   = make(chan struct{})
			n       int
			failed  []store.Timer
			err     error
		)
		go func() {
			defer close(fired)
			n, failed, err = s.commit(ctx, b, now)
		}()
		if len(b.due) == s.opts.Batch {
			var more []store.Timer
			if more, nextErr = s.store.DueTimersAfter(ctx, now, b.due[len(b.due)-1], s.opts.Batch); len(more) > 0 {
				next = s.prepare(ctx, more, now)
			}
		}
		<-fired
		expired += n
		firstErr = cmpErr(firstErr, err)
		if failed == nil && err != nil {
			// The store failed the whole batch: Run retries it.
			return expired, firstErr
		}
		if len(failed) > 0 {
			// Put off, they are not listed again by the next round.
			if err := s.retry(ctx, failed, now); err != nil {
				return expired, cmpErr(firstErr, err)
			}
		}
		if next == nil {
			return expired, cmpErr(firstErr, nextErr)
		}
		b = next
	}
}

// retry puts off the failed timers: the wait doubles from Options.Retry
// with each earlier failure, up to Options.RetryMax.
func (s *Scheduler) retry(ctx context.Context, failed []store.Timer, now time.Time) error {
	rs := make([]store.TimerRetry, 0, len(failed))
	for _, t := range failed {
		wait := s.opts.Retry
		for i := 0; i < t.Failures && wait < s.opts.RetryMax; i++ {
			wait *= 2
		}
		rs = append(rs, store.TimerRetry{Timer: t, Retry: now.Add(min(wait, s.opts.RetryMax))})
	}
	if s.opts.Failures != nil {
		s.opts.Failures.Add(float64(len(failed)))
	}
	return s.store.RetryTimers(ctx, rs)
}

// next is when Run should look again: when the first timer is due (a
// failing timer's retry included).
func (s *Scheduler) next(ctx context.Context) (time.Time, bool, error) {
	t, ok, err := s.store.NextTimer(ctx)
	return t.Due(), ok, err
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// batch is one batch of due timers, prepared to fire: each timer's
// machine found and its hook told (tell), or failed.
type batch struct {
	due      []store.Timer
	machines map[string]*protocolcontrol.Machine
	ready    []store.Timer             // the timers to fire
	found    map[store.Timer]*expiring // what is known of each ready timer
	failed   []store.Timer
	errs     []error
}

// of returns what b knows of t, as listed; the store answers only for the
// timers listed, but a stranger must not panic.
func (b *batch) of(t store.Timer) *expiring {
	e := b.found[t]
	if e == nil {
		e = &expiring{id: ID(t)}
		b.found[t] = e
	}
	return e
}

// prepare finds each due timer's machine and tells the hook of it (tell).
func (s *Scheduler) prepare(ctx context.Context, due []store.Timer, now time.Time) *batch {
	b := &batch{
		due:      due,
		machines: map[string]*protocolcontrol.Machine{},
		ready:    make([]store.Timer, 0, len(due)),
		found:    make(map[store.Timer]*expiring, len(due)),
	}
	all := make([]expiring, len(due))
	for i, t := range due {
		m, ok := b.machines[t.Protocol]
		if !ok {
			var err error
			if m, err = s.machines.Machine(ctx, t.Protocol); err != nil {
				b.errs = append(b.errs, fmt.Errorf("deadline %s of dialogue %s, %s: %w", t.Name, t.Dialogue, t.Counterpart, err))
			}
			b.machines[t.Protocol] = m
		}
		if m == nil {
			if ok {
				b.errs = append(b.errs, fmt.Errorf("deadline %s of dialogue %s, %s: its protocol's machine is unknown", t.Name, t.Dialogue, t.Counterpart))
			}
			b.failed = append(b.failed, t)
			continue
		}
		e := &all[i]
		e.id = ID(t)
		if err := s.tell(ctx, m, t, now, e); err != nil {
			b.errs = append(b.errs, fmt.Errorf("deadline %s of dialogue %s, %s: %w", t.Name, t.Dialogue, t.Counterpart, err))
			b.failed = append(b.failed, t)
			continue
		}
		b.found[t] = e
		b.ready = append(b.ready, t)
	}
	return b
}

// commit fires a prepared batch in one transaction and returns how many
// pairs expired and the timers that failed; none and an error when the
// store failed the whole batch.
func (s *Scheduler) commit(ctx context.Context, b *batch, now time.Time) (expired int, failed []store.Timer, err error) {
	errs, failed := b.errs, b.failed
	// The pair's state is not rewritten: the deadline it holds has ended
	// it at its instant already (protocolcontrol reads a passed deadline
	// so), and a rewrite would cost a page of a large tree per expiry.
	done, err := s.store.FireTimers(ctx, b.ready, s.mail.Bound(), func(t store.Timer, state json.RawMessage) (store.TimerFiring, error) {
		e := b.of(t)
		var (
			p  protocolcontrol.Pair
			ok bool
		)
		if e.state != nil && bytes.Equal(e.state, state) {
			p, ok = e.res.Pair, e.fired // as tell found it: decoded once
		} else {
			res, fired, err := b.machines[t.Protocol].Expire(state, t.Name, now)
			if err != nil {
				return store.TimerFiring{}, err
			}
			p, ok = res.Pair, fired
		}
		if !ok {
			return store.TimerFiring{}, nil
		}
		e.expires = true
		return store.TimerFiring{Mail: message(t, p, e.id), Recipients: []string{t.Initiator, t.Counterpart}}, nil
	})
	if done == nil && err != nil {
		return 0, nil, errors.Join(append(errs, err)...)
	}
	errs = append(errs, err)
	deliveries := make([]mailbox.Delivery, 0, 2*len(done))
	for _, f := range done {
		deliveries = append(deliveries, f.Delivered.Deliveries...)
		for _, r := range f.Delivered.Refused {
			s.opts.Logger.WarnContext(ctx, "an expiry message was not delivered; the pair expired all the same",
				slog.String("agent", r.Agent), slog.String("dialogue", f.Timer.Dialogue), slog.Any("err", r.Err))
		}
	}
	s.mail.Delivered(deliveries)
	for _, f := range done {
		e := b.of(f.Timer)
		e.went = true
		if e.expires {
			expired++
		}
	}
	if err != nil {
		// Its expire failed, or it was passed over (gone already:
		// RetryTimers passes over it too).
		for _, t := range b.ready {
			if !b.of(t).went {
				failed = append(failed, t)
			}
		}
	}
	if failed == nil {
		failed = []store.Timer{} // not the whole batch failing
	}
	return expired, failed, errors.Join(errs...)
}

// expiring is what a batch knows of a timer ready to fire: its expiry
// message's id, what tell found of its pair (its state and what expiring
// it does), and what its firing did.
type expiring struct {
	id    string
	state json.RawMessage // nil when tell read nothing
	res   protocolcontrol.Result
	fired bool
	// expires: the firing expired the pair; went: the firing committed.
	expires, went bool
}

// tell tells Options.Expired of t's expiry, when t expires its pair, and
// records in e what it found (nothing without Options.Expired), so that
// the firing need not decode the same state again.
func (s *Scheduler) tell(ctx context.Context, m *protocolcontrol.Machine, t store.Timer, now time.Time, e *expiring) error {
	if s.opts.Expired == nil {
		return nil
	}
	state, err := s.store.PairState(ctx, t.Dialogue, store.Pair{A: t.Initiator, B: t.Counterpart})
	if err != nil || state == nil {
		return err
	}
	res, ok, err := m.Expire(state, t.Name, now)
	if err != nil {
		return err
	}
	e.state, e.res, e.fired = state, res, ok
	if !ok {
		return nil
	}
	return s.opts.Expired(ctx, Expiry{Timer: t, Prev: state, Next: res.State, Pair: res.Pair, MessageID: e.id})
}

// Message is the message both agents of a pair get when its deadline
// expires: type "<name>_expired", category service, from the network. Its
// id is derived from the timer, so appending it twice is refused.
func Message(t store.Timer, p protocolcontrol.Pair) mailbox.Message { return message(t, p, ID(t)) }

// message is Message with its id, ID(t), given.
func message(t store.Timer, p protocolcontrol.Pair, id string) mailbox.Message {
	return mailbox.Message{
		ID: id, DialogueID: t.Dialogue, Category: mailbox.CategoryService, Type: t.Name + "_expired",
		Protocol: t.Protocol, Body: expiryBody{
			Counterpart: t.Counterpart, Deadline: t.Name, DeadlineTime: t.At.UTC().Format(time.RFC3339),
			Initiator: t.Initiator, Outcome: string(p.Outcome), State: p.State,
		}.json(), Time: t.At.UTC(),
	}
}

// expiryBody is an expiry message's body.
type expiryBody struct {
	Counterpart  string `json:"counterpart"`
	Deadline     string `json:"deadline"`
	DeadlineTime string `json:"deadlineTime"`
	Initiator    string `json:"initiator"`
	Outcome      string `json:"outcome"`
	State        string `json:"state"`
}

// json is b as encoding/json writes it (its fields in name order, the
// order a map marshalled in before). Written by hand when no string needs
// escaping, as none does in practice (agent names, deadline and type
// names, a time): encoding/json took about 2 µs, once per expiry.
func (b expiryBody) json() []byte {
	fields := [...]struct{ name, v string }{
		{"counterpart", b.Counterpart}, {"deadline", b.Deadline}, {"deadlineTime", b.DeadlineTime},
		{"initiator", b.Initiator}, {"outcome", b.Outcome}, {"state", b.State},
	}
	n := 2
	for _, f := range fields {
		if !plainJSON(f.v) {
			out, _ := json.Marshal(b) // strings only: cannot fail
			return out
		}
		n += len(f.name) + len(f.v) + 6
	}
	out := make([]byte, 0, n)
	for i, f := range fields {
		sep := byte(',')
		if i == 0 {
			sep = '{'
		}
		out = append(out, sep, '"')
		out = append(out, f.name...)
		out = append(out, `":"`...)
		out = append(out, f.v...)
		out = append(out, '"')
	}
	return append(out, '}')
}

// plainJSON reports whether encoding/json writes s as it is, quoted: no
// byte to escape (controls, quote, backslash, the HTML-escaped <, > and
// &) and nothing but ASCII.
func plainJSON(s string) bool {
	for i := range len(s) {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

// ID is the expiry message's id for t: the deadline's time (8 bytes of
// Unix nanoseconds), then 64 bits of SHA-256 over the timer, unguessable
// as the dialogue id it covers is; 32 hex digits, like dialogue.NewID
// (never a leading "-"). The time comes first so that a batch of expiries
// stores its messages side by side, not one page each.
func ID(t store.Timer) string {
	at := t.At.UTC()
	in := make([]byte, 0, 64+len(t.Dialogue)+len(t.Counterpart)+len(t.Name))
	for _, s := range []string{"expiry", t.Dialogue, t.Counterpart, t.Name} {
		in = append(in, s...)
		in = append(in, 0)
	}
	in = append(at.AppendFormat(in, time.RFC3339Nano), 0)
	sum := sha256.Sum256(in)
	var id [16]byte
	binary.BigEndian.PutUint64(id[:], uint64(at.UnixNano())) //nolint:gosec // deadlines fall after 1970
	copy(id[8:], sum[:8])
	return hex.EncodeToString(id[:])
}

// Run fires timers as they fall due until ctx ends: at once for those due
// (after a restart, every timer that fell due meanwhile), then at the next
// timer's time or when Arm adds one.
func (s *Scheduler) Run(ctx context.Context) {
	for {
		wait := s.opts.Idle
		if _, err := s.FireDue(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			s.opts.Logger.WarnContext(ctx, "deadlines could not fire; retrying", slog.Any("err", err), slog.String("retry_in", s.opts.Retry.String()))
			wait = s.opts.Retry
		} else if next, ok, err := s.next(ctx); err == nil && ok {
			wait = max(next.Sub(s.opts.Now()), 0)
		}
		select {
		case <-ctx.Done():
			return
		case <-s.wake:
		case <-s.opts.After(wait):
		}
	}
}
