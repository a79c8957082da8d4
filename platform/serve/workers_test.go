package serve

import (
	"runtime"
	"runtime/metrics"
	"strings"
	"sync"
	"testing"
	"time"

	testpb "google.golang.org/grpc/interop/grpc_testing"
)

// goroutinesCreated is how many goroutines this process has started.
func goroutinesCreated(t *testing.T) uint64 {
	t.Helper()
	s := []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		t.Fatalf("runtime/metrics has no %s", s[0].Name)
	}
	return s[0].Value.Uint64()
}

// TestInProcessConn_callsRunOnWorkers: an in-process call runs on a
// goroutine kept from an earlier call, not on a new one per call (which
// grows its stack afresh through the interceptors and the handler:
// docs/benchmarks.md, "One sender: in-process workers, fixed client
// windows").
func TestInProcessConn_callsRunOnWorkers(t *testing.T) {
	s, _, c := inProcessServer(t, 0)
	start(t, s)
	client := testpb.NewTestServiceClient(c)
	if _, err := client.UnaryCall(t.Context(), call("ok")); err != nil {
		t.Fatal(err) // leaves a worker waiting
	}
	const calls = 200
	before := goroutinesCreated(t)
	for range calls {
		if _, err := client.UnaryCall(t.Context(), call("ok")); err != nil {
			t.Fatal(err)
		}
	}
	if n := goroutinesCreated(t) - before; n >= calls/2 {
		t.Errorf("%d sequential in-process calls started %d goroutines, want fewer than %d", calls, n, calls/2)
	}
}

// TestInProcessCalls_keepAtMostOneIdleWorkerPerProcessor: after a burst
// of calls running at once, as many workers as processors stay waiting
// for the next calls; the others end.
func TestInProcessCalls_keepAtMostOneIdleWorkerPerProcessor(t *testing.T) {
	c := newInProcessCalls()
	defer c.cancel()
	n := 4 * int(c.maxIdle)
	var started, ran sync.WaitGroup
	started.Add(n)
	ran.Add(n)
	release := make(chan struct{})
	for range n {
		c.run(func() { started.Done(); <-release; ran.Done() })
	}
	started.Wait() // n calls at once: n goroutines
	close(release)
	ran.Wait()
	deadline := time.Now().Add(10 * time.Second) // a bound on the test, not a timing claim
	for got := inProcessWorkers(); got > int(c.maxIdle); got = inProcessWorkers() {
		if time.Now().After(deadline) {
			t.Fatalf("after %d calls at once, %d workers wait, want at most %d", n, got, c.maxIdle)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := inProcessWorkers(); got == 0 {
		t.Errorf("after %d calls at once no worker waits for the next, want %d", n, c.maxIdle)
	}
}

// TestInProcessConn_workersEndWithTheServer: the goroutines kept for
// in-process calls end when the server stops.
func TestInProcessConn_workersEndWithTheServer(t *testing.T) {
	s, _, c := inProcessServer(t, 0)
	r := start(t, s)
	client := testpb.NewTestServiceClient(c)
	var wg sync.WaitGroup
	for range 4 * runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			if _, err := client.UnaryCall(t.Context(), call("ok")); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if n := inProcessWorkers(); n == 0 {
		t.Fatal("no goroutine waits for in-process calls after a burst of them")
	}
	r.cancel()
	if err := <-r.done; err != nil {
		t.Fatalf("Run() = %v", err)
	}
	r.done <- nil // for start's cleanup

	deadline := time.Now().Add(10 * time.Second) // a bound on the test, not a timing claim
	for inProcessWorkers() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines still wait for in-process calls after the server stopped", inProcessWorkers())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// inProcessWorkers counts the goroutines waiting for in-process calls.
func inProcessWorkers() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Count(string(buf[:n]), "(*inProcessCalls).worker")
		}
		buf = make([]byte, 2*len(buf))
	}
}
