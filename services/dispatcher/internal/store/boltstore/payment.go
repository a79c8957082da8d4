package boltstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"time"

	"github.com/parleyhq/parley/platform/boltdb"
	"github.com/parleyhq/parley/platform/resource"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

// The payment buckets (store.PaymentStore).
var (
	// bucketPayments: payment id → JSON store.Payment.
	bucketPayments = []byte("payments")
	// bucketSpendDays: agent + 0x00 + day → 8-byte big-endian micro-USD total.
	bucketSpendDays = []byte("spend_days")
	// bucketSpendOrders: agent + 0x00 + order id → day + 0x00 + 8-byte
	// big-endian amount, so that an order counts once and can be taken back.
	bucketSpendOrders = []byte("spend_orders")
	// bucketOfferTerms: dialogue + 0x00 + supplier + 0x00 + message id →
	// 8 bytes of sequence number (big-endian: the order recorded), then
	// the terms, JSON.
	bucketOfferTerms = []byte("offer_terms")
	// bucketPaymentRequests: payer + 0x00 + request id → payment id + 0x00
	// + 8-byte big-endian Unix nanoseconds recorded (AIP-155).
	bucketPaymentRequests = []byte("payment_requests")
	// bucketOpenPayments: payer + 0x00 + payment id → empty, for each
	// payment not captured (schema version 4), so that CreatePayment
	// counts a payer's open payments with one prefix walk.
	bucketOpenPayments = []byte("payments_open")
	// bucketSweepPayments: 8-byte big-endian Unix nanoseconds of the
	// payment's UpdateTime + payment id → empty, for each payment not
	// reserved (schema version 5), so that SweepPayments walks only what
	// it removes.
	bucketSweepPayments = []byte("payments_sweep")
	// bucketSweepPaymentRequests: 8-byte big-endian Unix nanoseconds
	// recorded + the bucketPaymentRequests key → empty, one per request id
	// (schema version 6), so that SweepPaymentRequests walks only what it
	// forgets.
	bucketSweepPaymentRequests = []byte("payment_requests_sweep")
	// bucketSweepSpends: day + 0x00 + the bucketSpendOrders key → empty,
	// one per counted order (schema version 10), so that SweepSpends
	// walks only what it removes, the oldest day first.
	bucketSweepSpends = []byte("spend_sweep")
)

var paymentBuckets = [][]byte{bucketPayments, bucketSpendDays, bucketSpendOrders, bucketOfferTerms, bucketPaymentRequests, bucketOpenPayments, bucketSweepPayments, bucketSweepPaymentRequests, bucketSweepSpends}

var _ store.PaymentStore = (*Store)(nil)

// CreatePayment implements store.PaymentStore.
func (s *Store) CreatePayment(ctx context.Context, p store.Payment, requestID string, check func(open int) error) (store.Payment, bool, error) {
	if err := ctx.Err(); err != nil {
		return store.Payment{}, false, err
	}
	out, created := p, true
	err := s.db.Update(func(tx *boltdb.Tx) error {
		out, created = p, true // the transaction may be retried
		b, requests := tx.Bucket(bucketPayments), tx.Bucket(bucketPaymentRequests)
		rk := join(p.Payer, requestID)
		var recorded []byte // the id's earlier record, whose payment is gone
		if requestID != "" {
			if v := requests.Get(rk); v != nil {
				recorded = v
				id, _, _ := bytes.Cut(v, []byte{0})
				ok, err := getJSON(b, id, &out)
				if err != nil || ok {
					created = false
					return err
				}
				out = p // the payment is gone: the id names nothing
			}
		}
		if b.Get([]byte(p.ID)) != nil {
			return resource.AlreadyExists("payment", p.ID)
		}
		if check != nil {
			if err := check(countPrefix(tx.Bucket(bucketOpenPayments), append([]byte(p.Payer), 0))); err != nil {
				return err
			}
		}
		if requestID != "" {
			if err := recordRequest(tx, rk, recorded, p.ID, p.CreateTime); err != nil {
				return err
			}
		}
		if err := indexPayment(tx, nil, &p); err != nil {
			return err
		}
		return putJSON(b, []byte(p.ID), p)
	})
	if err != nil {
		return store.Payment{}, false, err
	}
	return out, created, nil
}

