package serve

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"runtime"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"

	"github.com/parleyhq/parley/platform/auth"
	"github.com/parleyhq/parley/platform/grpcclient"
)

// RegisterService registers a gRPC service on the server (Server is a
// grpc.ServiceRegistrar: pass it to a generated RegisterXServer). Its
// unary methods are also what InProcessConn calls without a transport.
func (s *Server) RegisterService(desc *grpc.ServiceDesc, impl any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.running {
		// As gRPC itself refuses (it ends the process): a service must
		// be registered before Run. InProcessConn reads the methods
		// without a lock once Run serves.
		panic(fmt.Sprintf("serve: RegisterService(%s) after Run", desc.ServiceName))
	}
	s.GRPC.RegisterService(desc, impl)
	if s.unaryMethods == nil {
		s.unaryMethods = map[string]unaryMethod{}
	}
	for _, m := range desc.Methods {
		s.unaryMethods["/"+desc.ServiceName+"/"+m.MethodName] = unaryMethod{impl: impl, handler: m.Handler}
	}
}

type unaryMethod struct {
	impl    any
	handler grpc.MethodHandler
}

// InProcessConn is a client connection to the server's own services, for
// the all-in-one binary, where services still talk to each other only
// through their gRPC APIs. A unary call to a service registered through
// RegisterService runs its handler directly, behind the same interceptors
// (telemetry, access control) as a call from outside, with the request
// and the response copied and no transport: in `parley serve` a direct
// send's permission check in the registry cost about a tenth of the
// send's CPU over the in-memory pipe (docs/benchmarks.md). Streams and
// other services go over the pipe. Either way the call is the
// operator's, from an address that is not the network's.
//
// The handler runs on a goroutine other than the caller's, as over a
// transport: a caller whose context ends is answered then, even by a
// handler that ignores its context (stuck in a store, say), which
// shutdown still waits for. That goroutine is a worker kept from an
// earlier call when one waits (up to one per processor waits), so that
// a call does not start a goroutine and grow its stack afresh. Call
// options (grpc.Header, grpc.Trailer, message size caps) are ignored,
// and the response has no size limit.
type InProcessConn struct {
	*grpc.ClientConn // the pipe
	s                *Server
}

// InProcessConn returns a connection to the server's own services. Calls
// made before Run wait for it; calls made once the gRPC server is
// stopping fail with Unavailable.
func (s *Server) InProcessConn() (*InProcessConn, error) {
	s.mu.Lock()
	if s.pipe == nil {
		s.pipe = bufconn.Listen(1 << 20)
		if s.running {
			go s.servePipe(s.pipe)
		}
	}
	lis := s.pipe
	s.mu.Unlock()
	creds := insecure.NewCredentials()
	if s.tlsConf != nil {
		// The server side insists on TLS once a certificate is configured.
		// The pipe never leaves the process, so there is nothing to verify.
		creds = credentials.NewTLS(&tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}) //nolint:gosec // in-memory pipe to ourselves
	}
	opts := append(grpcclient.FlowControl(),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(int(s.opts.MaxBodyBytes)*4)))
	if s.auth != nil {
		// Services in one process call each other as the operator: the
		// pipe cannot be reached from outside it.
		opts = append(opts, grpc.WithPerRPCCredentials(auth.Bearer(s.operatorToken)))
	}
	cc, err := grpc.NewClient("passthrough:///in-process", opts...)
	if err != nil {
		return nil, err
	}
	return &InProcessConn{ClientConn: cc, s: s}, nil
}

func (s *Server) servePipe(lis *bufconn.Listener) { _ = s.GRPC.Serve(lis) }

