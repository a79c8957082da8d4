package store

import (
	"context"
	"time"
)

// SweepBatch bounds what one sweep transaction removes, so that a backlog
// never makes one long write.
const SweepBatch = 100

// SweepInBatches calls sweep (a store's Sweep… method) for at most
// SweepBatch at a time until a call removes fewer, and returns how many
// the calls removed.
func SweepInBatches(ctx context.Context, before time.Time, sweep func(ctx context.Context, before time.Time, limit int) (int, error)) (int, error) {
	total := 0
	for {
		n, err := sweep(ctx, before, SweepBatch)
		total += n
		if err != nil || n < SweepBatch {
			return total, err
		}
	}
}
