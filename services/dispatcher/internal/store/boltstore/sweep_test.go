package boltstore

import (
	"fmt"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

// An entry of the payments' sweep index that names no payment (a
// stale entry, left by a bug) is dropped and counted like any other, so
// that the batched sweep moves past it: counted as nothing, a batch of
// such entries came back short, store.SweepInBatches stopped, and the
// payments due behind them were never swept.
func TestSweepPayments_dropsStaleIndexEntries(t *testing.T) {
	const stale = store.SweepBatch + 1 // more than one batch
	s, err := Open(t.TempDir(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.db.Update(func(tx *bolt.Tx) error {
		for i := range stale {
			if err := tx.Bucket(bucketSweepPayments).Put(append(putInt(int64(i+1)), fmt.Sprintf("gone%d", i)...), nil); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if n, err := store.SweepInBatches(t.Context(), time.Unix(1000, 0), s.SweepPayments); err != nil || n != stale {
		t.Errorf("SweepPayments in batches over %d stale index entries = %d, %v; want %d", stale, n, err, stale)
	}
	left := 0
	if err := s.db.View(func(tx *bolt.Tx) error {
		left = tx.Bucket(bucketSweepPayments).Stats().KeyN
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("payments_sweep holds %d entries after the sweep, want none", left)
	}
}
