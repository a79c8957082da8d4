// Package notify relays the registry's network notifications (followed,
// request_to_join_group, invite_to_group, ...) into the recipients'
// mailboxes, in the `notifications` category.
//
// The registry writes each notification to a durable outbox in the
// transaction of the change it reports, and never calls the dispatcher;
// the relay long-polls ListNotifications after its cursor, appends each
// notification to its recipient's mailbox, and only then, on its next
// poll, tells the registry to trim through that cursor. The trim point is
// therefore the relay's durable cursor: after a restart the relay reads
// the outbox from its oldest entry, which is at most the last batch it
// appended before stopping. Re-appending one of those finds its message
// id taken (a notification's id is its message id) and counts as done, so
// a restart neither loses nor duplicates a notification.
//
// A notification its recipient's mailbox refused (full), or whose append
// failed, is retried with backoff (Backoff, doubled up to MaxBackoff) for
// RetryFor, while the notifications after it go on. It waits in the
// dispatcher's Store, with its schedule (first failure, next attempt,
// backoff), written before the cursor moves past it: the registry may
// then trim it, and a restarted relay (after a crash too) resumes it where
// it was, RetryFor still counted from its first failure. One given up is
// logged and counted (outcome "dropped"), never dropped silently. At most
// maxRetries wait at once; past that the relay reads nothing new until
// they drain.
package notify

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/resource"
	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
)

// Source is the registry's notification outbox (its ListNotifications;
// internal/server adapts the gRPC client).
type Source interface {
	// Notifications returns at most limit notifications with a sequence
	// above after, waiting up to wait for one, after dropping those
	// through trimThrough; and the oldest sequence the outbox keeps.
	Notifications(ctx context.Context, after, trimThrough uint64, limit int, wait time.Duration) (notes []*registryv1.Notification, first uint64, err error)
}

// Store keeps the notifications waiting for a retry (the dispatcher's
// database: boltstore, pgstore).
type Store interface {
	// PutNotificationRetry stores w, replacing the one of its sequence.
	PutNotificationRetry(ctx context.Context, w Waiting) error
	// DeleteNotificationRetry removes the one of sequence seq, if any.
	DeleteNotificationRetry(ctx context.Context, seq uint64) error
	// NotificationRetries returns every waiting notification, in sequence
	// order.
	NotificationRetries(ctx context.Context) ([]Waiting, error)
}

// Waiting is a notification waiting for a retry, as stored.
type Waiting struct {
	// Sequence is its sequence in the registry's outbox.
	Sequence uint64
	// Notification is the registry's Notification, binary protobuf.
	Notification []byte
	// First is the time of its first failed attempt, from which RetryFor
	// counts; Next, when to attempt again; Backoff, the pause after the
	// next failure.
	First, Next time.Time
	Backoff     time.Duration
}

// Options tune a Relay. Zero fields take the defaults noted.
type Options struct {
	// Wait is how long one poll waits for a notification [20s, at most
	// the registry's 30s].
	Wait time.Duration
	// PageSize is the most notifications one poll returns [100].
	PageSize int
	// Backoff is the first pause after a failure (of a poll, or of one
	// notification), doubled up to MaxBackoff [1s, 30s].
	Backoff, MaxBackoff time.Duration
	// RetryFor is how long a notification that was refused or failed is
	// retried before it is given up [1h; --notification-retry-for].
	RetryFor time.Duration
	// Logger receives warnings: failures (retried) and notifications given
	// up. [discard]
	Logger *slog.Logger
	// Metrics, when set, registers parley_dispatcher_notifications_total
	// by outcome: relayed, retried (an attempt refused or failed, to be
	// retried), dropped (given up after RetryFor).
	Metrics prometheus.Registerer
	// Now is the clock [time.Now].
	Now func() time.Time
}

// maxRetries bounds the notifications waiting for a retry at once (they
// are held in memory too).
const maxRetries = 1000

// Relay moves notifications from the registry's outbox to mailboxes.
type Relay struct {
	src     Source
	mail    mailbox.Appender
	waiting Store
	opts    Options

	// outcomes counts notifications relayed, attempts retried and
	// notifications dropped. A refused or failed one waits for its retry
	// aside, so that one full mailbox does not hold up everyone else's
	// notifications.
	outcomes *prometheus.CounterVec
}

// retry is a notification waiting for another attempt.
type retry struct {
	n       *registryv1.Notification
	first   time.Time     // of the first failed attempt
	next    time.Time     // when to attempt again
	backoff time.Duration // the pause after the next failure
}

