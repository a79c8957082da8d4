package serve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/parleyhq/parley/platform/auth"
)

// fakeTestService is a test double of a Parley service: it does what the
// request's payload says and records what its handler saw.
type fakeTestService struct {
	testpb.UnimplementedTestServiceServer
	mu      sync.Mutex
	seen    seenCall
	started chan struct{} // a "block" or "hold" call has started
	release chan struct{} // ends a "hold" call
	shared  *testpb.SimpleResponse
	// streamed gets each StreamingOutputCall's error once its handler
	// has sent every response it was asked for.
	streamed chan error
}

// StreamingOutputCall sends a response of each size the request asks for,
// then reports on f.streamed.
func (f *fakeTestService) StreamingOutputCall(req *testpb.StreamingOutputCallRequest, st testpb.TestService_StreamingOutputCallServer) error {
	var err error
	for _, p := range req.GetResponseParameters() {
		if err = st.Send(&testpb.StreamingOutputCallResponse{Payload: &testpb.Payload{Body: make([]byte, p.GetSize())}}); err != nil {
			break
		}
	}
	select {
	case f.streamed <- err:
	default:
	}
	return err
}

// errFakeSentinel is what a "wrapped" call's error wraps besides its
// status: a callee's own error, which no caller should be able to match.
var errFakeSentinel = errors.New("the callee's own error")

type seenCall struct {
	network   string
	remote    string // as access control reads it
	principal auth.Principal
	md        metadata.MD
	deadline  bool
	method    string
}

func (f *fakeTestService) UnaryCall(ctx context.Context, req *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	p, _ := peer.FromContext(ctx)
	pr, _ := auth.FromContext(ctx)
	md, _ := metadata.FromIncomingContext(ctx)
	_, deadline := ctx.Deadline()
	method, _ := grpc.Method(ctx)
	f.mu.Lock()
	f.seen = seenCall{network: p.Addr.Network(), remote: auth.RemoteAddr(ctx), principal: pr, md: md, deadline: deadline, method: method}
	f.mu.Unlock()
	if err := grpc.SetHeader(ctx, metadata.Pairs("x-set", "1")); err != nil {
		return nil, err
	}
	switch cmd := string(req.GetPayload().GetBody()); {
	case cmd == "mutate":
		req.Payload.Body[0] = 'X'
		return &testpb.SimpleResponse{Username: "mutated"}, nil
	case cmd == "shared":
		return f.shared, nil
	case cmd == "plain error":
		return nil, errors.New("boom")
	case cmd == "not found":
		return nil, status.Error(codes.NotFound, "no such thing")
	case cmd == "wrapped":
		return nil, errors.Join(errFakeSentinel, status.Error(codes.NotFound, "no such thing"))
	case cmd == "block":
		close(f.started)
		<-ctx.Done()
		return nil, ctx.Err()
	case cmd == "hold": // ignores ctx, as a handler stuck in a store may
		close(f.started)
		<-f.release
		return &testpb.SimpleResponse{Username: "held"}, nil
	case strings.HasPrefix(cmd, "big"):
		return &testpb.SimpleResponse{Username: "big"}, nil
	}
	return &testpb.SimpleResponse{Username: "ok"}, nil
}

func (f *fakeTestService) last() seenCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.seen
}

func call(body string) *testpb.SimpleRequest {
	return &testpb.SimpleRequest{Payload: &testpb.Payload{Body: []byte(body)}}
}

