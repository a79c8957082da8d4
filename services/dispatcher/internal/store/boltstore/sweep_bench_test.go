package boltstore_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/parleyhq/parley/platform/sweep"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
	"github.com/parleyhq/parley/services/dispatcher/internal/store/boltstore"
)

// BenchmarkSweep_nothingDue is one pass of the conversation and request-id
// sweeps over a store holding 10,000 live conversations and 10,000 live
// request ids, none due: what every periodic pass costs, holding bbolt's
// one writer, when there is nothing to remove.
func BenchmarkSweep_nothingDue(b *testing.B) {
	s, err := boltstore.Open(b.TempDir(), time.Second)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	ctx := b.Context()
	t0 := time.Unix(1_800_000_000, 0)
	const live, writers = 10_000, 64
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			for i := w; i < live; i += writers {
				c := store.Conversation{ID: fmt.Sprint("c", i), Agent: "clients/c/agents/a", Peer: fmt.Sprint("p", i%100), CreateTime: t0, ExpireTime: t0.Add(time.Hour)}
				if err := s.CreateConversation(ctx, c, 0, t0); err != nil {
					errs <- err
					return
				}
				if _, _, err := s.BeginRequest(ctx, "clients/c/agents/a", fmt.Sprint("r", i), t0.Add(time.Hour), t0); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	for b.Loop() {
		if n, err := s.SweepConversations(ctx, t0, sweep.Batch); err != nil || n != 0 {
			b.Fatalf("SweepConversations = %d, %v; want 0", n, err)
		}
		if n, err := s.SweepRequests(ctx, t0, sweep.Batch); err != nil || n != 0 {
			b.Fatalf("SweepRequests = %d, %v; want 0", n, err)
		}
	}
}
