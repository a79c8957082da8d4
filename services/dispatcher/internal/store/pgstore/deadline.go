package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

var _ store.TimerStore = (*Store)(nil)

// PutTimers implements store.TimerStore.
func (s *Store) PutTimers(ctx context.Context, timers []store.Timer) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.Write(ctx, func(tx pgx.Tx) error {
		for _, t := range timers {
			if _, err := tx.Exec(ctx, `INSERT INTO timers (dialogue, counterpart, name, at_ns, data) VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (dialogue, counterpart, name) DO UPDATE SET at_ns = excluded.at_ns, data = excluded.data`,
				t.Dialogue, t.Counterpart, t.Name, t.At.UnixNano(), marshal(t)); err != nil {
				return err
			}
		}
		return s.notifyTimers(ctx, tx)
	})
}

// timers reads the timers a query returns, in its order.
func (s *Store) timers(ctx context.Context, sql string, args ...any) ([]store.Timer, error) {
	rows, err := s.db.Pool().Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Timer, error) {
		var (
			t    store.Timer
			data []byte
		)
		if err := r.Scan(&data); err != nil {
			return t, err
		}
		return t, json.Unmarshal(data, &t)
	})
}

// DueTimers implements store.TimerStore.
func (s *Store) DueTimers(ctx context.Context, now time.Time, limit int) ([]store.Timer, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return s.timers(ctx, `SELECT data FROM timers WHERE at_ns <= $1 ORDER BY at_ns, dialogue, counterpart, name LIMIT $2`, now.UnixNano(), limit)
}

// NextTimer implements store.TimerStore.
func (s *Store) NextTimer(ctx context.Context) (store.Timer, bool, error) {
	if err := ctx.Err(); err != nil {
		return store.Timer{}, false, err
	}
	ts, err := s.timers(ctx, `SELECT data FROM timers ORDER BY at_ns, dialogue, counterpart, name LIMIT 1`)
	if err != nil || len(ts) == 0 {
		return store.Timer{}, false, err
	}
	return ts[0], true, nil
}

// PairState implements store.TimerStore.
func (s *Store) PairState(ctx context.Context, dialogue string, p store.Pair) (json.RawMessage, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return pairState(ctx, s.db.Pool(), dialogue, p)
}

// FireTimer implements store.TimerStore. The timer row is locked first, so
// replicas firing one timer at once queue on it: the first fires it, the
// others find it gone (or, at SERIALIZABLE, retry and then find it gone).
func (s *Store) FireTimer(ctx context.Context, t store.Timer, mutate func(json.RawMessage) (json.RawMessage, error)) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	var fired bool
	err := s.db.Update(ctx, func(tx pgx.Tx) error {
		fired = false
		var at int64
		err := tx.QueryRow(ctx, `SELECT at_ns FROM timers WHERE dialogue = $1 AND counterpart = $2 AND name = $3 FOR UPDATE`,
			t.Dialogue, t.Counterpart, t.Name).Scan(&at)
		if errors.Is(err, pgx.ErrNoRows) || (err == nil && at != t.At.UnixNano()) {
			return nil
		}
		if err != nil {
			return err
		}
		p := store.Pair{A: t.Initiator, B: t.Counterpart}
		cur, err := pairState(ctx, tx, t.Dialogue, p)
		if err != nil {
			return err
		}
		next, err := mutate(cur)
		if err != nil {
			return err
		}
		if next != nil {
			k := p.Key()
			if _, err := tx.Exec(ctx, `INSERT INTO dialogue_pairs (dialogue, a, b, state) VALUES ($1, $2, $3, $4)
ON CONFLICT (dialogue, a, b) DO UPDATE SET state = excluded.state`, t.Dialogue, k.A, k.B, []byte(next)); err != nil {
				return err
			}
		}
		if _, err := tx.Exec(ctx, `DELETE FROM timers WHERE dialogue = $1 AND counterpart = $2 AND name = $3`, t.Dialogue, t.Counterpart, t.Name); err != nil {
			return err
		}
		fired = true
		return nil
	})
	return fired, err
}
