package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/parleyhq/parley/platform/resource"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

var _ store.PaymentStore = (*Store)(nil)

// CreatePayment implements store.PaymentStore, in one SERIALIZABLE
// transaction, so that two replicas cannot both pass the payer's limit or
// both use one request id.
func (s *Store) CreatePayment(ctx context.Context, p store.Payment, requestID string, check func(open int) error) (store.Payment, bool, error) {
	if err := ctx.Err(); err != nil {
		return store.Payment{}, false, err
	}
	out, created := p, true
	err := s.db.Update(ctx, func(tx pgx.Tx) error {
		out, created = p, true // the transaction may be retried
		if requestID != "" {
			ok, err := getJSON(ctx, tx, &out, `SELECT p.data FROM payment_requests r JOIN payments p ON p.id = r.payment_id
WHERE r.payer = $1 AND r.request_id = $2`, p.Payer, requestID)
			if err != nil || ok {
				created = false
				return err
			}
			out = p
		}
		if check != nil {
			var open int
			if err := tx.QueryRow(ctx, `SELECT count(*) FROM payments WHERE payer = $1 AND open`, p.Payer).Scan(&open); err != nil {
				return err
			}
			if err := check(open); err != nil {
				return err
			}
		}
		tag, err := tx.Exec(ctx, `INSERT INTO payments (id, data, payer, open, sweep_ns) VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING`,
			p.ID, marshal(p), p.Payer, p.State != store.PaymentCaptured, sweepNs(p))
		switch {
		case err != nil:
			return err
		case tag.RowsAffected() == 0:
			return resource.AlreadyExists("payment", p.ID)
		case requestID == "":
			return nil
		}
		_, err = tx.Exec(ctx, `INSERT INTO payment_requests (payer, request_id, payment_id, recorded_ns) VALUES ($1, $2, $3, $4)
ON CONFLICT (payer, request_id) DO UPDATE SET payment_id = excluded.payment_id, recorded_ns = excluded.recorded_ns`,
			p.Payer, requestID, p.ID, p.CreateTime.UnixNano())
		return err
	})
	if err != nil {
		return store.Payment{}, false, err
	}
	return out, created, nil
}

// sweepNs is payments.sweep_ns for p: its update time unless reserved.
func sweepNs(p store.Payment) *int64 {
	if p.State == store.PaymentReserved {
		return nil
	}
	ns := p.UpdateTime.UnixNano()
	return &ns
}

// SweepPayments implements store.PaymentStore: one DELETE of the oldest
// due rows through the partial index payments_sweep. Rows another
// transaction holds (an update under way) are skipped, not waited for:
// the next sweep sees them as they are then.
func (s *Store) SweepPayments(ctx context.Context, before time.Time, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	tag, err := s.db.Pool().Exec(ctx, `DELETE FROM payments WHERE id IN (
  SELECT id FROM payments WHERE sweep_ns < $1 ORDER BY sweep_ns LIMIT $2 FOR UPDATE SKIP LOCKED)`, before.UnixNano(), limit)
	if err != nil {
		return 0, err
	}
	return int(tag.RowsAffected()), nil
}

// SweepPaymentRequests implements store.PaymentStore: one DELETE of the
// oldest due rows through the index payment_requests_by_time, skipping
// rows another transaction holds.
func (s *Store) SweepPaymentRequests(ctx context.Context, before time.Time, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	tag, err := s.db.Pool().Exec(ctx, `DELETE FROM payment_requests WHERE (payer, request_id) IN (
  SELECT payer, request_id FROM payment_requests WHERE recorded_ns < $1 ORDER BY recorded_ns LIMIT $2 FOR UPDATE SKIP LOCKED)`,
		before.UnixNano(), limit)
	if err != nil {
		return 0, err
	}
	return int(tag.RowsAffected()), nil
}

// GetPayment implements store.PaymentStore.
func (s *Store) GetPayment(ctx context.Context, id string) (store.Payment, error) {
	var p store.Payment
	return p, s.getJSON(ctx, &p, "payment", `SELECT data FROM payments WHERE id = $1`, id)
}

