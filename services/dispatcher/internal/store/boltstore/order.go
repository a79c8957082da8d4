package boltstore

import (
	"bytes"
	"context"
	"time"

	"github.com/parleyhq/parley/platform/boltdb"
	"github.com/parleyhq/parley/platform/resource"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

// The order buckets (store.OrderStore). Nothing ever deletes from them.
var (
	// bucketOrders: order id → JSON store.Order, its trail included.
	bucketOrders = []byte("orders")
	// bucketPairOrders: dialogue id + 0x00 + agent A + 0x00 + agent B
	// (A < B: pairKey) → order id.
	bucketPairOrders = []byte("pair_orders")
	// bucketAgentOrders: agent + 0x00 + order id → empty, for both parties.
	bucketAgentOrders = []byte("agent_orders")
)

var orderBuckets = [][]byte{bucketOrders, bucketPairOrders, bucketAgentOrders}

var _ store.OrderStore = (*Store)(nil)

// RecordOrder implements store.OrderStore.
func (s *Store) RecordOrder(ctx context.Context, o store.Order, tr store.OrderTransition, open bool) (store.Order, error) {
	if err := ctx.Err(); err != nil {
		return store.Order{}, err
	}
	var out store.Order
	err := s.db.Update(func(tx *boltdb.Tx) error {
		var err error
		out, err = recordOrder(tx, o, tr, open)
		return err
	})
	return out, err
}

// recordOrder is RecordOrder inside tx.
func recordOrder(tx *boltdb.Tx, o store.Order, tr store.OrderTransition, open bool) (store.Order, error) {
	orders, pairs := tx.Bucket(bucketOrders), tx.Bucket(bucketPairOrders)
	pk := pairKey(o.Dialogue, store.Pair{A: o.Consumer, B: o.Supplier})
	id := pairs.Get(pk)
	var cur store.Order
	switch {
	case id != nil:
		if ok, err := getJSON(orders, id, &cur); err != nil || !ok {
			return store.Order{}, resource.NotFound("order", string(id)) // an index without its record: never written so
		}
	case !open:
		return store.Order{}, resource.NotFound("order of dialogue", o.Dialogue+" "+o.Supplier)
	default:
		if orders.Get([]byte(o.ID)) != nil {
			return store.Order{}, resource.AlreadyExists("order", o.ID)
		}
		cur = store.Order{ID: o.ID, Dialogue: o.Dialogue, Protocol: o.Protocol, Consumer: o.Consumer, Supplier: o.Supplier, CreateTime: tr.Time}
		if err := pairs.Put(pk, []byte(o.ID)); err != nil {
			return store.Order{}, err
		}
		for _, a := range []string{o.Consumer, o.Supplier} {
			if err := tx.Bucket(bucketAgentOrders).Put(join(a, o.ID), nil); err != nil {
				return store.Order{}, err
			}
		}
	}
	if !cur.Apply(tr) {
		return cur, nil // a retry
	}
	return cur, putJSON(orders, []byte(cur.ID), cur)
}

// GetOrder implements store.OrderStore.
func (s *Store) GetOrder(ctx context.Context, id string) (store.Order, error) {
	if err := ctx.Err(); err != nil {
		return store.Order{}, err
	}
	var o store.Order
	err := s.db.View(func(tx *boltdb.Tx) error {
		ok, err := getJSON(tx.Bucket(bucketOrders), []byte(id), &o)
		if err == nil && !ok {
			return resource.NotFound("order", id)
		}
		return err
	})
	return o, err
}

// ListOrders implements store.OrderStore.
func (s *Store) ListOrders(ctx context.Context, agent string, state store.OrderState, now time.Time, after string, limit int) ([]store.Order, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var out []store.Order
	err := s.db.View(func(tx *boltdb.Tx) error {
		prefix := join(agent, "")
		c := tx.Bucket(bucketAgentOrders).Cursor()
		k, _ := c.Seek(join(agent, after))
		if after != "" && k != nil && bytes.Equal(k, join(agent, after)) {
			k, _ = c.Next()
		}
		orders := tx.Bucket(bucketOrders)
		for ; k != nil && bytes.HasPrefix(k, prefix) && len(out) < limit; k, _ = c.Next() {
			var o store.Order
			if ok, err := getJSON(orders, k[len(prefix):], &o); err != nil || !ok {
				return err
			}
			if state == "" || o.At(now).State == state {
				out = append(out, o)
			}
		}
		return nil
	})
	return out, err
}
