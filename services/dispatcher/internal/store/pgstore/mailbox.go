package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/parleyhq/parley/platform/resource"
	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
)

// The mailboxes run at READ COMMITTED with row locks (db.Write): every
// write locks the mailbox rows it moves (SELECT … FOR UPDATE, in name order
// so that two fan-outs cannot deadlock), so concurrent appends to one agent
// from several replicas queue on its row instead of failing to serialize,
// and each gets the next cursor.

var _ mailbox.Store = (*Store)(nil)

// lockMailboxes creates the agents' mailbox rows when missing and locks
// them, returning their states by agent. agents must be sorted.
func lockMailboxes(ctx context.Context, tx pgx.Tx, agents []string) (map[string]mailbox.State, error) {
	if _, err := tx.Exec(ctx, `INSERT INTO mailboxes (agent) SELECT unnest($1::text[]) ON CONFLICT (agent) DO NOTHING`, agents); err != nil {
		return nil, err
	}
	rows, err := tx.Query(ctx, `SELECT agent, head, acked, pending, pending_bytes FROM mailboxes WHERE agent = ANY($1) ORDER BY agent FOR UPDATE`, agents)
	if err != nil {
		return nil, err
	}
	out := make(map[string]mailbox.State, len(agents))
	var (
		agent string
		st    mailbox.State
	)
	_, err = pgx.ForEachRow(rows, []any{&agent, &st.Head, &st.Acked, &st.Pending, &st.PendingBytes}, func() error {
		out[agent] = st
		return nil
	})
	return out, err
}

// AppendMessage implements mailbox.Store: one transaction that stores the
// body, moves each accepting mailbox's head and writes its reference.
func (s *Store) AppendMessage(ctx context.Context, m mailbox.Message, recipients []string, bound mailbox.Bound) ([]mailbox.Delivery, []mailbox.Refusal, error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	a, err := newAppend(m, recipients)
	if err != nil {
		return nil, nil, err
	}
	err = s.db.Write(ctx, func(tx pgx.Tx) error { return s.appendTx(ctx, tx, a, bound) })
	if errors.Is(err, errNothing) {
		err = nil
	}
	if err != nil {
		return nil, nil, err
	}
	return a.delivered, a.refused, nil
}

// appendOp is one message appended to several mailboxes inside a write
// transaction: by AppendMessage alone, or with a dialogue record.
type appendOp struct {
	m          mailbox.Message
	body       []byte // m as stored
	recipients []string
	delivered  []mailbox.Delivery
	refused    []mailbox.Refusal
}

func newAppend(m mailbox.Message, recipients []string) (*appendOp, error) {
	body, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	recipients = slices.Clone(recipients)
	slices.Sort(recipients) // lockMailboxes locks in name order
	return &appendOp{m: m, body: body, recipients: recipients}, nil
}

