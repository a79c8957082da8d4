package app_test

import (
	"context"
	"net"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/platform/grpcerr"
)

// fakeDispatcher is a real gRPC DispatcherService on loopback whose
// ExecuteStep runs a swappable function: the dispatcher is built in
// parallel, and its failures (no executor yet) are hard to cause.
type fakeDispatcher struct {
	dispatcherv1.UnimplementedDispatcherServiceServer

	mu      sync.Mutex // guards execute and reqs
	execute func(context.Context, *dispatcherv1.ExecuteStepRequest) (*dispatcherv1.ExecuteStepResponse, error)
	reqs    []*dispatcherv1.ExecuteStepRequest
}

func (f *fakeDispatcher) ExecuteStep(ctx context.Context, req *dispatcherv1.ExecuteStepRequest) (*dispatcherv1.ExecuteStepResponse, error) {
	f.mu.Lock()
	fn := f.execute
	f.reqs = append(f.reqs, req)
	f.mu.Unlock()
	return fn(ctx, req)
}

func (f *fakeDispatcher) set(fn func(context.Context, *dispatcherv1.ExecuteStepRequest) (*dispatcherv1.ExecuteStepResponse, error)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.execute = fn
}

func (f *fakeDispatcher) requests() []*dispatcherv1.ExecuteStepRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*dispatcherv1.ExecuteStepRequest(nil), f.reqs...)
}

// echoStep is a trivial step handler: it echoes the input; "last" ends the
// task and "file" creates an artifact gen/out.txt.
func echoStep(_ context.Context, req *dispatcherv1.ExecuteStepRequest) (*dispatcherv1.ExecuteStepResponse, error) {
	resp := &dispatcherv1.ExecuteStepResponse{Output: "echo: " + req.GetInput(), AdditionalOutputJson: []byte(`{"tokens":1}`), StepName: "echo"}
	switch req.GetInput() {
	case "last":
		resp.IsLast = true
	case "file":
		resp.Artifacts = []*dispatcherv1.StepArtifact{{FileName: "out.txt", RelativePath: "gen", Content: []byte("Washington")}}
	}
	return resp, nil
}

func noExecutor(context.Context, *dispatcherv1.ExecuteStepRequest) (*dispatcherv1.ExecuteStepResponse, error) {
	return nil, grpcerr.New(codes.FailedPrecondition, "no executor for this agent", "NO_EXECUTOR", "dispatcher.parley.dev", nil)
}

// startFakeDispatcher serves a fakeDispatcher running fn on 127.0.0.1:0 and
// returns it with a client connection.
func startFakeDispatcher(t testing.TB, fn func(context.Context, *dispatcherv1.ExecuteStepRequest) (*dispatcherv1.ExecuteStepResponse, error)) (*fakeDispatcher, *grpc.ClientConn) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeDispatcher{execute: fn}
	srv := grpc.NewServer()
	dispatcherv1.RegisterDispatcherServiceServer(srv, f)
	go func() { _ = srv.Serve(lis) }() // returns nil once cleanup stops it
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return f, conn
}