// indexPayment moves a payment's index entries from what old needed to
// what p needs (either may be nil): bucketOpenPayments holds it unless
// captured, bucketSweepPayments unless reserved.
func indexPayment(tx *boltdb.Tx, old, p *store.Payment) error {
	open, sweep := tx.Bucket(bucketOpenPayments), tx.Bucket(bucketSweepPayments)
	if old != nil {
		if err := open.Delete(join(old.Payer, old.ID)); err != nil {
			return err
		}
		if err := sweep.Delete(sweepKey(*old)); err != nil {
			return err
		}
	}
	if p == nil {
		return nil
	}
	if p.State != store.PaymentCaptured {
		if err := open.Put(join(p.Payer, p.ID), nil); err != nil {
			return err
		}
	}
	if p.State != store.PaymentReserved {
		return sweep.Put(sweepKey(*p), nil)
	}
	return nil
}

func sweepKey(p store.Payment) []byte {
	return append(putInt(p.UpdateTime.UnixNano()), p.ID...)
}

// recordRequest records the request id key rk (payer + 0x00 + id) as
// naming payment at time at, replacing the earlier record old (nil when
// none) in bucketPaymentRequests and bucketSweepPaymentRequests.
func recordRequest(tx *boltdb.Tx, rk, old []byte, payment string, at time.Time) error {
	sweep := tx.Bucket(bucketSweepPaymentRequests)
	if old != nil {
		if err := sweep.Delete(append(bytes.Clone(requestTime(old)), rk...)); err != nil {
			return err
		}
	}
	ns := putInt(at.UnixNano())
	if err := sweep.Put(append(bytes.Clone(ns), rk...), nil); err != nil {
		return err
	}
	return tx.Bucket(bucketPaymentRequests).Put(rk, append(append([]byte(payment), 0), ns...))
}

// requestTime is the 8-byte time of a bucketPaymentRequests value; a value
// without one (never written) reads as time 0, due at once.
func requestTime(v []byte) []byte {
	if _, at, ok := bytes.Cut(v, []byte{0}); ok && len(at) == 8 {
		return at
	}
	return putInt(0)
}

// SweepPayments implements store.PaymentStore. It counts the index
// entries it consumes: one naming no payment (stale) is dropped and
// counted too, so that sweep.InBatches moves past it instead of
// stopping at a short batch before the payments due behind it. So is one
// naming a payment not due by its own time (updated later, or reserved
// again), which stays, its own entry put back.
func (s *Store) SweepPayments(ctx context.Context, before time.Time, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	n := 0
	err := s.db.Update(func(tx *boltdb.Tx) error {
		b, sweep := tx.Bucket(bucketPayments), tx.Bucket(bucketSweepPayments)
		keys := dueKeys(sweep, before, limit)
		for _, k := range keys {
			id := k[8:]
			var p store.Payment
			ok, err := getJSON(b, id, &p)
			if err != nil {
				return err
			}
			if err := sweep.Delete(k); err != nil {
				return err
			}
			if !ok {
				continue
			}
			if p.State == store.PaymentReserved || !p.UpdateTime.Before(before) {
				if err := indexPayment(tx, &p, &p); err != nil { // its own entries, if any
					return err
				}
				continue
			}
			if err := indexPayment(tx, &p, nil); err != nil {
				return err
			}
			if err := b.Delete(id); err != nil {
				return err
			}
		}
		n = len(keys)
		return nil
	})
	return n, err
}

// dueKeys returns, earliest first, up to limit keys of the sweep index b
// (an 8-byte Unix-nanosecond time, then the record's key) whose time is
// before before. They are copies, collected before the caller deletes
// anything: a bbolt cursor skips keys deleted while it walks.
func dueKeys(b *boltdb.Bucket, before time.Time, limit int) [][]byte {
	var keys [][]byte
	c, cut := b.Cursor(), before.UnixNano()
	for k, _ := c.First(); len(k) > 8 && readInt(k[:8]) < cut && len(keys) < limit; k, _ = c.Next() {
		keys = append(keys, bytes.Clone(k))
	}
	return keys
}

