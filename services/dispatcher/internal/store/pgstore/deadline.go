package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

var _ store.TimerStore = (*Store)(nil)

// PutTimers implements store.TimerStore.
func (s *Store) PutTimers(ctx context.Context, timers []store.Timer) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.Write(ctx, func(tx pgx.Tx) error { return s.putTimers(ctx, tx, timers) })
}

// putTimers stores timers in tx, each replacing the timer of its name, and
// wakes the other replicas' schedulers when tx commits.
func (s *Store) putTimers(ctx context.Context, tx pgx.Tx, timers []store.Timer) error {
	if len(timers) == 0 {
		return nil
	}
	for _, t := range timers {
		if _, err := tx.Exec(ctx, `INSERT INTO timers (dialogue, counterpart, name, at_ns, data) VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (dialogue, counterpart, name) DO UPDATE SET at_ns = excluded.at_ns, data = excluded.data`,
			t.Dialogue, t.Counterpart, t.Name, t.Due().UnixNano(), marshal(t)); err != nil {
			return err
		}
	}
	return s.notifyTimers(ctx, tx)
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

// DueTimersAfter implements store.TimerStore.
func (s *Store) DueTimersAfter(ctx context.Context, now time.Time, after store.Timer, limit int) ([]store.Timer, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return s.timers(ctx, `SELECT data FROM timers WHERE at_ns <= $1 AND (at_ns, dialogue, counterpart, name) > ($3, $4, $5, $6)
ORDER BY at_ns, dialogue, counterpart, name LIMIT $2`, now.UnixNano(), limit, after.Due().UnixNano(), after.Dialogue, after.Counterpart, after.Name)
}

// RetryTimers implements store.TimerStore: one conditional UPDATE per
// timer, on its due time as listed.
func (s *Store) RetryTimers(ctx context.Context, retries []store.TimerRetry) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.Write(ctx, func(tx pgx.Tx) error {
		for _, r := range retries {
			t := r.Timer
			t.Failures++
			t.Retry = r.Retry
			if _, err := tx.Exec(ctx, `UPDATE timers SET at_ns = $4, data = $5 WHERE dialogue = $1 AND counterpart = $2 AND name = $3 AND at_ns = $6`,
				t.Dialogue, t.Counterpart, t.Name, t.Due().UnixNano(), marshal(t), r.Timer.Due().UnixNano()); err != nil {
				return err
			}
		}
		return nil
	})
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

// FireTimers implements store.TimerStore, in one READ COMMITTED
// transaction holding the locks of the timers' dialogues (dialogue.go),
// then of each timer's row, so replicas firing one timer at once queue on
// it: the first fires it, the others find it gone. Each message is
// appended under a savepoint, so one that every mailbox refuses rolls
// back alone.
func (s *Store) FireTimers(ctx context.Context, timers []store.Timer, bound mailbox.Bound, expire func(store.Timer, json.RawMessage) (store.TimerFiring, error)) ([]store.FiredTimer, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var (
		fired []store.FiredTimer
		errs  []error
	)
	err := s.db.Write(ctx, func(tx pgx.Tx) error {
		fired, errs = fired[:0], errs[:0] // the transaction may be retried
		// The timers' dialogues first, all of them, in id order (the
		// lock order of dialogue.go), then each timer's row: a batch over
		// two dialogues must not hold a mailbox of the first while it waits
		// for the second.
		ids := make([]string, len(timers))
		for i, t := range timers {
			ids[i] = t.Dialogue
		}
		if err := lockDialogues(ctx, tx, ids...); err != nil {
			return err
		}
		for _, t := range timers {
			var at int64
			err := tx.QueryRow(ctx, `SELECT at_ns FROM timers WHERE dialogue = $1 AND counterpart = $2 AND name = $3 FOR UPDATE`,
				t.Dialogue, t.Counterpart, t.Name).Scan(&at)
			if errors.Is(err, pgx.ErrNoRows) || (err == nil && at != t.Due().UnixNano()) {
				continue
			}
			if err != nil {
				return err
			}
			p := store.Pair{A: t.Initiator, B: t.Counterpart}
			prev, err := pairState(ctx, tx, t.Dialogue, p)
			if err != nil {
				return err
			}
			f, err := expire(t, prev)
			if err != nil {
				errs = append(errs, fmt.Errorf("deadline %s of dialogue %s, %s: %w", t.Name, t.Dialogue, t.Counterpart, err))
				continue
			}
			out := store.FiredTimer{Timer: t, Prev: prev, Next: f.State}
			if f.Mail.ID != "" {
				if out.Delivered, err = s.appendSaved(ctx, tx, f.Mail, f.Recipients, bound); err != nil {
					return err
				}
			}
			if f.State != nil {
				k := p.Key()
				if _, err := tx.Exec(ctx, `INSERT INTO dialogue_pairs (dialogue, a, b, state) VALUES ($1, $2, $3, $4)
ON CONFLICT (dialogue, a, b) DO UPDATE SET state = excluded.state`, t.Dialogue, k.A, k.B, []byte(f.State)); err != nil {
					return err
				}
			}
			if _, err := tx.Exec(ctx, `DELETE FROM timers WHERE dialogue = $1 AND counterpart = $2 AND name = $3`, t.Dialogue, t.Counterpart, t.Name); err != nil {
				return err
			}
			fired = append(fired, out)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return fired, errors.Join(errs...)
}

// appendSaved appends m in tx under a savepoint: a message every mailbox
// refuses, or one already stored, rolls back alone.
func (s *Store) appendSaved(ctx context.Context, tx pgx.Tx, m mailbox.Message, recipients []string, bound mailbox.Bound) (store.Delivered, error) {
	a, err := newAppend(m, recipients)
	if err != nil {
		return store.Delivered{}, err
	}
	sp, err := tx.Begin(ctx)
	if err != nil {
		return store.Delivered{}, err
	}
	err = s.appendTx(ctx, sp, a, bound)
	switch {
	case errors.Is(err, errNothing), errors.Is(err, store.ErrAlreadyExists):
		return store.Delivered{Refused: a.refused}, sp.Rollback(ctx)
	case err != nil:
		_ = sp.Rollback(ctx)
		return store.Delivered{}, err
	}
	return store.Delivered{Deliveries: a.delivered, Refused: a.refused}, sp.Commit(ctx)
}
