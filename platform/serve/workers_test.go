package serve

import (
	"context"
	"runtime"
	"runtime/metrics"
	"strings"
	"sync"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
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

// TestGRPC_callsRunOnWorkers checks that the gRPC server runs calls on
// goroutines it keeps (grpc.NumStreamWorkers), not on a new one per call:
// a new goroutine starts with a small stack and grows it through the
// interceptors and the handler, about 3 % of the server's CPU at one
// sender (docs/benchmarks.md, "workers and fixed client windows").
func TestGRPC_callsRunOnWorkers(t *testing.T) {
	r := start(t, newServer(t))
	hc := healthpb.NewHealthClient(r.grpcConn)
	ctx, cancel := context.WithTimeout(context.Background(), closeMargin)
	defer cancel()
	if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err) // connects, and starts the workers
	}
	const calls = 200
	before := goroutinesCreated(t)
	for range calls {
		if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	if n := goroutinesCreated(t) - before; n >= calls/2 {
		t.Errorf("%d sequential calls started %d goroutines in this process, want fewer than %d: the server should run them on its workers", calls, n, calls/2)
	}
}

// TestGRPC_streamsBeyondTheWorkersDoNotBlockCalls holds more long-lived
// streams open than the server has workers: a unary call is still
// answered (gRPC starts a goroutine when no worker is free).
func TestGRPC_streamsBeyondTheWorkersDoNotBlockCalls(t *testing.T) {
	r := start(t, newServer(t))
	hc := healthpb.NewHealthClient(r.grpcConn)
	ctx, cancel := context.WithTimeout(context.Background(), closeMargin)
	defer cancel()
	for i := range 2*runtime.GOMAXPROCS(0) + 2 {
		w, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Recv(); err != nil { // its handler is running
			t.Fatalf("stream %d: %v", i, err)
		}
	}
	callCtx, callCancel := context.WithTimeout(ctx, 5*time.Second)
	defer callCancel()
	if _, err := hc.Check(callCtx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("Check with every worker holding a stream = %v, want an answer", err)
	}
}

// TestInProcessConn_callsRunOnWorkers: in-process calls too run on
// goroutines kept for them, not on a new one per call (which grows its
// stack anew through the interceptors and the handler each time).
func TestInProcessConn_callsRunOnWorkers(t *testing.T) {
	s, _, c := inProcessServer(t, 0)
	start(t, s)
	client := testpb.NewTestServiceClient(c)
	ctx, cancel := context.WithTimeout(context.Background(), closeMargin)
	defer cancel()
	if _, err := client.UnaryCall(ctx, call("ok")); err != nil {
		t.Fatal(err)
	}
	const calls = 200
	before := goroutinesCreated(t)
	for range calls {
		if _, err := client.UnaryCall(ctx, call("ok")); err != nil {
			t.Fatal(err)
		}
	}
	if n := goroutinesCreated(t) - before; n >= calls/2 {
		t.Errorf("%d sequential in-process calls started %d goroutines, want fewer than %d", calls, n, calls/2)
	}
}

// TestInProcessConn_workersEndWithTheServer: the goroutines kept for
// in-process calls end when the server stops.
func TestInProcessConn_workersEndWithTheServer(t *testing.T) {
	s, _, c := inProcessServer(t, 0)
	r := start(t, s)
	client := testpb.NewTestServiceClient(c)
	var wg sync.WaitGroup
	for range 4 * runtime.GOMAXPROCS(0) { // more at once than are kept
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
