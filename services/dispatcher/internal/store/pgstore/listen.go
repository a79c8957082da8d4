package pgstore

import (
	"context"
	"strings"

	"github.com/jackc/pgx/v5"
)

// maxPayload keeps a NOTIFY payload under PostgreSQL's 8000-byte limit.
const maxPayload = 7000

// MailboxChannel is the NOTIFY channel on which an append names the agents
// whose mailbox grew, one per line; each replica listens to it to wake
// the streams of its connected agents (see Listen).
func (s *Store) MailboxChannel() string { return "parley_mailbox_" + s.schema }

// notifyMailboxes queues, inside an append's transaction, the notification
// naming agents: PostgreSQL sends it at commit, so a listener never reads
// the mailbox before the append is visible.
func (s *Store) notifyMailboxes(ctx context.Context, tx pgx.Tx, agents []string) error {
	for len(agents) > 0 {
		n, size := 0, 0
		for n < len(agents) && (n == 0 || size+len(agents[n])+1 <= maxPayload) {
			size += len(agents[n]) + 1
			n++
		}
		if _, err := tx.Exec(ctx, `SELECT pg_notify($1, $2)`, s.MailboxChannel(), strings.Join(agents[:n], "\n")); err != nil {
			return err
		}
		agents = agents[n:]
	}
	return nil
}

// TimerChannel is the NOTIFY channel on which PutTimers says that a timer
// was set, so that the replica running the deadlines looks again.
func (s *Store) TimerChannel() string { return "parley_timers_" + s.schema }

// notifyTimers queues the timers' notification inside the transaction.
func (s *Store) notifyTimers(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, `SELECT pg_notify($1, '')`, s.TimerChannel())
	return err
}
