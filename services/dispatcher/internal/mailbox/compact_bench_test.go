package mailbox_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
)

// BenchmarkCompact times one compaction pass (Compact in batches of 1000)
// over n mailboxes that have each acknowledged one message. nothing-due:
// the messages are within the retention, so the pass removes nothing; its
// cost is what the periodic sweep pays for mailboxes with no work, and,
// being a write transaction, holds up every append meanwhile. all-due:
// every message is past the retention and the pass removes them all
// (ns/op over n references). The reference is nothing-due with one
// mailbox: one empty write transaction.
//
// Run: go test -run '^$' -bench Compact -benchtime 5x ./internal/mailbox/
func BenchmarkCompact(b *testing.B) {
	for _, n := range []int{1, 10_000, 100_000} {
		agents := make([]string, n)
		for i := range agents {
			agents[i] = fmt.Sprintf("clients/c%d/agents/a%d", i%100, i)
		}
		b.Run(fmt.Sprintf("nothing-due/mailboxes=%d", n), func(b *testing.B) {
			now := time.Now()
			m := newMailboxes(b, mailbox.Options{Retention: time.Hour, Now: func() time.Time { return now }})
			fillAcknowledged(b, m, "m", agents)
			for b.Loop() {
				if k, err := m.Compact(b.Context(), 1000); err != nil || k != 0 {
					b.Fatalf("Compact = %d, %v; want 0", k, err)
				}
			}
		})
		if n > 10_000 {
			continue // all-due refills every round: 10,000 at most
		}
		b.Run(fmt.Sprintf("all-due/mailboxes=%d", n), func(b *testing.B) {
			now := time.Now()
			m := newMailboxes(b, mailbox.Options{Retention: time.Hour, Now: func() time.Time { return now }})
			i := 0
			for b.Loop() {
				b.StopTimer()
				i++
				now = now.Add(-2 * time.Hour) // appended two hours before the pass
				fillAcknowledged(b, m, fmt.Sprint("m", i), agents)
				now = now.Add(2 * time.Hour)
				b.StartTimer()
				if k, err := m.Compact(b.Context(), 1000); err != nil || k != n {
					b.Fatalf("Compact = %d, %v; want %d", k, err, n)
				}
			}
		})
	}
}

// fillAcknowledged appends message id to every agent's mailbox and has
// each acknowledge it, 64 at a time (the acknowledgements share commits).
func fillAcknowledged(b *testing.B, m *mailbox.Mailboxes, id string, agents []string) {
	b.Helper()
	msg := message(id)
	msg.Time = time.Time{} // the mailboxes' clock
	if _, err := m.Append(b.Context(), msg, agents); err != nil {
		b.Fatal(err)
	}
	work := make(chan string)
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for a := range work {
				if _, err := m.ClearBacklog(b.Context(), a); err != nil {
					b.Error(err)
				}
			}
		})
	}
	for _, a := range agents {
		work <- a
	}
	close(work)
	wg.Wait()
}
