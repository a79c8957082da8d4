package mailbox_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
)

// BenchmarkFanOut appends one message to n mailboxes: ns/op is the time
// until every mailbox holds it durably (one synced commit). The streams
// variant also runs n connected receivers (Receive, in process) and times
// until every one of them has been handed the message.
//
// Run: go test -run '^$' -bench FanOut -benchtime 5x ./internal/mailbox/
func BenchmarkFanOut(b *testing.B) {
	for _, n := range []int{1, 10_000, 100_000} { // 1: the reference, one durable append
		agents := make([]string, n)
		for i := range agents {
			agents[i] = fmt.Sprintf("clients/c%d/agents/a%d", i%100, i)
		}
		b.Run(fmt.Sprintf("durable/mailboxes=%d", n), func(b *testing.B) {
			m := newMailboxes(b, mailbox.Options{})
			i := 0
			for b.Loop() {
				i++
				if _, err := m.Append(b.Context(), message(fmt.Sprint("m", i)), agents); err != nil {
					b.Fatal(err)
				}
			}
		})
		if n != 10_000 {
			continue // streams at 10,000 only
		}
		b.Run(fmt.Sprintf("streams/mailboxes=%d", n), func(b *testing.B) {
			m := newMailboxes(b, mailbox.Options{})
			ctx, cancel := context.WithCancel(b.Context())
			defer cancel()
			var (
				mu      sync.Mutex
				pending int
				all     = make(chan struct{}, 1)
				ready   sync.WaitGroup
				done    sync.WaitGroup
			)
			ready.Add(n)
			for _, a := range agents {
				done.Add(1)
				go func() {
					defer done.Done()
					first := true
					_ = m.Receive(ctx, a, mailbox.ReceiveOptions{Batch: 100, Keepalive: time.Hour}, func(ds []mailbox.Delivery) error {
						if first {
							first = false
							ready.Done()
						}
						if len(ds) == 0 {
							return nil
						}
						mu.Lock()
						pending--
						if pending == 0 {
							all <- struct{}{}
						}
						mu.Unlock()
						return nil
					})
				}()
			}
			ready.Wait()
			i := 0
			for b.Loop() {
				i++
				mu.Lock()
				pending = n
				mu.Unlock()
				if _, err := m.Append(b.Context(), message(fmt.Sprint("m", i)), agents); err != nil {
					b.Fatal(err)
				}
				<-all
			}
			cancel()
			done.Wait()
		})
	}
}