// appendTx appends a's message in tx: recipients whose mailbox would
// exceed bound are refused and get nothing. When none accepts it returns
// errNothing, which must roll tx back. It may run more than once (the
// transaction retried): results start afresh.
func (s *Store) appendTx(ctx context.Context, tx pgx.Tx, a *appendOp, bound mailbox.Bound) error {
	a.delivered, a.refused = a.delivered[:0], a.refused[:0]
	m, size := a.m, int64(len(a.m.Body))
	// The id first: a concurrent append of the same id waits on it and
	// then finds it taken.
	tag, err := tx.Exec(ctx, `INSERT INTO mail_messages (id, refs, data) VALUES ($1, 0, $2) ON CONFLICT (id) DO NOTHING`, m.ID, a.body)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return resource.AlreadyExists("message", m.ID)
	}
	states, err := lockMailboxes(ctx, tx, a.recipients)
	if err != nil {
		return err
	}
	var (
		agents            []string
		heads, pend, pbyt []int64
	)
	for _, agent := range a.recipients {
		st := states[agent]
		if (bound.MaxMessages > 0 && st.Pending+1 > bound.MaxMessages) ||
			(bound.MaxBytes > 0 && st.PendingBytes+size > bound.MaxBytes) {
			a.refused = append(a.refused, mailbox.Refusal{Agent: agent, Err: mailbox.ErrFull})
			continue
		}
		st.Head++
		st.Pending++
		st.PendingBytes += size
		agents = append(agents, agent)
		heads, pend, pbyt = append(heads, int64(st.Head)), append(pend, st.Pending), append(pbyt, st.PendingBytes) //nolint:gosec // cursors stay far below 2^63
		a.delivered = append(a.delivered, mailbox.Delivery{Agent: agent, Cursor: st.Head, Message: m})
	}
	if len(a.delivered) == 0 {
		return errNothing // rolls back the body and the empty mailboxes
	}
	if _, err := tx.Exec(ctx, `UPDATE mailboxes AS b SET head = u.head, pending = u.pending, pending_bytes = u.pbytes
FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[]) AS u(agent, head, pending, pbytes) WHERE b.agent = u.agent`, agents, heads, pend, pbyt); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO mailbox_refs (agent, cursor, message, sent_ns, size)
SELECT u.agent, u.cursor, $3, $4, $5 FROM unnest($1::text[], $2::bigint[]) AS u(agent, cursor)`, agents, heads, m.ID, m.Time.UnixNano(), size); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `UPDATE mail_messages SET refs = $2 WHERE id = $1`, m.ID, len(a.delivered)); err != nil {
		return err
	}
	return s.notifyMailboxes(ctx, tx, agents)
}

// errNothing rolls back a transaction that found nothing to write.
var errNothing = errors.New("nothing to write")

// ReadMailbox implements mailbox.Store.
func (s *Store) ReadMailbox(ctx context.Context, agent string, after uint64, limit int) ([]mailbox.Delivery, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if after >= 1<<63-1 || limit <= 0 {
		return nil, nil
	}
	rows, err := s.db.Pool().Query(ctx, `SELECT r.cursor, r.message, m.data FROM mailbox_refs r LEFT JOIN mail_messages m ON m.id = r.message
WHERE r.agent = $1 AND r.cursor > $2 ORDER BY r.cursor LIMIT $3`, agent, int64(after), limit) //nolint:gosec // checked above
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (mailbox.Delivery, error) {
		d := mailbox.Delivery{Agent: agent}
		var (
			id   string
			data []byte
		)
		if err := r.Scan(&d.Cursor, &id, &data); err != nil {
			return d, err
		}
		if data == nil {
			return d, fmt.Errorf("mailbox %q cursor %d: message %q is missing", agent, d.Cursor, id)
		}
		return d, json.Unmarshal(data, &d.Message)
	})
}

// AcknowledgeMailbox implements mailbox.Store.
func (s *Store) AcknowledgeMailbox(ctx context.Context, agent string, cursor uint64) (mailbox.State, error) {
	return s.ack(ctx, agent, func(st mailbox.State) (uint64, error) {
		if cursor > st.Head {
			return 0, fmt.Errorf("cursor %d of %q (head %d): %w", cursor, agent, st.Head, mailbox.ErrCursorAhead)
		}
		return cursor, nil
	})
}

// ClearMailbox implements mailbox.Store.
func (s *Store) ClearMailbox(ctx context.Context, agent string) (mailbox.State, error) {
	return s.ack(ctx, agent, func(st mailbox.State) (uint64, error) { return st.Head, nil })
}

// ack moves agent's acknowledged cursor to the one target picks, releasing
// the acknowledged messages from the size bound.
func (s *Store) ack(ctx context.Context, agent string, target func(mailbox.State) (uint64, error)) (mailbox.State, error) {
	if err := ctx.Err(); err != nil {
		return mailbox.State{}, err
	}
	var out mailbox.State
	err := s.db.Write(ctx, func(tx pgx.Tx) error {
		out = mailbox.State{}
		err := tx.QueryRow(ctx, `SELECT head, acked, pending, pending_bytes FROM mailboxes WHERE agent = $1 FOR UPDATE`, agent).
			Scan(&out.Head, &out.Acked, &out.Pending, &out.PendingBytes)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		to, err := target(out)
		if err != nil || to <= out.Acked {
			return err
		}
		var n, bytes int64
		if err := tx.QueryRow(ctx, `SELECT count(*), coalesce(sum(size), 0) FROM mailbox_refs WHERE agent = $1 AND cursor > $2 AND cursor <= $3`,
			agent, int64(out.Acked), int64(to)).Scan(&n, &bytes); err != nil { //nolint:gosec // cursors stay far below 2^63
			return err
		}
		out.Acked, out.Pending, out.PendingBytes = to, out.Pending-n, out.PendingBytes-bytes
		// compact_ns: set once the oldest kept reference is acknowledged
		// (see migration 0004); kept when it already was.
		_, err = tx.Exec(ctx, `UPDATE mailboxes SET acked = $2, pending = $3, pending_bytes = $4,
  compact_ns = COALESCE(compact_ns, (SELECT CASE WHEN r.cursor <= $2 THEN r.sent_ns END
    FROM mailbox_refs r WHERE r.agent = $1 ORDER BY r.cursor LIMIT 1))
