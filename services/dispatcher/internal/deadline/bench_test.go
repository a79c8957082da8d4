package deadline

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
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
// (a backlog after a restart), one transaction per batch; batch=1 is one
// commit per expiry, the reference. ns/expiry is per expiry.
func BenchmarkDrain(b *testing.B) {
	for _, batch := range []int{1, 256} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			e := &env{dir: b.TempDir(), clk: &clock{now: t0}, m: machines(b)}
			e.open(b)
			defer e.st.Close()
			s := New(e.st, e.m, e.mail, Options{Now: e.clk.Now, Batch: batch})
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

// lateTemplate writes n dialogues, each with an offer window armed, whose
// deadlines fall due from restart-before+1s on, spread evenly over spread
// (deadlines are whole seconds, so they come due in groups at each second),
// and returns the directory of the closed store.
func lateTemplate(b *testing.B, n int, restart time.Time, before, spread time.Duration) string {
	b.Helper()
	e := &env{dir: b.TempDir(), clk: &clock{}, m: machines(b)}
	e.open(b)
	var (
		wg     sync.WaitGroup
		next   atomic.Int64
		timers = make([]store.Timer, n)
	)
	for range 64 { // concurrent writers share commits
		wg.Go(func() {
			for i := next.Add(1) - 1; i < int64(n); i = next.Add(1) - 1 {
				// A window of 30 s opened 30 s before its due time.
				due := restart.Add(-before).Add(time.Second + time.Duration(i)*spread/time.Duration(n)).Truncate(time.Second)
				// Dialogue ids are random in production, and so is the
				// order of the pairs an expiry batch writes.
				sum := sha256.Sum256(fmt.Appendf(nil, "dialogue %d", i))
				d := hex.EncodeToString(sum[:16])
				e.dialogueAt(b, d, due.Add(-30*time.Second))
				timers[i] = store.Timer{Dialogue: d, Initiator: consumer, Counterpart: supplier, Protocol: hash, Name: "invite_offer_timeout", At: due}
			}
		})
	}
	wg.Wait()
	for c := range slices.Chunk(timers, 5000) {
		if err := e.st.PutTimers(b.Context(), c); err != nil {
			b.Fatal(err)
		}
	}
	if err := e.st.Close(); err != nil {
		b.Fatal(err)
	}
	return e.dir
}

var (
	benchTimers  = flag.Int("timers", 100_000, "BenchmarkRestartLateness: how many pending deadlines")
	drainProfile = flag.String("drainprofile", "", "BenchmarkRestartLateness: write a CPU profile of the drains alone (not the templates' writes) to this file")
)

// BenchmarkRestartLateness restarts a dispatcher's store holding 100,000
// pending deadlines and runs the scheduler on a clock that starts at the
// restart and runs in real time:
//
//   - due-over-10s: the deadlines fall due over the 10 s after the restart
//     (10,000 at each second);
//   - all-due: they all fell due while the server was down.
//
// It reports the time to open the store and read the first due batch
// (restart-ms), how late each expiry's commit is after its deadline, or
// after the restart for those already due (p50-ms, p99-ms, max-ms), the Go
// heap after the restart (heap-MB), the bytes on disk per timer with its
// dialogue (disk-B/timer) and the process's CPU time per expiry while
// draining (cpu-us/expiry: on a shared machine, the part of the wall time
// that was ours). Each case runs with 256 expiries per commit (the
// reference) and with 2048 (the default). -timers sets the count (2,000
// with -short).
func BenchmarkRestartLateness(b *testing.B) {
	n := *benchTimers
	if testing.Short() {
		n = 2000
	}
	for _, c := range []struct {
		name           string
		before, spread time.Duration
	}{
		{"due-over-10s", 0, 10 * time.Second},
		{"all-due", time.Minute, 10 * time.Second},
	} {
		restartAt := t0.Add(time.Hour)
		// The case's template is built only when one of its batch sizes
		// runs (-bench selects), and both restart from it.
		b.Run(c.name, func(b *testing.B) {
			tmpl := lateTemplate(b, n, restartAt, c.before, c.spread)
			for _, batch := range []int{256, 2048} {
				b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
					info, err := os.Stat(filepath.Join(tmpl, boltstore.FileName))
					if err != nil {
						b.Fatal(err)
					}
					var p50, p99, worst, restart time.Duration
					var (
						heap uint64
						cpu  time.Duration
					)
					for b.Loop() {
						b.StopTimer()
						dir := b.TempDir()
						copyFile(b, filepath.Join(tmpl, boltstore.FileName), filepath.Join(dir, boltstore.FileName))
						runtime.GC()
						b.StartTimer()

						began := time.Now()
						now := func() time.Time { return restartAt.Add(time.Since(began)) }
						var (
							mu   sync.Mutex
							late []time.Duration
							done = make(chan struct{})
						)
						st, err := boltstore.Open(dir, time.Second)
						if err != nil {
							b.Fatal(err)
						}
						if _, err := st.DueTimers(b.Context(), now(), 256); err != nil {
							b.Fatal(err)
						}
						restart = time.Since(began)
						mail := mailbox.New(st, mailbox.Options{Now: now})
						// Lateness is measured when the firing commits; the
						// Expired hook runs as the server's does (a no-op here, as
						// for a pair without an order), pair state read included.
						committed := committedAt{TimerStore: st, fired: func(fired []store.FiredTimer) {
							at := now()
							mu.Lock()
							defer mu.Unlock()
							for _, f := range fired {
								from := f.Timer.At
								if from.Before(restartAt) {
									from = restartAt // fell due while the server was down
								}
								late = append(late, at.Sub(from))
							}
							if len(late) == n {
								close(done)
							}
						}}
						s := New(committed, machines(b), mail, Options{Now: now, Batch: batch, Expired: func(context.Context, Expiry) error { return nil }})
						var ms runtime.MemStats
						runtime.ReadMemStats(&ms)
						heap = ms.HeapAlloc
						ctx, cancel := context.WithCancel(b.Context())
						ran := make(chan struct{})
						stopProfile := startDrainProfile(b)
						cpu0 := processCPU(b)
						go func() { defer close(ran); s.Run(ctx) }()
						select {
						case <-done:
						case <-time.After(10 * time.Minute): // bounds a broken run only
							b.Fatalf("%d of %d deadlines fired in 10 minutes", len(late), n)
						}
						cpu = processCPU(b) - cpu0
						stopProfile()
						cancel()
						<-ran
						st.Close()
						slices.Sort(late)
						p50, p99, worst = late[len(late)/2], late[len(late)*99/100], late[len(late)-1]
					}
					b.ReportMetric(float64(restart.Microseconds())/1000, "restart-ms")
					b.ReportMetric(float64(p50.Microseconds())/1000, "p50-ms")
					b.ReportMetric(float64(p99.Microseconds())/1000, "p99-ms")
					b.ReportMetric(float64(worst.Microseconds())/1000, "max-ms")
					b.ReportMetric(float64(heap)/(1<<20), "heap-MB")
					b.ReportMetric(float64(info.Size())/float64(n), "disk-B/timer")
					b.ReportMetric(float64(cpu.Microseconds())/float64(n), "cpu-us/expiry")
				})
			}
		})
	}
}