// inProcessServer is a server with access control on, the fake service
// registered, and an in-process connection to it.
func inProcessServer(t *testing.T, maxBody int64) (*Server, *fakeTestService, *InProcessConn) {
	t.Helper()
	policy := auth.Policy{
		"/grpc.testing.TestService/UnaryCall":           {Allow: auth.Operator},
		"/grpc.testing.TestService/StreamingOutputCall": {Allow: auth.Operator},
		"/grpc.health.v1.Health/Check":                  {Allow: auth.Operator},
	}
	s, err := New(Options{Logger: slog.New(slog.DiscardHandler), DataDir: t.TempDir(), Policy: policy, MaxBodyBytes: maxBody, ShutdownTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeTestService{started: make(chan struct{}), release: make(chan struct{}), shared: &testpb.SimpleResponse{Username: "shared"}, streamed: make(chan error, 1)}
	testpb.RegisterTestServiceServer(s, f)
	c, err := s.InProcessConn()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return s, f, c
}

// TestInProcessConn_unaryRunsTheHandlerDirectly: a unary call reaches the
// handler without the pipe, behind the server's interceptors, as the
// operator, with the caller's outgoing metadata and deadline but none of
// the caller's own incoming metadata; request and response are copies.
func TestInProcessConn_unaryRunsTheHandlerDirectly(t *testing.T) {
	s, f, c := inProcessServer(t, 0)
	start(t, s)
	client := testpb.NewTestServiceClient(c)

	// The caller is itself serving an agent's call: its incoming
	// metadata must not become the in-process call's.
	ctx := metadata.NewIncomingContext(t.Context(), metadata.Pairs("authorization", "Bearer agent-key", "x-outer", "1"))
	ctx = auth.WithRemoteAddr(ctx, "203.0.113.9") // and its caller's address
	ctx = metadata.AppendToOutgoingContext(ctx, "x-forwarded", "yes")
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	resp, err := client.UnaryCall(ctx, call("hello"))
	if err != nil || resp.GetUsername() != "ok" {
		t.Fatalf("UnaryCall = %v, %v; want ok", resp, err)
	}
	seen := f.last()
	if seen.network != "inprocess" {
		t.Errorf("handler's peer network = %q, want inprocess (the call went over the pipe)", seen.network)
	}
	if seen.principal.Kind != auth.Operator {
		t.Errorf("handler's principal = %+v, want the operator", seen.principal)
	}
	if seen.remote != "inprocess" {
		t.Errorf("handler's remote address = %q, want inprocess: the caller's context values leaked", seen.remote)
	}
	if got := seen.md.Get("x-forwarded"); len(got) != 1 || got[0] != "yes" {
		t.Errorf("handler's metadata x-forwarded = %v, want the caller's outgoing [yes]", got)
	}
	if got := seen.md.Get("x-outer"); len(got) != 0 {
		t.Errorf("handler's metadata x-outer = %v: the caller's incoming metadata leaked", got)
	}
	if !seen.deadline {
		t.Error("handler's context has no deadline; want the caller's")
	}
	if seen.method != "/grpc.testing.TestService/UnaryCall" {
		t.Errorf("grpc.Method in the handler = %q", seen.method)
	}

	req := call("mutate")
	if _, err := client.UnaryCall(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	if string(req.GetPayload().GetBody()) != "mutate" {
		t.Errorf("caller's request changed to %q by the handler; want a copy", req.GetPayload().GetBody())
	}
	resp, err = client.UnaryCall(t.Context(), call("shared"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Username = "changed"
	if f.shared.GetUsername() != "shared" {
		t.Error("changing the response changed the handler's own message; want a copy")
	}

	// The interceptors ran: the call is in the server's metrics.
	if n := rpcCount(t, s, "/grpc.testing.TestService/UnaryCall"); n != 3 {
		t.Errorf("parley_grpc_server_handling_seconds count for UnaryCall = %d, want 3", n)
	}
}

func rpcCount(t *testing.T, s *Server, method string) uint64 {
	t.Helper()
	mfs, err := s.opts.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, mf := range mfs {
		if mf.GetName() != "parley_grpc_server_handling_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetValue() == method {
					n += m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	return n
}

// TestInProcessConn_refusals: what a call over a transport would get,
// the in-process call gets: the size limit, the handler's status, Unknown
// for a plain error, the caller's cancellation.
func TestInProcessConn_refusals(t *testing.T) {
	s, f, c := inProcessServer(t, 1<<10)
	start(t, s)
	client := testpb.NewTestServiceClient(c)

	_, err := client.UnaryCall(t.Context(), call("big"+strings.Repeat("x", 2<<10)))
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "1024-byte limit") {
		t.Errorf("request over MaxBodyBytes = %v, want ResourceExhausted naming the limit", err)
	}
	if _, err := client.UnaryCall(t.Context(), call("not found")); status.Code(err) != codes.NotFound || status.Convert(err).Message() != "no such thing" {
		t.Errorf("handler's NotFound = %v, want it as sent", err)
	}
	if _, err := client.UnaryCall(t.Context(), call("plain error")); status.Code(err) != codes.Unknown || status.Convert(err).Message() != "boom" {
		t.Errorf("handler's plain error = %v, want Unknown: boom", err)
	}

	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() { _, err := client.UnaryCall(ctx, call("block")); errc <- err }()
	<-f.started
	cancel()
	if err := <-errc; status.Code(err) != codes.Canceled {
		t.Errorf("cancelled call = %v, want Canceled", err)
	}
}

// TestInProcessConn_refusesAsThePolicySays: the access policy holds on
// the direct path as over the pipe: a method without an entry is refused
// to the operator too, and a forwarded caller is checked as itself.
func TestInProcessConn_refusesAsThePolicySays(t *testing.T) {
	s, f, c := inProcessServer(t, 0)
	start(t, s)
	client := testpb.NewTestServiceClient(c)

	if _, err := client.EmptyCall(t.Context(), &testpb.Empty{}); status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "EmptyCall has no access policy entry") {
		t.Errorf("EmptyCall (no policy entry) = %v, want PermissionDenied naming the method", err)
	}
	agent := auth.Principal{Kind: auth.Agent, Client: "clients/c", Agent: "clients/c/agents/a"}
	if _, err := client.UnaryCall(auth.ForwardCaller(t.Context(), agent), call("hello")); status.Code(err) != codes.PermissionDenied {
		t.Errorf("UnaryCall (operator only) forwarding an agent = %v, want PermissionDenied", err)
	}
	if f.last().network != "" {
		t.Errorf("a refused call reached the handler: %+v", f.last())
	}
}

// TestInProcessConn_errorsCarryOnlyTheStatus: as over a transport, the
// caller gets the handler's status and nothing else of its error.
func TestInProcessConn_errorsCarryOnlyTheStatus(t *testing.T) {
	s, _, c := inProcessServer(t, 0)
	start(t, s)
	_, direct := testpb.NewTestServiceClient(c).UnaryCall(t.Context(), call("wrapped"))
	_, pipe := testpb.NewTestServiceClient(c.ClientConn).UnaryCall(t.Context(), call("wrapped"))
	if errors.Is(direct, errFakeSentinel) {
		t.Errorf("UnaryCall(wrapped) = %v: the caller can match the callee's own error", direct)
	}
	if status.Code(direct) != codes.NotFound || direct.Error() != pipe.Error() {
		t.Errorf("UnaryCall(wrapped) = %q, want %q as over the pipe", direct, pipe)
	}
}

// TestInProcessConn_deadlinePassedInTheHandler: a caller whose deadline
// passed while the handler ran gets DeadlineExceeded, as a client over a
// transport would, not the handler's late answer.
func TestInProcessConn_deadlinePassedInTheHandler(t *testing.T) {
	s, f, c := inProcessServer(t, 0)
	start(t, s)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	go func() { <-f.started; <-ctx.Done(); close(f.release) }()
	if resp, err := testpb.NewTestServiceClient(c).UnaryCall(ctx, call("hold")); status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("UnaryCall(hold) past its deadline = %v, %v; want DeadlineExceeded", resp, err)
	}
}

// TestInProcessConn_callerIsAnsweredAtItsDeadline: a handler that ignores
// its context (stuck in a store, say) does not hold its caller: over a
// transport the caller gets DeadlineExceeded at its deadline, and so it
// does in process, while the handler is still running; shutdown still
// waits for the handler.
func TestInProcessConn_callerIsAnsweredAtItsDeadline(t *testing.T) {
	s, f, c := inProcessServer(t, 0)
	r := start(t, s)
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	errc := make(chan error, 1)
	go func() { _, err := testpb.NewTestServiceClient(c).UnaryCall(ctx, call("hold")); errc <- err }()
	<-f.started
	select {
	case err := <-errc:
		if status.Code(err) != codes.DeadlineExceeded {
			t.Errorf("UnaryCall(hold) past its deadline = %v; want DeadlineExceeded", err)
		}
	case <-time.After(10 * time.Second): // a bound on the test, not a timing claim
		close(f.release)
		t.Fatal("UnaryCall(hold) still waiting for its handler 10 s after its 50 ms deadline")
	}
	r.cancel() // shutdown starts and must wait for the held handler
	select {
	case err := <-r.done:
		t.Fatalf("Run returned (%v) while a handler was still running", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(f.release)
	if err := <-r.done; err != nil {
		t.Errorf("Run() = %v", err)
	}
	r.done <- nil // for start's cleanup
}

// TestInProcessConn_forcedStopIsUnavailable: a call cut off by a forced
// stop (ShutdownTimeout ran out) fails with Unavailable, as over the
// pipe, not Canceled: its caller cancelled nothing, and may retry.
func TestInProcessConn_forcedStopIsUnavailable(t *testing.T) {
	policy := auth.Policy{"/grpc.testing.TestService/UnaryCall": {Allow: auth.Operator}}
	s, err := New(Options{Logger: slog.New(slog.DiscardHandler), DataDir: t.TempDir(), Policy: policy, ShutdownTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeTestService{started: make(chan struct{})}
	testpb.RegisterTestServiceServer(s, f)
	c, err := s.InProcessConn()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := start(t, s)
	errc := make(chan error, 1)
	go func() {
		_, err := testpb.NewTestServiceClient(c).UnaryCall(context.Background(), call("block"))
		errc <- err
	}()
	<-f.started
	r.cancel()
	if err := <-errc; status.Code(err) != codes.Unavailable {
		t.Errorf("call cut off by a forced stop = %v, want Unavailable", err)
	}
}

// TestInProcessConn_waitsForRunAndRefusesAfterStop: as over the pipe, a
// call before Run waits for it; once shutdown starts, new calls are
// Unavailable and shutdown waits for the one in flight.
func TestInProcessConn_waitsForRunAndRefusesAfterStop(t *testing.T) {
	s, f, c := inProcessServer(t, 0)
	client := testpb.NewTestServiceClient(c)

	early, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if _, err := client.UnaryCall(early, call("hello")); status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("call before Run = %v, want DeadlineExceeded (waiting for Run)", err)
	}
	if f.last().network != "" {
		t.Error("the handler ran before Run")
	}

	r := start(t, s)
	blockCtx, unblock := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() { _, err := client.UnaryCall(blockCtx, call("block")); errc <- err }()
	<-f.started
	r.cancel() // shutdown starts
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := client.UnaryCall(t.Context(), call("hello"))
		if status.Code(err) == codes.Unavailable {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("call during shutdown = %v, want Unavailable", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	select {
	case err := <-r.done:
		t.Fatalf("Run returned (%v) while an in-process call was in flight", err)
	default:
	}
	unblock()
	if err := <-errc; status.Code(err) != codes.Canceled {
		t.Errorf("in-flight call = %v, want Canceled by its caller", err)
	}
	if err := <-r.done; err != nil {
		t.Errorf("Run() = %v", err)
	}
	r.done <- nil // for start's cleanup
}

// TestInProcessConn_streamsAndOtherServicesUseThePipe: what
// RegisterService did not see (the health service) and streams still
// work, over the pipe.
func TestInProcessConn_streamsAndOtherServicesUseThePipe(t *testing.T) {
	s, _, c := inProcessServer(t, 0)
	start(t, s)
	if _, err := healthpb.NewHealthClient(c).Check(t.Context(), &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Errorf("health over the in-process connection: %v", err)
	}
	st, err := testpb.NewTestServiceClient(c).StreamingOutputCall(t.Context(), &testpb.StreamingOutputCallRequest{
		ResponseParameters: []*testpb.ResponseParameters{{Size: 10}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := st.Recv(); err != nil || len(resp.GetPayload().GetBody()) != 10 {
		t.Errorf("stream over the pipe = %v, %v; want the service's 10-byte response", resp, err)
	}
}

// TestInProcessConn_pipeHasFixedFlowControlWindows: the pipe's client
// takes grpcclient.FlowControl's fixed stream window (1 MiB), so a stream
// may be sent that much before its caller reads any; gRPC's dynamic
// windows start at 64 KiB (and cost a PING per message read). The handler
// sends 512 KiB to a caller that reads nothing yet: it finishes only if
// the window holds it all.
func TestInProcessConn_pipeHasFixedFlowControlWindows(t *testing.T) {
	s, f, c := inProcessServer(t, 0)
	start(t, s)
	var params []*testpb.ResponseParameters
	for range 8 {
		params = append(params, &testpb.ResponseParameters{Size: 64 << 10})
	}
	st, err := testpb.NewTestServiceClient(c).StreamingOutputCall(t.Context(), &testpb.StreamingOutputCallRequest{ResponseParameters: params}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-f.streamed:
		if err != nil {
			t.Fatalf("the handler's sends failed: %v", err)
		}
	case <-time.After(10 * time.Second): // a bound on the test, not a timing claim
		t.Fatal("the handler could not send 512 KiB to a caller reading nothing: the pipe's stream window is under 512 KiB")
	}
	for range params {
		if _, err := st.Recv(); err != nil {
			t.Fatal(err)
		}
	}
}

// BenchmarkInProcessConn compares a unary call run directly with the same
// call over the in-memory pipe, in one run.
func BenchmarkInProcessConn(b *testing.B) {
	s, err := New(Options{Logger: slog.New(slog.DiscardHandler), DataDir: b.TempDir(), Policy: auth.Policy{"/grpc.testing.TestService/UnaryCall": {Allow: auth.Operator}}})
	if err != nil {
		b.Fatal(err)
	}
	testpb.RegisterTestServiceServer(s, &fakeTestService{shared: &testpb.SimpleResponse{}})
	c, err := s.InProcessConn()
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, mustListen(b), mustListen(b)) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			b.Error(err)
		}
	}()
	req := call(strings.Repeat("x", 300))
	for _, bc := range []struct {
		name string
		conn grpc.ClientConnInterface
	}{{"direct", c}, {"pipe", c.ClientConn}} {
		b.Run(bc.name, func(b *testing.B) {
			client := testpb.NewTestServiceClient(bc.conn)
			if _, err := client.UnaryCall(ctx, req, grpc.WaitForReady(true)); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := client.UnaryCall(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func mustListen(b *testing.B) net.Listener {
	b.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	return l
}

// TestRegisterService_afterRunPanics: the in-process path reads the
// registered methods without a lock once Run serves, so a registration
// after Run is refused as gRPC refuses it.
func TestRegisterService_afterRunPanics(t *testing.T) {
	s, _, c := inProcessServer(t, 0)
	start(t, s)
	if _, err := testpb.NewTestServiceClient(c).UnaryCall(t.Context(), call("hello")); err != nil {
		t.Fatal(err) // answered: Run serves
	}
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "after Run") {
			t.Errorf("RegisterService after Run: recovered %v, want a panic naming the mistake", r)
		}
	}()
	testpb.RegisterUnimplementedServiceServer(s, testpb.UnimplementedUnimplementedServiceServer{})
}
