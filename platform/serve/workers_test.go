package serve

import (
	"context"
	"runtime"
	"runtime/metrics"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
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