// UpdatePayment implements store.PaymentStore, in one SERIALIZABLE
// transaction.
func (s *Store) UpdatePayment(ctx context.Context, id string, mutate func(*store.Payment) error) (store.Payment, error) {
	if err := ctx.Err(); err != nil {
		return store.Payment{}, err
	}
	var out store.Payment
	err := s.db.Update(ctx, func(tx pgx.Tx) error {
		var p store.Payment
		ok, err := getJSON(ctx, tx, &p, `SELECT data FROM payments WHERE id = $1 FOR UPDATE`, id)
		switch {
		case err != nil:
			return err
		case !ok:
			return resource.NotFound("payment", id)
		}
		if err := mutate(&p); err != nil {
			return err
		}
		out = p
		_, err = tx.Exec(ctx, `UPDATE payments SET data = $2, open = $3, sweep_ns = $4 WHERE id = $1`,
			id, marshal(p), p.State != store.PaymentCaptured, sweepNs(p))
		return err
	})
	if err != nil {
		return store.Payment{}, err
	}
	return out, nil
}

// AddSpend implements store.PaymentStore, in one SERIALIZABLE transaction,
// so that two replicas cannot both pass a limit.
func (s *Store) AddSpend(ctx context.Context, sp store.Spend, check func(dayTotal int64) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.Update(ctx, func(tx pgx.Tx) error {
		var counted bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM spend_orders WHERE agent = $1 AND order_id = $2)`, sp.Agent, sp.Order).Scan(&counted); err != nil {
			return err
		}
		if counted {
			return nil
		}
		var total int64
		if err := tx.QueryRow(ctx, `SELECT COALESCE(SUM(amount_micros), 0) FROM spend_orders WHERE agent = $1 AND day = $2`, sp.Agent, sp.Day).Scan(&total); err != nil {
			return err
		}
		if err := check(total); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO spend_orders (agent, order_id, day, amount_micros) VALUES ($1, $2, $3, $4)`, sp.Agent, sp.Order, sp.Day, sp.AmountMicros)
		return err
	})
}

// RemoveSpend implements store.PaymentStore.
func (s *Store) RemoveSpend(ctx context.Context, agent, order string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	_, err := s.db.Pool().Exec(ctx, `DELETE FROM spend_orders WHERE agent = $1 AND order_id = $2`, agent, order)
	return err
}

// SweepSpends implements store.PaymentStore: one DELETE of the rows of
// the oldest due days through the index spend_orders_by_sweep, skipping
// rows another transaction holds. A day's total is the sum of its rows,
// so it loses what goes.
func (s *Store) SweepSpends(ctx context.Context, before time.Time, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	tag, err := s.db.Pool().Exec(ctx, `DELETE FROM spend_orders WHERE (agent, order_id) IN (
  SELECT agent, order_id FROM spend_orders WHERE day < $1 ORDER BY day LIMIT $2 FOR UPDATE SKIP LOCKED)`,
		before.UTC().Format(time.DateOnly), limit)
	if err != nil {
		return 0, err
	}
	return int(tag.RowsAffected()), nil
}

// SetOfferTerms implements store.PaymentStore.
func (s *Store) SetOfferTerms(ctx context.Context, dialogue, supplier, id string, terms json.RawMessage) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.Write(ctx, func(tx pgx.Tx) error {
		// The dialogue's row is share-locked until the terms commit:
		// SweepDialogues locks the rows it removes FOR UPDATE SKIP LOCKED
		// first, so it either removed this dialogue before (nothing to
		// lock: refused) or leaves it to a later sweep, which takes these
		// terms with it.
		var one int
		err := tx.QueryRow(ctx, `SELECT 1 FROM dialogues WHERE id = $1 FOR KEY SHARE`, dialogue).Scan(&one)
		if errors.Is(err, pgx.ErrNoRows) {
			return resource.NotFound("dialogue", dialogue)
		}
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO offer_terms (dialogue, supplier, message_id, terms) VALUES ($1, $2, $3, $4)
ON CONFLICT (dialogue, supplier, message_id) DO UPDATE SET terms = excluded.terms, seq = nextval(pg_get_serial_sequence('offer_terms', 'seq'))`,
			dialogue, supplier, id, []byte(terms))
		return err
	})
}

// RemoveOfferTerms implements store.PaymentStore.
func (s *Store) RemoveOfferTerms(ctx context.Context, dialogue, supplier, id string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	_, err := s.db.Pool().Exec(ctx, `DELETE FROM offer_terms WHERE dialogue = $1 AND supplier = $2 AND message_id = $3`, dialogue, supplier, id)
	return err
}

// OfferTerms implements store.PaymentStore: the message's terms.
func (s *Store) OfferTerms(ctx context.Context, dialogue, supplier, id string) (json.RawMessage, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var terms []byte
	err := s.db.Pool().QueryRow(ctx, `SELECT terms FROM offer_terms WHERE dialogue = $1 AND supplier = $2 AND message_id = $3`,
		dialogue, supplier, id).Scan(&terms)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	return terms, err
}
