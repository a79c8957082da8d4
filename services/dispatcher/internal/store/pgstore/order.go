package pgstore

import (
	"context"
	"encoding/json"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/parleyhq/parley/platform/resource"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

var _ store.OrderStore = (*Store)(nil)

// RecordOrder implements store.OrderStore, in one SERIALIZABLE transaction
// that takes its dialogue's lock first, as the dialogue's other writers
// (which run at READ COMMITTED under it, see dialogue.go) do: it queues
// behind them instead of writing over what they recorded.
func (s *Store) RecordOrder(ctx context.Context, o store.Order, tr store.OrderTransition, open bool) (store.Order, error) {
	if err := ctx.Err(); err != nil {
		return store.Order{}, err
	}
	var out store.Order
	err := s.db.Update(ctx, func(tx pgx.Tx) error {
		if err := lockDialogues(ctx, tx, o.Dialogue); err != nil {
			return err
		}
		var err error
		out, err = recordOrder(ctx, tx, o, tr, open)
		return err
	})
	if err != nil {
		return store.Order{}, err
	}
	return out, nil
}

// recordOrder is RecordOrder inside tx.
func recordOrder(ctx context.Context, tx pgx.Tx, o store.Order, tr store.OrderTransition, open bool) (store.Order, error) {
	k := store.Pair{A: o.Consumer, B: o.Supplier}.Key()
	var out store.Order
	err := func() error {
		var cur store.Order
		ok, err := getJSON(ctx, tx, &cur, `SELECT data FROM orders WHERE dialogue = $1 AND a = $2 AND b = $3`, o.Dialogue, k.A, k.B)
		switch {
		case err != nil:
			return err
		case ok:
		case !open:
			return resource.NotFound("order of dialogue", o.Dialogue+" "+o.Supplier)
		default:
			var taken bool
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM orders WHERE id = $1)`, o.ID).Scan(&taken); err != nil {
				return err
			}
			if taken {
				return resource.AlreadyExists("order", o.ID)
			}
			cur = store.Order{ID: o.ID, Dialogue: o.Dialogue, Protocol: o.Protocol, Consumer: o.Consumer, Supplier: o.Supplier, CreateTime: tr.Time}
			if _, err := tx.Exec(ctx, `INSERT INTO agent_orders (agent, order_id) VALUES ($1, $3), ($2, $3) ON CONFLICT DO NOTHING`, o.Consumer, o.Supplier, o.ID); err != nil {
				return err
			}
		}
		changed := cur.Apply(tr)
		out = cur
		if !changed {
			return nil // a retry
		}
		var lapse *int64
		if at := cur.LapseAt(); !at.IsZero() {
			ns := at.UnixNano()
			lapse = &ns
		}
		_, err = tx.Exec(ctx, `INSERT INTO orders (id, dialogue, a, b, state, lapse_ns, data) VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (id) DO UPDATE SET state = excluded.state, lapse_ns = excluded.lapse_ns, data = excluded.data`, cur.ID, cur.Dialogue, k.A, k.B, string(cur.State), lapse, marshal(cur))
		return err
	}()
	return out, err
}

// GetOrder implements store.OrderStore.
func (s *Store) GetOrder(ctx context.Context, id string) (store.Order, error) {
	var o store.Order
	return o, s.getJSON(ctx, &o, "order", `SELECT data FROM orders WHERE id = $1`, id)
}

// ListOrders implements store.OrderStore.
func (s *Store) ListOrders(ctx context.Context, agent string, state store.OrderState, now time.Time, after string, limit int) ([]store.Order, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// An active order whose lapse_ns has passed stands failed (Order.At).
	rows, err := s.db.Pool().Query(ctx, `SELECT o.data FROM agent_orders ao JOIN orders o ON o.id = ao.order_id
WHERE ao.agent = $1 AND ao.order_id > $2
  AND ($3 = '' OR (CASE WHEN o.state = 'active' AND o.lapse_ns <= $5 THEN 'failed' ELSE o.state END) = $3)
ORDER BY ao.order_id LIMIT $4`, agent, after, string(state), limit, now.UnixNano())
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Order, error) {
		var (
			o    store.Order
			data []byte
		)
		if err := r.Scan(&data); err != nil {
			return o, err
		}
		return o, json.Unmarshal(data, &o)
	})
}