// New returns a relay from src to mail, keeping the notifications that
// wait for a retry in waiting.
func New(src Source, mail mailbox.Appender, waiting Store, opts Options) *Relay {
	if opts.Wait <= 0 {
		opts.Wait = 20 * time.Second
	}
	if opts.PageSize <= 0 {
		opts.PageSize = 100
	}
	if opts.Backoff <= 0 {
		opts.Backoff = time.Second
	}
	if opts.MaxBackoff <= 0 {
		opts.MaxBackoff = 30 * time.Second
	}
	if opts.RetryFor <= 0 {
		opts.RetryFor = time.Hour
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	outcomes := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "parley_dispatcher_notifications_total",
		Help: "Network notifications taken from the registry's outbox, by outcome: relayed, retried (an attempt refused or failed, to be retried), dropped (given up after the retry bound).",
	}, []string{"outcome"})
	if opts.Metrics != nil {
		opts.Metrics.MustRegister(outcomes)
	}
	return &Relay{src: src, mail: mail, waiting: waiting, opts: opts, outcomes: outcomes}
}

// Run relays until ctx ends, then returns nil. Failures are logged and
// retried with backoff.
func (r *Relay) Run(ctx context.Context) error {
	var (
		cursor  uint64   // the last sequence read: appended, given up, or waiting
		retries []*retry // in sequence order
	)
	backoff := r.opts.Backoff
	for ctx.Err() == nil && retries == nil {
		var err error
		if retries, err = r.load(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			r.opts.Logger.WarnContext(ctx, "waiting notifications not read; retrying", slog.Any("err", err), slog.String("backoff", backoff.String()))
			sleep(ctx, backoff)
			backoff = min(2*backoff, r.opts.MaxBackoff)
		}
	}
	// An earlier run stored a waiting notification only as its cursor
	// passed it, after everything before it was appended, given up or
	// stored: reading resumes after the last one stored, so one given up
	// before the outbox was trimmed past it is not relayed anew.
	for _, rt := range retries {
		cursor = max(cursor, rt.n.GetSequence())
	}
	backoff = r.opts.Backoff
	for ctx.Err() == nil {
		retries = r.retryDue(ctx, retries)
		// The registry may drop everything read: what is appended, given
		// up, or waiting in the store.
		trim, wait := cursor, r.opts.Wait
		for _, rt := range retries {
			wait = min(wait, max(0, rt.next.Sub(r.opts.Now())))
		}
		limit := r.opts.PageSize
		if len(retries) >= maxRetries {
			limit = 0 // full: read nothing new until retries drain
		}
		notes, err := r.poll(ctx, cursor, trim, limit, wait)
		if err == nil {
			cursor, retries, err = r.relayAll(ctx, notes, cursor, retries)
		}
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			r.opts.Logger.WarnContext(ctx, "notification relay failed; retrying", slog.Any("err", err), slog.String("backoff", backoff.String()))
			sleep(ctx, backoff)
			backoff = min(2*backoff, r.opts.MaxBackoff)
			continue
		}
		backoff = r.opts.Backoff
	}
	return nil
}

// load reads the notifications left waiting by an earlier run (non-nil,
// possibly empty).
func (r *Relay) load(ctx context.Context) ([]*retry, error) {
	stored, err := r.waiting.NotificationRetries(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]*retry, 0, len(stored))
	for _, w := range stored {
		n := &registryv1.Notification{}
		if err := proto.Unmarshal(w.Notification, n); err != nil {
			return nil, fmt.Errorf("waiting notification %d: %w", w.Sequence, err)
		}
		out = append(out, &retry{n: n, first: w.First, next: w.Next, backoff: w.Backoff})
	}
	return out, nil
}

// relayAll appends notes, read after cursor, in order, and returns the
// new cursor and retries. One refused or failed is stored to wait for a
// retry before the cursor passes it; when that fails, relayAll stops
// there with the error, and the notification is read again.
func (r *Relay) relayAll(ctx context.Context, notes []*registryv1.Notification, cursor uint64, retries []*retry) (uint64, []*retry, error) {
	for _, n := range notes {
		if slices.ContainsFunc(retries, func(rt *retry) bool { return rt.n.GetId() == n.GetId() }) {
			// Waiting since before a restart; read again because the
			// trim had not reached it.
			cursor = n.GetSequence()
			continue
		}
		if err := r.relay(ctx, n); err != nil {
			if ctx.Err() != nil {
				return cursor, retries, ctx.Err()
			}
			now := r.opts.Now()
			rt := &retry{n: n, first: now, next: now.Add(r.opts.Backoff), backoff: min(2*r.opts.Backoff, r.opts.MaxBackoff)}
			if err := r.save(ctx, rt); err != nil {
				return cursor, retries, fmt.Errorf("notification %d waits for a retry: %w", n.GetSequence(), err)
			}
			r.retryLater(ctx, n, err)
			retries = append(retries, rt)
		}
		cursor = n.GetSequence()
	}
	return cursor, retries, nil
}

