// Package sweep runs a store's sweep of old records in bounded
// transactions, whatever the backend: a sweep removes at most Batch
// records per call, oldest first, and InBatches calls it until a call
// comes back short. A backlog so never makes one long write.
//
// A sweep function counts what it consumed from its time order, the
// records it removed and any stale index entries it dropped, so that a
// batch of stale entries is not taken for the end.
package sweep

import (
	"context"
	"time"
)

// Batch is the most records one call of a sweep removes.
const Batch = 100

// Func removes up to limit records due before before, oldest first, and
// returns how many it consumed; fewer than limit means none is left.
type Func func(ctx context.Context, before time.Time, limit int) (int, error)

// InBatches calls sweep with Batch at a time until a call consumes fewer
// or fails, and returns what the calls consumed, with the error.
func InBatches(ctx context.Context, before time.Time, sweep Func) (int, error) {
	total := 0
	for {
		n, err := sweep(ctx, before, Batch)
		total += n
		if err != nil || n < Batch {
			return total, err
		}
	}
}