// Invoke implements grpc.ClientConnInterface.
func (c *InProcessConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	s := c.s
	select {
	case <-s.serving:
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
	// Read without s.mu: once Run serves, the map no longer changes (gRPC
	// refuses a registration after Serve), and serving's close orders
	// every registration before this read.
	m, ok := s.unaryMethods[method]
	req, reqOK := args.(proto.Message)
	out, outOK := reply.(proto.Message)
	if !ok || !reqOK || !outOK {
		return c.ClientConn.Invoke(ctx, method, args, reply, opts...)
	}
	if n := proto.Size(req); int64(n) > s.opts.MaxBodyBytes {
		return status.Errorf(codes.ResourceExhausted, "in-process call %s: request of %d bytes is over the %d-byte limit", method, n, s.opts.MaxBodyBytes)
	}
	done, err := s.inproc.begin()
	if err != nil {
		return err
	}
	sctx, cancel := s.inproc.context(ctx)
	// The server side sees what a call over the pipe would carry: the
	// caller's outgoing metadata and the operator token, not the values
	// (or the incoming metadata of an outer call) in the caller's ctx.
	md, _ := metadata.FromOutgoingContext(ctx)
	md = md.Copy()
	if s.auth != nil {
		md.Set("authorization", "Bearer "+s.operatorToken)
	}
	sctx = metadata.NewIncomingContext(sctx, md)
	sctx = peer.NewContext(sctx, &peer.Peer{Addr: inProcessAddr{}, LocalAddr: inProcessAddr{}})
	sctx = grpc.NewContextWithServerTransportStream(sctx, &inProcessStream{method: method})
	// The handler runs on a goroutine other than the caller's (a kept
	// worker), as over a transport, so that a caller whose context ends
	// gets its answer then, even from a handler that does not watch its
	// context; shutdown still waits for the handler (done). It reads a
	// copy of the request, taken now: the caller may reuse its own once
	// it has its answer.
	private := proto.Clone(req)
	dec := func(v any) error {
		dst, ok := v.(proto.Message)
		if !ok {
			return status.Errorf(codes.Internal, "in-process call %s: request type %T is not a protocol buffer", method, v)
		}
		proto.Merge(dst, private)
		return nil
	}
	type answer struct {
		resp any
		err  error
	}
	answered := make(chan answer, 1)
	s.inproc.run(func() {
		defer done()
		defer cancel()
		resp, err := m.handler(m.impl, sctx, dec, s.unary)
		answered <- answer{resp, err}
	})
	var resp any
	select {
	case a := <-answered:
		resp, err = a.resp, a.err
	case <-ctx.Done():
	case <-s.inproc.base.Done():
	}
	switch {
	case ctx.Err() != nil:
		// The caller gave up, before or while the handler ran: over a
		// transport it gets its context's code, whatever the handler
		// answers late.
		return status.FromContextError(ctx.Err()).Err()
	case s.inproc.base.Err() != nil:
		// A forced stop cut the call off: over a transport the caller
		// loses its connection, which it may retry elsewhere.
		return errInProcessCutOff
	case err != nil:
		// As the gRPC server sends it: the status alone (not the rest of
		// the handler's error), or Unknown, or the context's code.
		st, ok := status.FromError(err)
		if !ok {
			st = status.FromContextError(err)
		}
		return st.Err()
	}
	got, ok := resp.(proto.Message)
	if !ok {
		return status.Errorf(codes.Internal, "in-process call %s: response type %T is not a protocol buffer", method, resp)
	}
	proto.Reset(out)
	proto.Merge(out, got)
	return nil
}

// inProcessAddr is the peer address of an in-process call: not an IP, so
// per-address limits put every in-process call in one bucket of its own.
type inProcessAddr struct{}

func (inProcessAddr) Network() string { return "inprocess" }
func (inProcessAddr) String() string  { return "inprocess" }

// inProcessStream is the grpc.ServerTransportStream of an in-process call:
// handlers may set headers and trailers, which go nowhere (no caller in
// this process reads them).
type inProcessStream struct{ method string }

func (st *inProcessStream) Method() string               { return st.method }
func (st *inProcessStream) SetHeader(metadata.MD) error  { return nil }
func (st *inProcessStream) SendHeader(metadata.MD) error { return nil }
func (st *inProcessStream) SetTrailer(metadata.MD) error { return nil }

// inProcessCalls tracks the in-process calls under way, so that shutdown
// waits for them as GracefulStop waits for calls over a transport, and
// refuses new ones once it starts.
type inProcessCalls struct {
	mu      sync.RWMutex
	stopped bool
	wg      sync.WaitGroup
	// base is cancelled when the server stops for good: a forced stop
	// cancels calls in flight, as it does over a transport. The workers
	// end then too.
	base   context.Context
	cancel context.CancelFunc
	// work hands a call to a worker waiting for one (run); idle counts
	// the workers waiting, at most maxIdle.
	work    chan func()
	idle    atomic.Int32
	maxIdle int32
}

func newInProcessCalls() *inProcessCalls {
	base, cancel := context.WithCancel(context.Background())
	return &inProcessCalls{base: base, cancel: cancel, work: make(chan func()), maxIdle: int32(runtime.GOMAXPROCS(0))} //nolint:gosec // a processor count
}

// run runs f on a worker waiting for a call, or on a new goroutine that
// then waits for more (worker).
func (c *inProcessCalls) run(f func()) {
	select {
	case c.work <- f:
	default:
		go c.worker(f)
	}
}

// worker runs f, then the calls handed to it while fewer than maxIdle
// others wait, until the server stops.
func (c *inProcessCalls) worker(f func()) {
	for {
		f()
		f = nil // nothing of the last call is kept while waiting
		if c.idle.Add(1) > c.maxIdle {
			c.idle.Add(-1)
			return
		}
		select {
		case f = <-c.work:
			c.idle.Add(-1)
		case <-c.base.Done():
			c.idle.Add(-1)
			return
		}
	}
}

var errInProcessStopped = status.Error(codes.Unavailable, "the server is stopping: in-process calls are refused")

var errInProcessCutOff = status.Error(codes.Unavailable, "the server stopped before the in-process call returned")

func (c *inProcessCalls) begin() (func(), error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.stopped {
		return nil, errInProcessStopped
	}
	c.wg.Add(1)
	return c.wg.Done, nil
}

// context returns the server-side context of a call made on ctx: ctx's
// deadline and cancellation, none of its values.
func (c *inProcessCalls) context(ctx context.Context) (context.Context, context.CancelFunc) {
	sctx, cancel := context.WithCancel(c.base)
	if d, ok := ctx.Deadline(); ok {
		var cancelDeadline context.CancelFunc
		sctx, cancelDeadline = context.WithDeadline(sctx, d)
		prev := cancel
		cancel = func() { cancelDeadline(); prev() }
	}
	stop := context.AfterFunc(ctx, cancel)
	return sctx, func() { stop(); cancel() }
}

// stop refuses new calls and returns a channel closed once the calls in
// flight have returned.
func (c *inProcessCalls) stop() <-chan struct{} {
	c.mu.Lock()
	c.stopped = true
	c.mu.Unlock()
	done := make(chan struct{})
	go func() { c.wg.Wait(); close(done) }()
	return done
}

// chainUnary runs interceptors in order around a handler, as
// grpc.ChainUnaryInterceptor does on the server.
func chainUnary(interceptors []grpc.UnaryServerInterceptor) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		next := h
		for i := len(interceptors) - 1; i >= 0; i-- {
			ic, inner := interceptors[i], next
			next = func(ctx context.Context, req any) (any, error) { return ic(ctx, req, info, inner) }
		}
		return next(ctx, req)
	}
}
