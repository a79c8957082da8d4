package boltstore_test

import (
	"fmt"
	"testing"
	"time"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/sweep"
	"github.com/parleyhq/parley/services/registry/internal/store/boltstore"
)

// SweepRequests in batches (sweep.InBatches, as the app sweeps) forgets
// more request ids than one sweep transaction may (sweep.Batch): it sweeps
// until none is left.
func TestSweepRequests_inBatchesDropsMoreThanOneBatch(t *testing.T) {
	s, err := boltstore.Open(t.TempDir(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx := t.Context()
	const due = 2*sweep.Batch + 1
	for i := range due {
		a := &registryv1.Agent{Name: fmt.Sprintf("clients/acme/agents/w%d", i)}
		if _, err := s.CreateAgent(ctx, a, nil, fmt.Sprint("create-", i)); err != nil {
			t.Fatal(err)
		}
	}
	later := time.Now().Add(time.Hour)
	if n, err := sweep.InBatches(ctx, later, s.SweepRequests); err != nil || n != due {
		t.Errorf("sweep.InBatches(SweepRequests) = %d, %v; want %d dropped", n, err, due)
	}
	if n, err := s.SweepRequests(ctx, later, due); err != nil || n != 0 {
		t.Errorf("SweepRequests after sweep.InBatches = %d, %v; want none left", n, err)
	}
}
