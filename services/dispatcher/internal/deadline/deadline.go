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
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
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
	// a batch holds the store's writer for its commit (about 60 µs of CPU
	// per expiry), which other writes wait out.
	Batch int
	// Idle is how long Run sleeps with no timer stored (Arm wakes it
	// sooner); a minute when 0.
	Idle time.Duration
	// Retry is how long Run waits after a timer failed to fire, and how
	// long FireDue passes over a timer after its first failure; a second
	// when 0.
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
	MessageID  string          // the expiry message's id
}

// Scheduler arms and fires deadlines.
type Scheduler struct {
	store    store.TimerStore
	machines Machines
	mail     Mailboxes
	opts     Options
	wake     chan struct{} // capacity 1: a pending nudge for Run

	mu   sync.Mutex // FireDue runs one at a time
	held map[timerKey]held
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
	return &Scheduler{store: st, machines: m, mail: mail, opts: opts, wake: make(chan struct{}, 1), held: map[timerKey]held{}}
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
// (Options.Failures), and is held back: FireDue passes over it until its
// retry time, Options.Retry after the first failure, doubling with each
// failure after it up to Options.RetryMax. So timers that keep failing
// never stand in the way of the others. FireDue goes on with the others
// and returns the first error.
func (s *Scheduler) FireDue(ctx context.Context) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.opts.Now()
	var (
		expired  int
		firstErr error
	)
	for {
		// Held timers come back in the listing: ask for that many more.
		limit := s.opts.Batch + len(s.held)
		due, err := s.store.DueTimers(ctx, now, limit)
		if err != nil {
			return expired, err
		}
		listed := make(map[timerKey]bool, len(due))
		batch := make([]store.Timer, 0, min(len(due), s.opts.Batch))
		for _, t := range due {
			k := keyOf(t)
			listed[k] = true
			if h, ok := s.held[k]; ok && now.Before(h.until) {
				continue
			}
			if len(batch) < s.opts.Batch {
				batch = append(batch, t)
			}
		}
		if len(due) < limit {
			// Every due timer was listed: forget held ones gone since
			// (fired by another replica, replaced, their pair ended).
			for k := range s.held {
				if !listed[k] && k.at <= now.UnixNano() {
					delete(s.held, k)
				}
			}
		}
		if len(batch) == 0 {
			return expired, firstErr
		}
		n, failed, err := s.fire(ctx, batch, now)
		expired += n
		firstErr = cmpErr(firstErr, err)
		if failed == nil && err != nil {
			// The store failed the whole batch: Run retries it.
			return expired, firstErr
		}
		s.hold(batch, failed, now)
		if len(due) < limit {
			return expired, firstErr
		}
	}
}

// timerKey identifies a stored timer, its time included (a deadline set
// again is another timer).
type timerKey struct {
	dialogue, counterpart, name string
	at                          int64
}

func keyOf(t store.Timer) timerKey {
	return timerKey{t.Dialogue, t.Counterpart, t.Name, t.At.UnixNano()}
}

// held is a failing timer's back-off.
type held struct {
	until time.Time     // FireDue passes it over until then
	wait  time.Duration // the last back-off
}

// hold backs off the failed timers of batch and forgets the others.
func (s *Scheduler) hold(batch, failed []store.Timer, now time.Time) {
	prev := make(map[timerKey]held, len(failed))
	for _, t := range failed {
		prev[keyOf(t)] = s.held[keyOf(t)]
	}
	for _, t := range batch {
		delete(s.held, keyOf(t))
	}
	for _, t := range failed {
		h := prev[keyOf(t)]
		h.wait = min(max(2*h.wait, s.opts.Retry), s.opts.RetryMax)
		h.until = now.Add(h.wait)
		s.held[keyOf(t)] = h
	}
	if s.opts.Failures != nil {
		s.opts.Failures.Add(float64(len(failed)))
	}
}

