package sweep_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/parleyhq/parley/platform/sweep"
)

// records is a store's sweep in miniature: times in order, of which a
// sweep removes at most limit of those before before, oldest first.
type records struct {
	times []time.Time
	calls []int // the limit of each call
	fail  error // returned by the call after the first
}

func (r *records) sweep(ctx context.Context, before time.Time, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	r.calls = append(r.calls, limit)
	if r.fail != nil && len(r.calls) > 1 {
		return 0, r.fail
	}
	n := 0
	for n < len(r.times) && n < limit && r.times[n].Before(before) {
		n++
	}
	r.times = r.times[n:]
	return n, nil
}

func fill(due, kept int, cut time.Time) *records {
	r := &records{}
	for i := range due {
		r.times = append(r.times, cut.Add(time.Duration(i-due)*time.Second))
	}
	for i := range kept {
		r.times = append(r.times, cut.Add(time.Duration(i)*time.Second))
	}
	return r
}

// InBatches removes everything due, more than one batch, a batch per
// call, and stops at the first short batch.
func TestInBatches_removesMoreThanOneBatch(t *testing.T) {
	cut := time.Unix(1_800_000_000, 0)
	for _, tc := range []struct {
		name      string
		due       int
		wantCalls int
	}{
		{"none due", 0, 1},
		{"a short batch", 7, 1},
		{"exactly one batch", sweep.Batch, 2},
		{"two batches and one more", 2*sweep.Batch + 1, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := fill(tc.due, 3, cut)
			n, err := sweep.InBatches(t.Context(), cut, r.sweep)
			if err != nil || n != tc.due {
				t.Errorf("InBatches = %d, %v; want %d", n, err, tc.due)
			}
			if len(r.times) != 3 {
				t.Errorf("%d records left, want the 3 not due", len(r.times))
			}
			if len(r.calls) != tc.wantCalls || slices.ContainsFunc(r.calls, func(l int) bool { return l != sweep.Batch }) {
				t.Errorf("sweep called with limits %v, want %d calls of %d", r.calls, tc.wantCalls, sweep.Batch)
			}
		})
	}
}

// A failing call ends InBatches with its error and what the calls before
// it removed.
func TestInBatches_stopsAtAnError(t *testing.T) {
	cut := time.Unix(1_800_000_000, 0)
	r := fill(3*sweep.Batch, 0, cut)
	r.fail = errors.New("disk on fire")
	n, err := sweep.InBatches(t.Context(), cut, r.sweep)
	if !errors.Is(err, r.fail) || n != sweep.Batch {
		t.Errorf("InBatches = %d, %v; want %d and the second call's error", n, err, sweep.Batch)
	}
}
