// Package deadline fires the network's protocol deadlines: durable timers
// for the deadlines a state machine sets on a (dialogue, counterpart) pair
// (offer_timeout, proposal_timeout, ...), owned by the server.
//
// When a message sets a deadline, its pair's new state lists it (see
// protocolcontrol); Arm stores a timer for each pending deadline of that
// state. Run fires timers as they fall due, and again after a restart for
// those that fell due while the server was down. Firing a timer:
//
//  1. asks the pair's machine whether the deadline expires (Machine.Expire:
//     a deadline already met, replaced, or whose pair has ended does not);
//  2. if it does, appends an explicit "<name>_expired" message (category
//     service, from the network) to both agents' mailboxes;
//  3. in one transaction, moves the pair's state (ended, failed, naming the
//     deadline) and deletes the timer.
//
// A timer fires once: the state moves and the timer goes in one commit. A
// crash between 2 and 3 makes the next run append the message again; its id
// is derived from the timer, so the mailbox refuses the copy (and an agent
// that somehow got two would drop the second by id). A message sent after
// the deadline is refused by the state machine itself (DEADLINE_PASSED),
// whether or not the timer has fired yet.
package deadline

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
	"github.com/parleyhq/parley/services/dispatcher/internal/protocolcontrol"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

// Machines returns the compiled state machine of a PD.
type Machines interface {
	Machine(ctx context.Context, hash string) (*protocolcontrol.Machine, error)
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
	// Batch is how many due timers one store read returns; 256 when 0.
	Batch int
	// Workers is how many timers of a batch fire at once, so their
	// commits share fsyncs; 32 when 0.
	Workers int
	// Idle is how long Run sleeps with no timer stored (Arm wakes it
	// sooner); a minute when 0.
	Idle time.Duration
	// Retry is how long Run waits after a timer failed to fire; a second
	// when 0.
	Retry time.Duration
	// Expired, when set, is told of each pair a timer expired, after the
	// state moved (orders record it); its error is logged, as the expiry
	// stands.
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
	mail     mailbox.Appender
	opts     Options
	wake     chan struct{} // capacity 1: a pending nudge for Run
}

// New returns a Scheduler keeping timers in st, expiring pairs with the
// machines of m and telling both agents through mail.
func New(st store.TimerStore, m Machines, mail mailbox.Appender, opts Options) *Scheduler {
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
		opts.Batch = 256
	}
	if opts.Workers <= 0 {
		opts.Workers = 32
	}
	if opts.Idle <= 0 {
		opts.Idle = time.Minute
	}
	if opts.Retry <= 0 {
		opts.Retry = time.Second
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

// FireDue fires every timer due now and returns how many expired a pair.
// The timers of a batch fire concurrently (Workers), so their commits share
// fsyncs; timers of one pair are safe together, as each firing re-checks the
// pair's state in its own transaction. A timer that fails stays stored, and
// FireDue goes on with the others and returns the first error.
func (s *Scheduler) FireDue(ctx context.Context) (int, error) {
	now := s.opts.Now()
	var (
		mu       sync.Mutex // guards expired and firstErr
		expired  int
		firstErr error
	)
	for {
		due, err := s.store.DueTimers(ctx, now, s.opts.Batch)
		if err != nil {
			return expired, err
		}
		var (
			wg     sync.WaitGroup
			failed atomic.Int64
			sem    = make(chan struct{}, s.opts.Workers)
		)
		for _, t := range due {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				ok, err := s.fire(ctx, t, now)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err != nil:
					failed.Add(1)
					firstErr = cmpErr(firstErr, fmt.Errorf("deadline %s of dialogue %s, %s: %w", t.Name, t.Dialogue, t.Counterpart, err))
				case ok:
					expired++
				}
			})
		}
		wg.Wait()
		// A batch that was all failures would come back unchanged.
		if len(due) < s.opts.Batch || failed.Load() == int64(len(due)) {
			return expired, firstErr
		}
	}
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

func (s *Scheduler) fire(ctx context.Context, t store.Timer, now time.Time) (bool, error) {
	m, err := s.machines.Machine(ctx, t.Protocol)
	if err != nil {
		return false, err
	}
	pair := store.Pair{A: t.Initiator, B: t.Counterpart}
	state, err := s.store.PairState(ctx, t.Dialogue, pair)
	if err != nil {
		return false, err
	}
	res, fired, err := m.Expire(state, t.Name, now)
	if err != nil {
		return false, err
	}
	if fired {
		refused, err := s.mail.Append(ctx, Message(t, res.Pair), []string{t.Initiator, t.Counterpart})
		switch {
		case errors.Is(err, store.ErrAlreadyExists):
			// Sent before a crash that kept the state from moving.
		case err != nil:
			return false, err
		}
		for _, r := range refused {
			s.opts.Logger.WarnContext(ctx, "an expiry message was not delivered; the pair still expires",
				slog.String("agent", r.Agent), slog.String("dialogue", t.Dialogue), slog.Any("err", r.Err))
		}
	}
	var prev, next json.RawMessage
	moved, err := s.store.FireTimer(ctx, t, func(st json.RawMessage) (json.RawMessage, error) {
		res, fired, err := m.Expire(st, t.Name, now)
		if err != nil || !fired {
			return nil, err
		}
		prev, next = st, res.State
		return res.State, nil
	})
	if err != nil || !moved || next == nil {
		return false, err
	}
	if s.opts.Expired != nil {
		if err := s.opts.Expired(ctx, Expiry{Timer: t, Prev: prev, Next: next, MessageID: ID(t)}); err != nil {
			s.opts.Logger.WarnContext(ctx, "an expiry was not recorded on its order", slog.String("dialogue", t.Dialogue), slog.Any("err", err))
		}
	}
	return true, nil
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

// ID is the expiry message's id for t: 128 bits of SHA-256 over the timer,
// unguessable as the dialogue id it covers is.
func ID(t store.Timer) string {
	h := sha256.New()
	for _, s := range []string{"expiry", t.Dialogue, t.Counterpart, t.Name, t.At.UTC().Format(time.RFC3339Nano)} {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil)[:16]) // hex, like dialogue.NewID: never a leading "-"
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
		} else if next, ok, err := s.store.NextTimer(ctx); err == nil && ok {
			wait = max(next.At.Sub(s.opts.Now()), 0)
		}
		select {
		case <-ctx.Done():
			return
		case <-s.wake:
		case <-s.opts.After(wait):
		}
	}
}
