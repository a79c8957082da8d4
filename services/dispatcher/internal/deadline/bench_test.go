package deadline

import (
	"fmt"
	"testing"
	"time"

	"github.com/parleyhq/parley/services/dispatcher/internal/store"
	"github.com/parleyhq/parley/services/dispatcher/internal/store/boltstore"
)

// BenchmarkRestart100k reopens a store holding 100,000 pending timers and
// reads the first due batch: the time from a restart to firing.
func BenchmarkRestart100k(b *testing.B) {
	dir := b.TempDir()
	st, err := boltstore.Open(dir, time.Second)
	if err != nil {
		b.Fatal(err)
	}
	const n = 100_000
	batch := make([]store.Timer, 0, 1000)
	for i := range n {
		batch = append(batch, store.Timer{Dialogue: fmt.Sprintf("dialogue-%08d", i), Initiator: consumer, Counterpart: supplier,
			Protocol: hash, Name: "offer_timeout", At: t0.Add(time.Duration(i) * time.Millisecond)})
		if len(batch) == cap(batch) {
			if err := st.PutTimers(b.Context(), batch); err != nil {
				b.Fatal(err)
			}
			batch = batch[:0]
		}
	}
	st.Close()
	for b.Loop() {
		st, err := boltstore.Open(dir, time.Second)
		if err != nil {
			b.Fatal(err)
		}
		due, err := st.DueTimers(b.Context(), t0.Add(time.Hour), 256)
		if err != nil || len(due) != 256 {
			b.Fatalf("DueTimers() = %d, %v", len(due), err)
		}
		st.Close()
	}
}

// BenchmarkDrain arms 1,000 deadlines, then fires them all in one FireDue
// (a backlog after a restart); ns/op is per expiry.
func BenchmarkDrain(b *testing.B) {
	for _, workers := range []int{1, 32} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
			e := &env{dir: b.TempDir(), clk: &clock{now: t0}, m: machines(b)}
			e.open(b)
			defer e.st.Close()
			s := New(e.st, e.m, e.mail, Options{Now: e.clk.Now, Workers: workers})
			round := 0
			for b.Loop() {
				b.StopTimer()
				e.clk.Set(t0)
				for i := range 1000 {
					e.request(b, fmt.Sprintf("r%d-d%d", round, i))
				}
				e.clk.Set(t0.Add(time.Minute))
				b.StartTimer()
				if n, err := s.FireDue(b.Context()); n != 1000 || err != nil {
					b.Fatalf("FireDue() = %d, %v", n, err)
				}
				round++
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*1000), "ns/expiry")
		})
	}
}