// sweepIndexed removes what the due entries of the sweep index name, as
// every batched sweep does. Each entry goes. look reads the record the
// entry k names and returns the entry the record's own time gives (own;
// nil when there is no record, or it is out of the sweep) and whether
// that time is due: a record not due stays, its own entry put back (one
// left by an older version, or moved by an update, is so repaired); a due
// one loses its own entry too and remove removes it.
func sweepIndexed(index *boltdb.Bucket, due [][]byte, look func(k []byte) (own []byte, isDue bool, err error), remove func(k []byte) error) error {
	for _, k := range due {
		if err := index.Delete(k); err != nil {
			return err
		}
		own, isDue, err := look(k)
		if err != nil {
			return err
		}
		switch {
		case own == nil: // a stale entry, or out of the sweep
			continue
		case !isDue:
			if err := index.Put(own, nil); err != nil {
				return err
			}
			continue
		case !bytes.Equal(own, k):
			if err := index.Delete(own); err != nil {
				return err
			}
		}
		if err := remove(k); err != nil {
			return err
		}
	}
	return nil
}

// countPrefix counts the keys of b that start with prefix.
func countPrefix(b *boltdb.Bucket, prefix []byte) int {
	n := 0
	c := b.Cursor()
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
		n++
	}
	return n
}

// migratePaymentIndexes builds bucketOpenPayments (schema version 4) and
// bucketSweepPayments (5) from the payments.
func migratePaymentIndexes(tx *boltdb.Tx) error {
	var open []store.Payment
	err := tx.Bucket(bucketPayments).ForEach(func(_, v []byte) error {
		var p store.Payment
		if err := json.Unmarshal(v, &p); err != nil {
			return err
		}
		open = append(open, p)
		return nil
	})
	if err != nil {
		return err
	}
	for _, p := range open {
		if err := indexPayment(tx, &p, &p); err != nil {
			return err
		}
	}
	return nil
}

// migratePaymentRequestIndex builds bucketSweepPaymentRequests (schema
// version 6) from bucketPaymentRequests.
func migratePaymentRequestIndex(tx *boltdb.Tx) error {
	sweep := tx.Bucket(bucketSweepPaymentRequests)
	return tx.Bucket(bucketPaymentRequests).ForEach(func(k, v []byte) error {
		return sweep.Put(append(bytes.Clone(requestTime(v)), k...), nil)
	})
}

// SweepPaymentRequests implements store.PaymentStore: it walks
// bucketSweepPaymentRequests from the oldest and checks each entry against
// its record's time: a request recorded later stays (its entry put back),
// an entry naming none goes; both count.
func (s *Store) SweepPaymentRequests(ctx context.Context, before time.Time, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	n := 0
	err := s.db.Update(func(tx *boltdb.Tx) error {
		n = 0
		sweep := tx.Bucket(bucketSweepPaymentRequests)
		old := dueKeys(sweep, before, limit)
		requests := tx.Bucket(bucketPaymentRequests)
		look := func(k []byte) ([]byte, bool, error) {
			v := requests.Get(k[8:])
			if v == nil {
				return nil, false, nil
			}
			at := bytes.Clone(requestTime(v))
			return append(at, k[8:]...), readInt(at) < before.UnixNano(), nil
		}
		n = len(old)
		return sweepIndexed(sweep, old, look, func(k []byte) error { return requests.Delete(k[8:]) })
	})
	return n, err
}

// GetPayment implements store.PaymentStore.
func (s *Store) GetPayment(ctx context.Context, id string) (store.Payment, error) {
	if err := ctx.Err(); err != nil {
		return store.Payment{}, err
	}
	var p store.Payment
	err := s.db.View(func(tx *boltdb.Tx) error {
		ok, err := getJSON(tx.Bucket(bucketPayments), []byte(id), &p)
		if err == nil && !ok {
			err = resource.NotFound("payment", id)
		}
		return err
	})
	return p, err
}