// next is when Run should look again: the first timer's time, or with
// timers held back, the earliest of the first timer not held and the first
// retry.
func (s *Scheduler) next(ctx context.Context) (time.Time, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.held) == 0 {
		t, ok, err := s.store.NextTimer(ctx)
		return t.At, ok, err
	}
	var (
		at time.Time
		ok bool
	)
	for _, h := range s.held {
		if !ok || h.until.Before(at) {
			at, ok = h.until, true
		}
	}
	ts, err := s.store.DueTimers(ctx, time.Unix(0, math.MaxInt64), len(s.held)+1)
	if err != nil {
		return at, ok, err
	}
	for _, t := range ts {
		if _, h := s.held[keyOf(t)]; h {
			continue
		}
		if !ok || t.At.Before(at) {
			at, ok = t.At, true
		}
		break
	}
	return at, ok, nil
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// fire fires one batch in one transaction and returns how many pairs
// expired and the timers that failed; none and an error when the store
// failed the whole batch.
func (s *Scheduler) fire(ctx context.Context, due []store.Timer, now time.Time) (expired int, failed []store.Timer, err error) {
	var (
		errs     []error
		machines = map[string]*protocolcontrol.Machine{}
		ready    = make([]store.Timer, 0, len(due))
	)
	for _, t := range due {
		m, ok := machines[t.Protocol]
		if !ok {
			var err error
			if m, err = s.machines.Machine(ctx, t.Protocol); err != nil {
				errs = append(errs, fmt.Errorf("deadline %s of dialogue %s, %s: %w", t.Name, t.Dialogue, t.Counterpart, err))
			}
			machines[t.Protocol] = m
		}
		if m == nil {
			if ok {
				errs = append(errs, fmt.Errorf("deadline %s of dialogue %s, %s: its protocol's machine is unknown", t.Name, t.Dialogue, t.Counterpart))
			}
			failed = append(failed, t)
			continue
		}
		if err := s.tell(ctx, m, t, now); err != nil {
			errs = append(errs, fmt.Errorf("deadline %s of dialogue %s, %s: %w", t.Name, t.Dialogue, t.Counterpart, err))
			failed = append(failed, t)
			continue
		}
		ready = append(ready, t)
	}
	// The pair's state is not rewritten: the deadline it holds has ended
	// it at its instant already (protocolcontrol reads a passed deadline
	// so), and a rewrite would cost a page of a large tree per expiry.
	expires := make(map[store.Timer]bool, len(ready))
	done, err := s.store.FireTimers(ctx, ready, s.mail.Bound(), func(t store.Timer, state json.RawMessage) (store.TimerFiring, error) {
		res, ok, err := machines[t.Protocol].Expire(state, t.Name, now)
		if err != nil || !ok {
			return store.TimerFiring{}, err
		}
		expires[t] = true
		return store.TimerFiring{Mail: Message(t, res.Pair), Recipients: []string{t.Initiator, t.Counterpart}}, nil
	})
	if done == nil && err != nil {
		return 0, nil, errors.Join(append(errs, err)...)
	}
	errs = append(errs, err)
	var deliveries []mailbox.Delivery
	for _, f := range done {
		deliveries = append(deliveries, f.Delivered.Deliveries...)
		for _, r := range f.Delivered.Refused {
			s.opts.Logger.WarnContext(ctx, "an expiry message was not delivered; the pair expired all the same",
				slog.String("agent", r.Agent), slog.String("dialogue", f.Timer.Dialogue), slog.Any("err", r.Err))
		}
	}
	s.mail.Delivered(deliveries)
	went := make(map[timerKey]bool, len(done))
	for _, f := range done {
		went[keyOf(f.Timer)] = true
		if expires[f.Timer] {
			expired++
		}
	}
	if err != nil {
		// Its expire failed, or it was passed over (gone already, which
		// the next listing tells).
		for _, t := range ready {
			if !went[keyOf(t)] {
				failed = append(failed, t)
			}
		}
	}
	if failed == nil {
		failed = []store.Timer{} // not the whole batch failing
	}
	return expired, failed, errors.Join(errs...)
}

// tell tells Options.Expired of t's expiry, when t expires its pair.
func (s *Scheduler) tell(ctx context.Context, m *protocolcontrol.Machine, t store.Timer, now time.Time) error {
	if s.opts.Expired == nil {
		return nil
	}
	state, err := s.store.PairState(ctx, t.Dialogue, store.Pair{A: t.Initiator, B: t.Counterpart})
	if err != nil {
		return err
	}
	res, ok, err := m.Expire(state, t.Name, now)
	if err != nil || !ok {
		return err
	}
	return s.opts.Expired(ctx, Expiry{Timer: t, Prev: state, Next: res.State, MessageID: ID(t)})
}

// Message is the message both agents of a pair get when its deadline
// expires: type "<name>_expired", category service, from the network. Its
// id is derived from the timer, so appending it twice is refused.
func Message(t store.Timer, p protocolcontrol.Pair) mailbox.Message {
	body, _ := json.Marshal(map[string]any{
		"deadline":     t.Name,
		"deadlineTime": t.At.UTC().Format(time.RFC3339),
		"initiator":    t.Initiator,
		"counterpart":  t.Counterpart,
		"state":        p.State,
		"outcome":      p.Outcome,
	})
	return mailbox.Message{
		ID: ID(t), DialogueID: t.Dialogue, Category: mailbox.CategoryService, Type: t.Name + "_expired",
		Protocol: t.Protocol, Body: body, Time: t.At.UTC(),
	}
}

// ID is the expiry message's id for t: the deadline's time (8 bytes of
// Unix nanoseconds), then 64 bits of SHA-256 over the timer, unguessable
// as the dialogue id it covers is; 32 hex digits, like dialogue.NewID
// (never a leading "-"). The time comes first so that a batch of expiries
// stores its messages side by side, not one page each.
func ID(t store.Timer) string {
	h := sha256.New()
	for _, s := range []string{"expiry", t.Dialogue, t.Counterpart, t.Name, t.At.UTC().Format(time.RFC3339Nano)} {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	id := binary.BigEndian.AppendUint64(nil, uint64(t.At.UnixNano())) //nolint:gosec // deadlines fall after 1970
	return hex.EncodeToString(append(id, h.Sum(nil)[:8]...))
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