WHERE agent = $1`,
			agent, int64(out.Acked), out.Pending, out.PendingBytes) //nolint:gosec // as above
		return err
	})
	return out, err
}

// GetMailbox implements mailbox.Store.
func (s *Store) GetMailbox(ctx context.Context, agent string) (mailbox.State, error) {
	if err := ctx.Err(); err != nil {
		return mailbox.State{}, err
	}
	var out mailbox.State
	err := s.db.Pool().QueryRow(ctx, `SELECT head, acked, pending, pending_bytes FROM mailboxes WHERE agent = $1`, agent).
		Scan(&out.Head, &out.Acked, &out.Pending, &out.PendingBytes)
	if errors.Is(err, pgx.ErrNoRows) {
		return mailbox.State{}, nil
	}
	return out, err
}

// CompactMailboxes implements mailbox.Store. It takes the mailboxes due
// by compact_ns (oldest first; replicas compacting at once take disjoint
// ones, SKIP LOCKED), deletes up to limit of their acknowledged references
// sent before before, moves the reference counts under their rows' locks,
// and sets each mailbox's compact_ns from its next oldest reference. A
// pass reads only mailboxes with something due.
func (s *Store) CompactMailboxes(ctx context.Context, before time.Time, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	n := 0
	err := s.db.Write(ctx, func(tx pgx.Tx) error {
		n = 0
		rows, err := tx.Query(ctx, `SELECT agent FROM mailboxes WHERE compact_ns < $1
ORDER BY compact_ns LIMIT $2 FOR UPDATE SKIP LOCKED`, before.UnixNano(), limit)
		if err != nil {
			return err
		}
		due, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil || len(due) == 0 {
			return err
		}
		rows, err = tx.Query(ctx, `DELETE FROM mailbox_refs d USING (
  SELECT r.agent, r.cursor FROM mailbox_refs r JOIN mailboxes b ON b.agent = r.agent
  WHERE r.agent = ANY($1) AND r.cursor <= b.acked AND r.sent_ns < $2 ORDER BY r.agent, r.cursor LIMIT $3
) AS x WHERE d.agent = x.agent AND d.cursor = x.cursor RETURNING d.message`, due, before.UnixNano(), limit)
		if err != nil {
			return err
		}
		gone, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		n = len(gone)
		if _, err := tx.Exec(ctx, `UPDATE mailboxes b SET compact_ns = (
  SELECT CASE WHEN r.cursor <= b.acked THEN r.sent_ns END
  FROM mailbox_refs r WHERE r.agent = b.agent ORDER BY r.cursor LIMIT 1)
WHERE b.agent = ANY($1)`, due); err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		if _, err := tx.Exec(ctx, `UPDATE mail_messages m SET refs = m.refs - c.n
FROM (SELECT id, count(*) AS n FROM unnest($1::text[]) AS id GROUP BY id) AS c WHERE m.id = c.id`, gone); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `DELETE FROM mail_messages WHERE id = ANY($1) AND refs <= 0`, gone)
		return err
	})
	return n, err
}