// UpdatePayment implements store.PaymentStore.
func (s *Store) UpdatePayment(ctx context.Context, id string, mutate func(*store.Payment) error) (store.Payment, error) {
	if err := ctx.Err(); err != nil {
		return store.Payment{}, err
	}
	var p store.Payment
	err := s.db.Update(func(tx *boltdb.Tx) error {
		b := tx.Bucket(bucketPayments)
		ok, err := getJSON(b, []byte(id), &p)
		switch {
		case err != nil:
			return err
		case !ok:
			return resource.NotFound("payment", id)
		}
		old := p
		if err := mutate(&p); err != nil {
			return err
		}
		if err := indexPayment(tx, &old, &p); err != nil {
			return err
		}
		return putJSON(b, []byte(id), p)
	})
	return p, err
}

// AddSpend implements store.PaymentStore.
func (s *Store) AddSpend(ctx context.Context, sp store.Spend, check func(dayTotal int64) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.Update(func(tx *boltdb.Tx) error {
		orders, days := tx.Bucket(bucketSpendOrders), tx.Bucket(bucketSpendDays)
		if orders.Get(join(sp.Agent, sp.Order)) != nil {
			return nil
		}
		dk := join(sp.Agent, sp.Day)
		total := readInt(days.Get(dk))
		if err := check(total); err != nil {
			return err
		}
		if err := days.Put(dk, putInt(total+sp.AmountMicros)); err != nil {
			return err
		}
		ork := join(sp.Agent, sp.Order)
		if err := tx.Bucket(bucketSweepSpends).Put(join(sp.Day, string(ork)), nil); err != nil {
			return err
		}
		return orders.Put(ork, append(append([]byte(sp.Day), 0), putInt(sp.AmountMicros)...))
	})
}

// RemoveSpend implements store.PaymentStore.
func (s *Store) RemoveSpend(ctx context.Context, agent, order string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.Update(func(tx *boltdb.Tx) error {
		return removeSpend(tx, join(agent, order))
	})
}

// removeSpend removes the counted order ork (agent + 0x00 + order) from
// bucketSpendOrders and bucketSweepSpends, and its amount from its day's
// total, which goes when it reaches 0 (reading as 0 when absent).
// Removing an order not counted does nothing.
func removeSpend(tx *boltdb.Tx, ork []byte) error {
	orders, days := tx.Bucket(bucketSpendOrders), tx.Bucket(bucketSpendDays)
	v := orders.Get(ork)
	day, amount, found := bytes.Cut(v, []byte{0})
	if !found {
		return nil
	}
	agent, _, _ := bytes.Cut(ork, []byte{0})
	dk := join(string(agent), string(day))
	if err := tx.Bucket(bucketSweepSpends).Delete(join(string(day), string(ork))); err != nil {
		return err
	}
	var err error
	if total := readInt(days.Get(dk)) - readInt(amount); total == 0 {
		err = days.Delete(dk)
	} else {
		err = days.Put(dk, putInt(total))
	}
	if err != nil {
		return err
	}
	return orders.Delete(ork)
}

// SweepSpends implements store.PaymentStore: it walks bucketSweepSpends
// from its first (oldest) day and checks each entry against its order's
// day: an order counted on a later day stays (its entry put back), an
// entry naming none goes; both count.
func (s *Store) SweepSpends(ctx context.Context, before time.Time, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	n := 0
	err := s.db.Update(func(tx *boltdb.Tx) error {
		n = 0
		sweep := tx.Bucket(bucketSweepSpends)
		var due [][]byte // collected first: never delete while walking a cursor
		c, cut := sweep.Cursor(), []byte(before.UTC().Format(time.DateOnly))
		for k, _ := c.First(); k != nil && len(due) < limit; k, _ = c.Next() {
			if day, _, _ := bytes.Cut(k, []byte{0}); bytes.Compare(day, cut) >= 0 {
				break
			}
			due = append(due, bytes.Clone(k))
		}
		look := func(k []byte) ([]byte, bool, error) {
			_, ork, _ := bytes.Cut(k, []byte{0})
			day, _, found := bytes.Cut(tx.Bucket(bucketSpendOrders).Get(ork), []byte{0})
			if !found {
				return nil, false, nil
			}
			return join(string(day), string(ork)), bytes.Compare(day, cut) < 0, nil
		}
		n = len(due)
		return sweepIndexed(sweep, due, look, func(k []byte) error {
			_, ork, _ := bytes.Cut(k, []byte{0})
			return removeSpend(tx, ork)
		})
	})
	return n, err
}

