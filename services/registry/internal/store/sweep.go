package store

import (
	"context"
	"time"
)

// SweepBatch bounds the request ids one sweep transaction forgets, so that
// a backlog never makes one long write.
const SweepBatch = 100

// SweepAllRequests calls s.SweepRequests for at most SweepBatch at a time
// until a call drops fewer, and returns how many the calls dropped.
func SweepAllRequests(ctx context.Context, s Store, before time.Time) (int, error) {
	total := 0
	for {
		n, err := s.SweepRequests(ctx, before, SweepBatch)
		total += n
		if err != nil || n < SweepBatch {
			return total, err
		}
	}
}
