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
package notify

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/encoding/protojson"

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

// Options tune a Relay. Zero fields take the defaults noted.
type Options struct {
	// Wait is how long one poll waits for a notification [20s, at most
	// the registry's 30s].
	Wait time.Duration
	// PageSize is the most notifications one poll returns [100].
	PageSize int
	// Backoff is the first pause after a failure, doubled up to MaxBackoff
	// [1s, 30s].
	Backoff, MaxBackoff time.Duration
	// Logger receives warnings: failures (retried) and notifications a
	// full mailbox refused. [discard]
	Logger *slog.Logger
	// Metrics, when set, registers parley_dispatcher_notifications_total
	// by outcome: relayed, refused (a full mailbox; logged, not retried).
	Metrics prometheus.Registerer
}

// Relay moves notifications from the registry's outbox to mailboxes.
type Relay struct {
	src  Source
	mail mailbox.Appender
	opts Options

	// outcomes counts notifications relayed and refused. A refused one
	// (its recipient's mailbox is full) is logged and not retried, so that
	// one full mailbox does not hold up everyone else's notifications.
	outcomes *prometheus.CounterVec
}

// New returns a relay from src to mail.
func New(src Source, mail mailbox.Appender, opts Options) *Relay {
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
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	outcomes := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "parley_dispatcher_notifications_total",
		Help: "Network notifications taken from the registry's outbox, by outcome: relayed, refused (recipient's mailbox full).",
	}, []string{"outcome"})
	if opts.Metrics != nil {
		opts.Metrics.MustRegister(outcomes)
	}
	return &Relay{src: src, mail: mail, opts: opts, outcomes: outcomes}
}

// Run relays until ctx ends, then returns nil. Failures are logged and
// retried with backoff.
func (r *Relay) Run(ctx context.Context) error {
	var cursor uint64 // the last sequence appended; the registry trims through it
	backoff := r.opts.Backoff
	for ctx.Err() == nil {
		next, err := r.poll(ctx, cursor)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			r.opts.Logger.WarnContext(ctx, "notification relay failed; retrying", slog.Any("err", err), slog.String("backoff", backoff.String()))
			select {
			case <-ctx.Done():
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, r.opts.MaxBackoff)
		} else {
			backoff = r.opts.Backoff
		}
		cursor = next
	}
	return nil
}

// poll reads one page after cursor, trimming through it, appends each
// notification, and returns the new cursor: the last one appended, even
// when a later one failed.
func (r *Relay) poll(ctx context.Context, cursor uint64) (uint64, error) {
	notes, first, err := r.src.Notifications(ctx, cursor, cursor, r.opts.PageSize, r.opts.Wait)
	if err != nil {
		return cursor, err
	}
	if cursor > 0 && first > cursor+1 {
		r.opts.Logger.WarnContext(ctx, "notifications were dropped by the registry's outbox bound before they were relayed",
			slog.Uint64("after", cursor), slog.Uint64("first_kept", first))
	}
	for _, n := range notes {
		if err := r.relay(ctx, n); err != nil {
			return cursor, err
		}
		cursor = n.GetSequence()
	}
	return cursor, nil
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
	if len(refusals) == 0 {
		r.outcomes.WithLabelValues("relayed").Inc()
	}
	for _, f := range refusals {
		r.outcomes.WithLabelValues("refused").Inc()
		r.opts.Logger.WarnContext(ctx, "a mailbox refused a notification; it is not retried",
			slog.String("agent", f.Agent), slog.String("notification", n.GetId()), slog.String("type", n.GetType()), slog.Any("err", f.Err))
	}
	return nil
}