// migrateSpendSweepIndex builds bucketSweepSpends (schema version 10)
// from bucketSpendOrders, and drops the day totals of 0 that RemoveSpend
// left before it deleted them.
func migrateSpendSweepIndex(tx *boltdb.Tx) error {
	sweep := tx.Bucket(bucketSweepSpends)
	err := tx.Bucket(bucketSpendOrders).ForEach(func(k, v []byte) error {
		day, _, _ := bytes.Cut(v, []byte{0})
		return sweep.Put(join(string(day), string(k)), nil)
	})
	if err != nil {
		return err
	}
	days := tx.Bucket(bucketSpendDays)
	var zero [][]byte // collected first: never delete while walking a cursor
	err = days.ForEach(func(k, v []byte) error {
		if readInt(v) == 0 {
			zero = append(zero, bytes.Clone(k))
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, k := range zero {
		if err := days.Delete(k); err != nil {
			return err
		}
	}
	return nil
}

// SetOfferTerms implements store.PaymentStore.
func (s *Store) SetOfferTerms(ctx context.Context, dialogue, supplier, id string, terms json.RawMessage) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.Update(func(tx *boltdb.Tx) error {
		// In the transaction: SweepDialogues removes a dialogue and its
		// terms in one, so these are swept with it or never written.
		if tx.Bucket(bucketDialogues).Get([]byte(dialogue)) == nil {
			return resource.NotFound("dialogue", dialogue)
		}
		b := tx.Bucket(bucketOfferTerms)
		seq, err := b.NextSequence()
		if err != nil {
			return err
		}
		return b.Put(join(dialogue, supplier, id), append(binary.BigEndian.AppendUint64(nil, seq), terms...))
	})
}

// RemoveOfferTerms implements store.PaymentStore.
func (s *Store) RemoveOfferTerms(ctx context.Context, dialogue, supplier, id string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.Update(func(tx *boltdb.Tx) error {
		return tx.Bucket(bucketOfferTerms).Delete(join(dialogue, supplier, id))
	})
}

// OfferTerms implements store.PaymentStore: the message's terms, after
// their sequence number (which orders a pair's terms; nothing reads it
// since lookups are exact).
func (s *Store) OfferTerms(ctx context.Context, dialogue, supplier, id string) (json.RawMessage, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var out json.RawMessage
	err := s.db.View(func(tx *boltdb.Tx) error {
		if v := tx.Bucket(bucketOfferTerms).Get(join(dialogue, supplier, id)); len(v) >= 8 {
			out = bytes.Clone(v[8:])
		}
		return nil
	})
	return out, err
}

// migrateOfferTerms rewrites the offer terms of schema 7 and before, one
// per pair (dialogue + 0x00 + supplier → terms), as the terms of no
// message of their pair (message id "", sequence 0): what the server
// reads for an acceptance whose chain of messages recorded none.
func migrateOfferTerms(tx *boltdb.Tx) error {
	b := tx.Bucket(bucketOfferTerms)
	var old [][2][]byte
	err := b.ForEach(func(k, v []byte) error {
		if bytes.Count(k, []byte{0}) == 1 {
			old = append(old, [2][]byte{bytes.Clone(k), bytes.Clone(v)})
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, kv := range old {
		if err := b.Delete(kv[0]); err != nil {
			return err
		}
		if err := b.Put(append(kv[0], 0), append(make([]byte, 8), kv[1]...)); err != nil {
			return err
		}
	}
	return nil
}

func readInt(b []byte) int64 {
	if len(b) != 8 {
		return 0
	}
	return int64(binary.BigEndian.Uint64(b)) //nolint:gosec // stored by putInt
}

func putInt(v int64) []byte { return binary.BigEndian.AppendUint64(nil, uint64(v)) } //nolint:gosec // read back by readInt