// save stores rt with its schedule.
func (r *Relay) save(ctx context.Context, rt *retry) error {
	data, err := proto.Marshal(rt.n)
	if err != nil {
		return err
	}
	return r.waiting.PutNotificationRetry(ctx, Waiting{Sequence: rt.n.GetSequence(), Notification: data, First: rt.first, Next: rt.next, Backoff: rt.backoff})
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// poll reads up to limit notifications after cursor, trimming through
// trim, and warns when the outbox dropped some unread. With limit 0 it
// only waits.
func (r *Relay) poll(ctx context.Context, cursor, trim uint64, limit int, wait time.Duration) ([]*registryv1.Notification, error) {
	if limit == 0 {
		sleep(ctx, wait)
		return nil, nil
	}
	notes, first, err := r.src.Notifications(ctx, cursor, trim, limit, wait)
	if err != nil {
		return nil, err
	}
	if cursor > 0 && first > cursor+1 {
		r.opts.Logger.WarnContext(ctx, "notifications were dropped by the registry's outbox bound before they were relayed",
			slog.Uint64("after", cursor), slog.Uint64("first_kept", first))
	}
	return notes, nil
}

// retryDue attempts the retries that are due, and returns those still
// waiting, in order: those given up after RetryFor are logged and counted.
// The store follows: a notification appended or given up leaves it, one
// refused again gets its next attempt there. When the store fails, the
// notification stays in memory and is attempted again (an append already
// made counts as done), so the store never keeps one this run dropped for
// longer than a retry.
func (r *Relay) retryDue(ctx context.Context, retries []*retry) []*retry {
	kept := retries[:0]
	for _, rt := range retries {
		now := r.opts.Now()
		if ctx.Err() != nil || now.Before(rt.next) {
			kept = append(kept, rt)
			continue
		}
		err := r.relay(ctx, rt.n)
		switch {
		case err == nil:
			if !r.forget(ctx, rt, now) {
				kept = append(kept, rt)
			}
		case ctx.Err() != nil:
			kept = append(kept, rt)
		case now.Sub(rt.first) >= r.opts.RetryFor:
			if !r.forget(ctx, rt, now) {
				kept = append(kept, rt)
				continue
			}
			r.outcomes.WithLabelValues("dropped").Inc()
			r.opts.Logger.WarnContext(ctx, "a notification was given up after retrying; it is not delivered",
				slog.String("agent", rt.n.GetRecipient()), slog.String("notification", rt.n.GetId()), slog.String("type", rt.n.GetType()),
				slog.String("retried_for", now.Sub(rt.first).String()), slog.Any("err", err))
		default:
			r.retryLater(ctx, rt.n, err)
			rt.next, rt.backoff = now.Add(rt.backoff), min(2*rt.backoff, r.opts.MaxBackoff)
			if err := r.save(ctx, rt); err != nil {
				// The stored attempt is earlier: a restart retries sooner.
				r.opts.Logger.WarnContext(ctx, "a waiting notification's next attempt was not stored", slog.String("notification", rt.n.GetId()), slog.Any("err", err))
			}
			kept = append(kept, rt)
		}
	}
	clear(retries[len(kept):]) // no stale pointers past the kept ones
	return kept
}

// forget removes rt from the store, and reports whether it did; if not,
// rt is attempted again after its backoff.
func (r *Relay) forget(ctx context.Context, rt *retry, now time.Time) bool {
	err := r.waiting.DeleteNotificationRetry(ctx, rt.n.GetSequence())
	if err == nil {
		return true
	}
	r.opts.Logger.WarnContext(ctx, "a notification no longer waiting was not removed from the store; retrying", slog.String("notification", rt.n.GetId()), slog.Any("err", err))
	rt.next = now.Add(rt.backoff)
	return false
}

// retryLater counts and logs an attempt that will be retried.
func (r *Relay) retryLater(ctx context.Context, n *registryv1.Notification, err error) {
	r.outcomes.WithLabelValues("retried").Inc()
	r.opts.Logger.WarnContext(ctx, "a notification was not relayed; it will be retried",
		slog.String("agent", n.GetRecipient()), slog.String("notification", n.GetId()), slog.String("type", n.GetType()), slog.Any("err", err))
}

// Message is the mailbox message a notification becomes: its id is the
// notification's (so a redelivery is recognised), it opens a dialogue of
// its own, the network is its sender, and its body is the notification as
// JSON.
func Message(n *registryv1.Notification) (mailbox.Message, error) {
	body, err := protojson.Marshal(n)
	if err != nil {
		return mailbox.Message{}, err
	}
	return mailbox.Message{
		ID:         n.GetId(),
		DialogueID: n.GetId(),
		Category:   mailbox.CategoryNotifications,
		Type:       n.GetType(),
		Body:       body,
		Time:       n.GetCreateTime().AsTime(),
	}, nil
}

// relay appends n to its recipient's mailbox: nil when it holds n (now or
// before a restart), an error wrapping mailbox.ErrFull when the mailbox
// refused it, or the append's error.
func (r *Relay) relay(ctx context.Context, n *registryv1.Notification) error {
	m, err := Message(n)
	if err != nil {
		return err
	}
	refusals, err := r.mail.Append(ctx, m, []string{n.GetRecipient()})
	if errors.Is(err, resource.ErrAlreadyExists) {
		return nil // appended before a restart
	}
	if err != nil {
		return err
	}
	if len(refusals) > 0 {
		return fmt.Errorf("mailbox of %q: %w", refusals[0].Agent, refusals[0].Err)
	}
	r.outcomes.WithLabelValues("relayed").Inc()
	return nil
}
