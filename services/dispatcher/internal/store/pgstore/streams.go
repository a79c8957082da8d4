package pgstore

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
)

var _ mailbox.Streams = (*Store)(nil)

// StreamChannel is the NOTIFY channel of receive streams opened.
func (s *Store) StreamChannel() string { return "parley_streams_" + s.schema }

// OpenStream implements mailbox.Streams: the epoch comes from a sequence
// (one order over every replica), is kept as the agent's newest unless a
// greater one already is, and is sent on StreamChannel as
// "<origin>\n<epoch>\n<agent>", all in one statement.
func (s *Store) OpenStream(ctx context.Context, agent string) (uint64, error) {
	var epoch uint64
	err := s.db.Pool().QueryRow(ctx, `WITH n AS (SELECT nextval('mailbox_stream_epochs') AS epoch),
u AS (INSERT INTO mailbox_streams (agent, epoch) SELECT $1::text, epoch FROM n
  ON CONFLICT (agent) DO UPDATE SET epoch = GREATEST(mailbox_streams.epoch, EXCLUDED.epoch))
SELECT epoch, pg_notify($2::text, $3::text || E'\n' || epoch::text || E'\n' || $1::text) FROM n`,
		agent, s.StreamChannel(), s.origin).Scan(&epoch, nil)
	return epoch, err
}

// StreamEpochs returns the newest stream's epoch of each of agents that
// has one, for a replica that missed notifications.
func (s *Store) StreamEpochs(ctx context.Context, agents []string) (map[string]uint64, error) {
	rows, err := s.db.Pool().Query(ctx, `SELECT agent, epoch FROM mailbox_streams WHERE agent = ANY($1)`, agents)
	if err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	var (
		agent string
		epoch uint64
	)
	_, err = pgx.ForEachRow(rows, []any{&agent, &epoch}, func() error {
		out[agent] = epoch
		return nil
	})
	return out, err
}