// startDrainProfile starts the -drainprofile CPU profile, a file per
// drain (named after the benchmark), and returns its stop.
func startDrainProfile(b *testing.B) func() {
	b.Helper()
	if *drainProfile == "" {
		return func() {}
	}
	name := *drainProfile + "." + strings.NewReplacer("/", "_", "=", "").Replace(b.Name())
	f, err := os.Create(name)
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		b.Fatal(err)
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			b.Fatal(err)
		}
	}
}

// processCPU is the CPU time (user and system) the process has used: on a
// shared machine, the part of the wall time that was ours.
func processCPU(b *testing.B) time.Duration {
	b.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func copyFile(b *testing.B, from, to string) {
	b.Helper()
	raw, err := os.ReadFile(from)
	if err != nil {
		b.Fatal(err)
	}
	// Synced, as a restarted server's file is: else the first commit's
	// fdatasync would write the whole copy back.
	f, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := f.Write(raw); err != nil {
		b.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		b.Fatal(err)
	}
	if err := f.Close(); err != nil {
		b.Fatal(err)
	}
}

// committedAt tells fired of each batch FireTimers committed.
type committedAt struct {
	store.TimerStore
	fired func([]store.FiredTimer)
}

func (c committedAt) FireTimers(ctx context.Context, ts []store.Timer, bound mailbox.Bound, expire func(store.Timer, json.RawMessage) (store.TimerFiring, error)) ([]store.FiredTimer, error) {
	fired, err := c.TimerStore.FireTimers(ctx, ts, bound, expire)
	c.fired(fired)
	return fired, err
}
