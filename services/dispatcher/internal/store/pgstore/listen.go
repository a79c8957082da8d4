package pgstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/parleyhq/parley/platform/pgdb"
)

// Replicas wake each other through PostgreSQL notifications (LISTEN and
// NOTIFY), sent inside the transaction that made the change, so that a
// listener never looks before the change is visible:
//
//   - an append names the agents whose mailbox grew, on MailboxChannel: the
//     replica holding an agent's stream wakes it to read the store;
//   - PutTimers says a timer was set, on TimerChannel: the replica running
//     the deadlines looks for the next one again;
//   - a routine or tool written (set, or a run recorded) is named on
//     RoutineChannel: the other replicas drop their cached copy;
//   - a receive stream opened names its agent and epoch on StreamChannel
//     (streams.go): the replica holding an older stream of the agent ends
//     it.
//
// A notification is "<origin>\n<payload>": origin is the Store that sent it,
// which ignores its own (it woke its streams itself).

// maxPayload keeps a NOTIFY payload under PostgreSQL's 8000-byte limit.
const maxPayload = 7000

// newOrigin returns a random id for one Store.
func newOrigin() string {
	var b [8]byte
	rand.Read(b[:]) // crypto/rand.Read never fails
	return hex.EncodeToString(b[:])
}

// The channels are named prefix + schema, hashed to fit when the schema
// is long (pgdb.Channel).

// MailboxChannel is the NOTIFY channel of mailbox appends.
func (s *Store) MailboxChannel() string { return pgdb.Channel("parley_mailbox_", s.schema) }

// TimerChannel is the NOTIFY channel of timers set.
func (s *Store) TimerChannel() string { return pgdb.Channel("parley_timers_", s.schema) }

// notifyMailboxes queues the notifications naming agents, one per line, in
// as many payloads as they need.
func (s *Store) notifyMailboxes(ctx context.Context, tx pgx.Tx, agents []string) error {
	for len(agents) > 0 {
		n, size := 0, len(s.origin)
		for n < len(agents) && (n == 0 || size+len(agents[n])+1 <= maxPayload) {
			size += len(agents[n]) + 1
			n++
		}
		if _, err := tx.Exec(ctx, `SELECT pg_notify($1, $2)`, s.MailboxChannel(), s.origin+"\n"+strings.Join(agents[:n], "\n")); err != nil {
			return err
		}
		agents = agents[n:]
	}
	return nil
}

// RoutineChannel is the NOTIFY channel of routines and tools changed.
func (s *Store) RoutineChannel() string { return pgdb.Channel("parley_routines_", s.schema) }

// notifyRoutine queues the notification naming a routine or tool changed.
func (s *Store) notifyRoutine(ctx context.Context, q pgdb.Querier, name string) error {
	_, err := q.Exec(ctx, `SELECT pg_notify($1, $2)`, s.RoutineChannel(), s.origin+"\n"+name)
	return err
}

// notifyTimers queues the timers' notification.
func (s *Store) notifyTimers(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, `SELECT pg_notify($1, $2)`, s.TimerChannel(), s.origin+"\n")
	return err
}

// Wakeups are what Listen calls when another replica changed something.
type Wakeups struct {
	// Mailboxes is given the agents whose mailbox grew; nil means any may
	// have (notifications were missed). May be nil.
	Mailboxes func(agents []string)
	// Timers is called when a timer was set. May be nil.
	Timers func()
	// Routines is given the name of a routine or tool that changed; ""
	// means any may have (notifications were missed). May be nil.
	Routines func(name string)
	// Streams is given an agent and the epoch of its stream opened on
	// another replica; "" means any may have been (notifications were
	// missed: compare with StreamEpochs). May be nil.
	Streams func(agent string, epoch uint64)
}

// Listen calls w on the other replicas' changes until ctx ends, and on
// every (re)connection of its listening connection, when notifications may
// have been missed.
func (s *Store) Listen(ctx context.Context, logger *slog.Logger, w Wakeups) {
	mailboxes, timers, routines, streams := s.MailboxChannel(), s.TimerChannel(), s.RoutineChannel(), s.StreamChannel()
	s.db.Listen(ctx, []string{mailboxes, timers, routines, streams}, logger, func(channel, payload string) {
		origin, rest, _ := strings.Cut(payload, "\n")
		if payload != "" && origin == s.origin {
			return
		}
		switch {
		case channel == mailboxes && w.Mailboxes != nil:
			if payload == "" {
				w.Mailboxes(nil)
			} else {
				w.Mailboxes(strings.Split(rest, "\n"))
			}
		case channel == timers && w.Timers != nil:
			w.Timers()
		case channel == routines && w.Routines != nil:
			w.Routines(rest)
		case channel == streams && w.Streams != nil:
			if payload == "" {
				w.Streams("", 0)
				return
			}
			epoch, agent, _ := strings.Cut(rest, "\n")
			if n, err := strconv.ParseUint(epoch, 10, 64); err == nil {
				w.Streams(agent, n)
			}
		}
	})
}
