package pgstore

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/parleyhq/parley/platform/pgdb"
	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
)

var _ mailbox.Streams = (*Store)(nil)

// StreamChannel is the NOTIFY channel of receive streams opened.
func (s *Store) StreamChannel() string { return pgdb.Channel("parley_streams_", s.schema) }

// OpenStream implements mailbox.Streams: the epoch comes from a sequence
// (one order over every replica), is kept as the agent's newest unless a
// greater one already is (the row of mailbox_streams, stamped seen now),
// and is sent on StreamChannel as "<origin>\n<epoch>\n<agent>", all in
// one statement.
func (s *Store) OpenStream(ctx context.Context, agent string) (uint64, error) {
	var epoch uint64
	err := s.db.Pool().QueryRow(ctx, `WITH n AS (SELECT nextval('mailbox_stream_epochs') AS epoch),
u AS (INSERT INTO mailbox_streams (agent, epoch, seen_at) SELECT $1::text, epoch, now() FROM n
  ON CONFLICT (agent) DO UPDATE SET epoch = GREATEST(mailbox_streams.epoch, EXCLUDED.epoch), seen_at = now())
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

// CloseStream implements mailbox.Streams: it deletes the agent's row if it
// still holds epoch, so that a newer stream's row stays.
func (s *Store) CloseStream(ctx context.Context, agent string, epoch uint64) error {
	_, err := s.db.Pool().Exec(ctx, `DELETE FROM mailbox_streams WHERE agent = $1 AND epoch = $2`, agent, epoch)
	return err
}

// CloseStreams implements mailbox.Streams: CloseStream for each of ended,
// streamBatch streams per statement.
func (s *Store) CloseStreams(ctx context.Context, ended []mailbox.StreamEnd) error {
	for len(ended) > 0 {
		batch := ended[:min(len(ended), streamBatch)]
		ended = ended[len(batch):]
		agents, epochs := make([]string, len(batch)), make([]int64, len(batch))
		for i, e := range batch {
			agents[i], epochs[i] = e.Agent, int64(e.Epoch) //nolint:gosec // epochs come from a bigint sequence
		}
		if _, err := s.db.Pool().Exec(ctx, `DELETE FROM mailbox_streams AS m
USING unnest($1::text[], $2::bigint[]) AS d(agent, epoch)
WHERE m.agent = d.agent AND m.epoch = d.epoch`, agents, epochs); err != nil {
			return fmt.Errorf("close %d receive streams: %w", len(batch)+len(ended), err)
		}
	}
	return nil
}

// streamBatch is how many rows one statement of TouchStreams,
// CloseStreams or SweepStreams handles at most.
const streamBatch = 1000

// TouchStreams stamps the rows of the streams open on this replica (agent
// to epoch, mailbox.Mailboxes.StreamEpochs) as seen now, so that
// SweepStreams keeps them; a replica calls it more often than
// SweepStreams' age. A row holding another epoch (a newer stream) is left
// alone. It returns the streams it stamped: one of streams missing there
// has no row of its own any more (a newer stream replaced it, and may have
// ended since), which mailbox.Mailboxes.Recheck ends.
func (s *Store) TouchStreams(ctx context.Context, streams map[string]uint64) (map[string]uint64, error) {
	agents := make([]string, 0, min(len(streams), streamBatch))
	epochs := make([]int64, 0, cap(agents))
	stamped := make(map[string]uint64, len(streams))
	flush := func() error {
		if len(agents) == 0 {
			return nil
		}
		rows, err := s.db.Pool().Query(ctx, `UPDATE mailbox_streams AS m SET seen_at = now()
FROM unnest($1::text[], $2::bigint[]) AS l(agent, epoch)
WHERE m.agent = l.agent AND m.epoch = l.epoch RETURNING m.agent, m.epoch`, agents, epochs)
		agents, epochs = agents[:0], epochs[:0]
		if err != nil {
			return err
		}
		var (
			agent string
			epoch uint64
		)
		_, err = pgx.ForEachRow(rows, []any{&agent, &epoch}, func() error {
			stamped[agent] = epoch
			return nil
		})
		return err
	}
	for agent, epoch := range streams {
		agents, epochs = append(agents, agent), append(epochs, int64(epoch)) //nolint:gosec // epochs come from a bigint sequence
		if len(agents) == streamBatch {
			if err := flush(); err != nil {
				return nil, err
			}
		}
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return stamped, nil
}

// SweepStreams deletes the rows of mailbox_streams not seen for age: the
// streams of replicas that died without ending them. It deletes
// streamBatch rows per statement (an index range scan on seen_at) until
// none is left, and returns how many.
func (s *Store) SweepStreams(ctx context.Context, age time.Duration) (int, error) {
	total := 0
	for {
		tag, err := s.db.Pool().Exec(ctx, `DELETE FROM mailbox_streams WHERE agent = ANY (ARRAY(
  SELECT agent FROM mailbox_streams WHERE seen_at < now() - make_interval(secs => $1) ORDER BY seen_at LIMIT $2))
  AND seen_at < now() - make_interval(secs => $1)`, age.Seconds(), streamBatch)
		if err != nil {
			return total, fmt.Errorf("sweep mailbox streams: %w", err)
		}
		n := int(tag.RowsAffected())
		total += n
		if n < streamBatch {
			return total, nil
		}
	}
}
