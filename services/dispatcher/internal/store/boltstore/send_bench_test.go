package boltstore_test

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/parleyhq/parley/services/dispatcher/internal/dialogue"
	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
	"github.com/parleyhq/parley/services/dispatcher/internal/store/boltstore"
)

// BenchmarkCreateDialogue_directSend is one sender's direct message as the
// dialogue service stores it (a new dialogue, its opener to one receiver,
// time-ordered ids from dialogue.NewID), each its own synced commit, on a
// young file and on one that holds earlier sends. It reports the pages
// each commit writes (CommitStats.Pages: what a commit's fdatasyncs flush
// on this disk) as pages/op, and the process's CPU time (user and system:
// the commit's page writes and syncs included) as cpu-µs/op.
func BenchmarkCreateDialogue_directSend(b *testing.B) {
	for _, before := range []int{0, 5000} {
		b.Run(fmt.Sprintf("earlier=%d", before), func(b *testing.B) {
			s, err := boltstore.Open(b.TempDir(), time.Second)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			const alice, bob = "clients/c/agents/alice", "clients/c/agents/bob"
			send := func() {
				now := time.Now().UTC()
				d := store.Dialogue{ID: dialogue.NewID(), Initiator: alice, Category: string(mailbox.CategoryMessage), CreateTime: now}
				m := store.DialogueMessage{ID: dialogue.NewID(), DialogueID: d.ID, Sender: alice, Type: "new_message", Time: now}
				d.Opener = m.ID
				w := store.MessageWrite{Message: m, Recipients: []string{bob}, Mail: mailbox.Message{
					ID: m.ID, DialogueID: d.ID, Sender: alice, Category: mailbox.CategoryMessage, Type: m.Type,
					Body: []byte(`{"text":"hello, bob"}`), Time: now,
				}}
				if got, err := s.CreateDialogue(b.Context(), d, w, mailbox.Bound{}); err != nil || len(got.Deliveries) != 1 {
					b.Fatalf("CreateDialogue = %+v, %v; want it delivered to bob", got, err)
				}
			}
			for range before {
				send()
			}
			start, cpu := s.Commits(), cpuTime(b)
			n := 0
			for b.Loop() {
				send()
				n++
			}
			end := s.Commits()
			b.ReportMetric(float64(end.Pages-start.Pages)/float64(n), "pages/op")
			b.ReportMetric(float64(end.Synced-start.Synced)/float64(n), "commits/op")
			b.ReportMetric(float64((cpuTime(b)-cpu).Microseconds())/float64(n), "cpu-µs/op")
		})
	}
}

// cpuTime is the user and system CPU time this process has used.
func cpuTime(b *testing.B) time.Duration {
	b.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
