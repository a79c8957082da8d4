// Package serve runs one or more Parley services behind one gRPC server and
// one HTTP server.
//
// The HTTP side is a net/http mux holding /healthz (live), /readyz (every
// registered check passes), /metrics (the caller's private Prometheus
// registry), hand-written routes added with Handle, and, as the fallback for
// every other path, the grpc-gateway mux. Services register their gateway
// handlers in-process (Register…HandlerServer) on Gateway: dialing our own
// gRPC port would cost about 3x in throughput. That path skips gRPC
// interceptors, so telemetry.Middleware applies the same concerns to HTTP.
//
// Every connection is bounded (Limits): HTTP read, write and idle timeouts,
// which long-lived routes lift with Stream or stretch with Timeouts; a cap
// on open connections per listener; and on gRPC a handshake timeout,
// keepalive pings with enforcement, an idle limit and a maximum age.
//
// Shutdown (when Run's context ends): health flips to NOT_SERVING first, then
// HTTP drains, then the drain hooks run (OnDrain), then gRPC stops
// gracefully, all of it forced after ShutdownTimeout.
package serve

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/test/bufconn"

	"github.com/parleyhq/parley/platform/auth"
	"github.com/parleyhq/parley/platform/telemetry"
)

// Options configures a Server. Logger is required.
type Options struct {
	Logger *slog.Logger
	// Registry is the private Prometheus registry served at /metrics; a new
	// one when nil. Services add their collectors through Server.Registry.
	Registry *prometheus.Registry
	// TLSCertFile and TLSKeyFile, when both set, serve HTTPS and TLS gRPC.
	TLSCertFile, TLSKeyFile string
	// TLSClientCAFile, with TLSCertFile, requires every gRPC client to
	// present a certificate this CA issued (the in-process pipe excepted);
	// the HTTP side verifies one when given, so that health probes and
	// public routes (Agora, discovery) stay reachable.
	TLSClientCAFile string
	// ShutdownTimeout bounds the whole drain; 10s when zero.
	ShutdownTimeout time.Duration
	// ReadinessInterval is how often the readiness checks run to drive the
	// gRPC health of the declared services; 5s when zero.
	ReadinessInterval time.Duration
	// MaxBodyBytes caps request bodies on gateway routes (hand-written routes
	// set their own limits); 4 MiB when zero. It also caps gRPC messages.
	MaxBodyBytes int64
	// OperatorTokenFile and DataDir locate the operator token (see
	// auth.LoadOperatorToken); with both empty there is none.
	OperatorTokenFile, DataDir string
	// Limits bounds connections: timeouts, a cap per listener, gRPC
	// keepalive. Zero fields take the defaults documented on Limits.
	Limits Limits
	// Policy, when set, switches access control on: every gRPC call,
	// gateway route and hand-written route is checked against it (see
	// package auth), and calls it does not list are refused. Keys are
	// refused until SetKeyVerifier.
	Policy auth.Policy
	// MetricsPublic leaves /metrics open to anyone when Policy is set;
	// otherwise it needs the operator token.
	MetricsPublic bool
	// AuthFailBurst is how many failed authentications one address may
	// make before getting RESOURCE_EXHAUSTED (auth.Options.FailBurst) [20].
	AuthFailBurst int
}

// Server is a gRPC server plus an HTTP server sharing health and metrics.
type Server struct {
	// GRPC is the gRPC server. Register services through the Server
	// itself (RegisterService, before Run), not on GRPC: only then do
	// InProcessConn's unary calls skip the pipe.
	GRPC *grpc.Server
	// Gateway is the in-process grpc-gateway mux; register handlers on it.
	Gateway *runtime.ServeMux

	opts    Options
	logger  *slog.Logger
	metrics *telemetry.Metrics
	refused *prometheus.CounterVec // connections refused over Limits.MaxConnections
	health  *health.Server
	mux     *http.ServeMux
	routes  *http.ServeMux // the hand-written routes alone, to find wrong methods
	tlsConf *tls.Config

	mu       sync.Mutex // guards services, checks, pipe, patterns and drains
	services []string
	drains   []func(context.Context) // see OnDrain
	shapes   []errorShape            // see HandleErrors
	checks   []check
	pipe     *bufconn.Listener // in-process clients, see InProcessConn
	// unaryMethods are the registered services' unary handlers by full
	// method name, and unary the interceptors a call from outside passes
	// through, chained: InProcessConn calls them directly.
	unaryMethods map[string]unaryMethod
	unary        grpc.UnaryServerInterceptor
	inproc       *inProcessCalls
	serving      chan struct{} // closed when Run starts serving
	running      bool          // Run has started serving
	patterns     []string      // hand-written route patterns, for Routes

	stopping chan struct{} // closed when shutdown starts; see Stopping
	stopOnce sync.Once

	operatorToken string              // never logged
	tokenWritten  string              // the token's file, when New wrote it
	auth          *auth.Authenticator // nil: access control off
}

type check struct {
	name string
	fn   func(context.Context) error
}

// New builds a Server. It listens on nothing until Run.
func New(opts Options) (*Server, error) {
	if opts.Logger == nil {
		return nil, errors.New("serve: Logger is required")
	}
	if opts.Registry == nil {
		opts.Registry = prometheus.NewRegistry()
	}
	if opts.ShutdownTimeout <= 0 {
		opts.ShutdownTimeout = 10 * time.Second
	}
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = 4 << 20
	}
	if opts.ReadinessInterval <= 0 {
		opts.ReadinessInterval = 5 * time.Second
	}
	opts.Limits = opts.Limits.withDefaults()
	s := &Server{opts: opts, logger: opts.Logger, health: health.NewServer(), mux: http.NewServeMux(), routes: http.NewServeMux(), stopping: make(chan struct{})}
	s.metrics = telemetry.NewMetrics(opts.Registry)
	if opts.OperatorTokenFile != "" || opts.DataDir != "" {
		tok, file, created, err := auth.LoadOperatorToken(opts.OperatorTokenFile, opts.DataDir)
		if err != nil {
			return nil, fmt.Errorf("operator token: %w", err)
		}
		s.operatorToken = tok
		if created {
			// Logged when serving starts, so that a server failing to
			// start prints only why.
			s.tokenWritten = file
		} else {
			s.logger.Debug("operator token read", slog.String("path", file))
		}
	}
	s.refused = newRefusedCounter(opts.Registry)

	s.inproc, s.serving = newInProcessCalls(), make(chan struct{})
	unary := telemetry.UnaryInterceptors(s.metrics, s.logger)
	grpcOpts := append(telemetry.ServerOptions(s.metrics, s.logger),
		grpc.MaxRecvMsgSize(int(opts.MaxBodyBytes)))
	gatewayAuth := func(next runtime.HandlerFunc) runtime.HandlerFunc { return next }
	if opts.Policy != nil {
		policy := opts.Policy
		if opts.MetricsPublic {
			policy = maps.Clone(policy)
			policy["GET /metrics"] = auth.Rule{Allow: auth.Anyone}
		}
		s.auth = auth.New(auth.Options{OperatorToken: s.operatorToken, Policy: policy, Logger: s.logger, FailBurst: opts.AuthFailBurst})
		// Inside the telemetry chain, so refusals are counted and logged
		// like any other failed call.
		grpcOpts = append(grpcOpts,
			grpc.ChainUnaryInterceptor(s.auth.UnaryInterceptor()),
			grpc.ChainStreamInterceptor(s.auth.StreamInterceptor()))
		unary = append(unary, s.auth.UnaryInterceptor())
		gatewayAuth = s.auth.Gateway
	}
	grpcOpts = append(grpcOpts, opts.Limits.grpcOptions()...)
	if (opts.TLSCertFile == "") != (opts.TLSKeyFile == "") {
		return nil, errors.New("--tls-cert and --tls-key must be given together")
	}
	if opts.TLSCertFile != "" {
		cert, err := tls.LoadX509KeyPair(opts.TLSCertFile, opts.TLSKeyFile)
		if err != nil {
			return nil, fmt.Errorf("load TLS key pair: %w", err)
		}
		s.tlsConf = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		grpcTLS := s.tlsConf
		if opts.TLSClientCAFile != "" {
			if grpcTLS, err = s.requireClientCerts(opts.TLSClientCAFile); err != nil {
				return nil, err
			}
		}
		grpcOpts = append(grpcOpts, grpc.Creds(credentials.NewTLS(grpcTLS)))
	} else if opts.TLSClientCAFile != "" {
		return nil, errors.New("--tls-client-ca needs --tls-cert and --tls-key: mTLS is TLS first")
	}
	s.GRPC = grpc.NewServer(grpcOpts...)
	s.unary = chainUnary(unary)
	healthpb.RegisterHealthServer(s.GRPC, s.health)
	reflection.Register(s.GRPC)
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)

	s.Gateway = runtime.NewServeMux(
		// Only permanent HTTP headers (Authorization among them) become
		// metadata: a forwarded caller (auth.ForwardedCallerHeader) is a
		// service's word and must never come from an HTTP request, as
		// "Grpc-Metadata-Parley-Caller" would with LegacyHeaderMatcher
		// (e2e TestSeparateProcesses_mTLS).
		runtime.WithIncomingHeaderMatcher(runtime.DefaultHeaderMatcher),
		runtime.WithErrorHandler(errorHandler),
		runtime.WithRoutingErrorHandler(routingErrorHandler),
		// Keep %2F and other reserved escapes intact while routing, so an
		// id holding "/" (a base64 protocol hash) stays one path segment.
		runtime.WithUnescapingMode(runtime.UnescapingModeAllExceptReserved),
		runtime.WithMiddlewares(func(next runtime.HandlerFunc) runtime.HandlerFunc {
			return func(w http.ResponseWriter, r *http.Request, params map[string]string) {
				if p, ok := runtime.HTTPPathPattern(r.Context()); ok {
					telemetry.SetRoute(r.Context(), p)
				}
				next(w, r, params)
			}
		}, gatewayAuth),
	)
	limited := http.MaxBytesHandler(s.Gateway, opts.MaxBodyBytes)
	s.mux.Handle("/", s.fallback(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		limited.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), maxBodyKey{}, opts.MaxBodyBytes)))
	})))
	s.handle("GET /healthz", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	}))
	s.handle("GET /readyz", http.HandlerFunc(s.readyz))
	s.handle("GET /metrics", promhttp.HandlerFor(opts.Registry, promhttp.HandlerOpts{Registry: opts.Registry}))
	return s, nil
}

// Stopping returns a channel closed when shutdown starts. Handlers of
// long-lived streams (server-sent events, agent streams) end their stream
// when it closes, so that the drain finishes quickly; short requests need
// not watch it, as they are drained.
func (s *Server) Stopping() <-chan struct{} { return s.stopping }

// ShutdownTimeout returns how long a shutdown may take, from Stopping:
// work that ends with it (closing streams' records) fits in it too.
func (s *Server) ShutdownTimeout() time.Duration { return s.opts.ShutdownTimeout }

// OnDrain adds fn to the work a shutdown waits for: once the HTTP server
// has drained its requests, and before gRPC stops, Run calls each fn in
// the order added with a context that ends when ShutdownTimeout runs out,
// and returns only after they have. net/http's drain does not wait for
// hijacked connections: a handler that serves a stream on one registers
// here what waits for those streams to write their last event.
func (s *Server) OnDrain(fn func(context.Context)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.drains = append(s.drains, fn)
}

// Registry returns the Prometheus registry served at /metrics.
func (s *Server) Registry() *prometheus.Registry { return s.opts.Registry }

// Logger returns the server's logger.
func (s *Server) Logger() *slog.Logger { return s.logger }

// Handle adds a hand-written HTTP route (Go ServeMux pattern syntax). Such
// routes get telemetry and the read and write timeouts of Limits, but no
// body cap: they set their own. Wrap long-lived streams in Stream.
func (s *Server) Handle(pattern string, h http.Handler) { s.handle(pattern, h) }

// handle mounts a route, behind the access policy when it is on.
func (s *Server) handle(pattern string, h http.Handler) {
	s.mu.Lock()
	s.patterns = append(s.patterns, pattern)
	s.mu.Unlock()
	if s.auth != nil {
		h = s.auth.Route(pattern, h)
	}
	s.mux.Handle(pattern, h)
	s.routes.Handle(pattern, h)
}

// SetKeyVerifier sets what checks client and agent keys when access
// control is on: the registry's store in its own process, an introspecting
// client elsewhere. Without one, only the operator token authenticates.
func (s *Server) SetKeyVerifier(v auth.Verifier) {
	if s.auth != nil {
		s.auth.SetVerifier(v)
	}
}

// FallbackKeyVerifier sets v as the key verifier unless one is set: a
// service that reaches the registry only over gRPC offers an introspecting
// verifier, which the registry's own (SetKeyVerifier) overrides when both
// run in one process.
func (s *Server) FallbackKeyVerifier(v auth.Verifier) {
	if s.auth != nil {
		s.auth.SetVerifierIfUnset(v)
	}
}

// ShareAuthLimits keeps the limit on failed authentications per address
// (Options.AuthFailBurst) in b, where every replica sees it: a service on
// PostgreSQL passes its pgdb.DB. Without it, each replica limits alone.
// The first call wins.
func (s *Server) ShareAuthLimits(b auth.SharedBuckets) {
	if s.auth != nil {
		s.auth.ShareFailures(b)
	}
}

// Routes returns the patterns of the hand-written HTTP routes, for tests
// that check each has an access policy entry.
func (s *Server) Routes() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.patterns)
}

// AuthEnabled reports whether access control is on.
func (s *Server) AuthEnabled() bool { return s.auth != nil }

// HealthService declares gRPC service names whose health status follows the
// server's: NOT_SERVING until Run, SERVING while it runs.
func (s *Server) HealthService(names ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range names {
		s.services = append(s.services, n)
		s.health.SetServingStatus(n, healthpb.HealthCheckResponse_NOT_SERVING)
	}
}

// AddReadinessCheck adds a check run by /readyz: a store being open or a
// peer being reachable. It should return within a second or two.
func (s *Server) AddReadinessCheck(name string, fn func(context.Context) error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.checks = append(s.checks, check{name: name, fn: fn})
}

// runChecks runs every readiness check and returns the failures by name.
func (s *Server) runChecks(ctx context.Context) map[string]string {
	s.mu.Lock()
	checks := append([]check(nil), s.checks...)
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	failures := map[string]string{}
	for _, c := range checks {
		if err := c.fn(ctx); err != nil {
			failures[c.name] = err.Error()
		}
	}
	return failures
}

// watchReadiness runs the readiness checks every ReadinessInterval and sets
// the gRPC health of the declared services (not the server-wide "" entry)
// to match, so gRPC health probes see a store or dependency outage. Callers
// check a peer's "" entry (PeerCheck), which stays SERVING while the server
// runs, so an outage does not cascade down the chain of callers.
func (s *Server) watchReadiness(ctx context.Context) {
	t := time.NewTicker(s.opts.ReadinessInterval)
	defer t.Stop()
	last := healthpb.HealthCheckResponse_SERVING
	for {
		st := healthpb.HealthCheckResponse_SERVING
		if failures := s.runChecks(ctx); len(failures) > 0 {
			st = healthpb.HealthCheckResponse_NOT_SERVING
			if last == healthpb.HealthCheckResponse_SERVING && ctx.Err() == nil {
				s.logger.WarnContext(ctx, "not ready; reporting NOT_SERVING until checks pass", slog.Any("failures", failures))
			}
		}
		if ctx.Err() != nil {
			return
		}
		if st != last {
			s.mu.Lock()
			for _, n := range s.services {
				s.health.SetServingStatus(n, st)
			}
			s.mu.Unlock()
			last = st
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	failures := s.runChecks(r.Context())
	if len(failures) > 0 {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "unavailable", "failures": failures})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// Handler returns the HTTP handler with telemetry applied, for tests and for
// callers that run their own http.Server.
func (s *Server) Handler() http.Handler {
	var h http.Handler = s.mux
	if s.auth != nil {
		h = s.auth.Middleware(h)
	}
	return s.metrics.Middleware(s.logger, h)
}

// Run serves gRPC on grpcLis and HTTP on httpLis until ctx ends or a server
// fails, then shuts down within ShutdownTimeout. It returns nil after a
// clean shutdown caused by ctx.
func (s *Server) Run(ctx context.Context, grpcLis, httpLis net.Listener) error {
	// Requests get their own base context, cancelled only once the drain is
	// over: cancelling them with ctx (the signal) would abort requests in
	// flight instead of letting Shutdown drain them. Long-lived handlers
	// (event streams, agent streams) watch Stopping instead.
	baseCtx, cancelBase := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelBase()
	lim := s.opts.Limits
	grpcLis = limitListener(grpcLis, lim.MaxConnections, s.refused.WithLabelValues("grpc"))
	httpLis = limitListener(httpLis, lim.MaxConnections, s.refused.WithLabelValues("http"))
	httpSrv := &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: min(10*time.Second, lim.ReadTimeout),
		ReadTimeout:       lim.ReadTimeout,
		WriteTimeout:      lim.WriteTimeout,
		IdleTimeout:       lim.IdleTimeout,
		MaxHeaderBytes:    64 << 10,
		TLSConfig:         s.tlsConf,
		ErrorLog:          slog.NewLogLogger(s.logger.Handler(), slog.LevelWarn),
		BaseContext:       func(net.Listener) context.Context { return baseCtx },
	}
	errc := make(chan error, 2)
	go func() {
		if err := s.GRPC.Serve(grpcLis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			errc <- fmt.Errorf("grpc server: %w", err)
		}
	}()
	go func() {
		var err error
		if s.tlsConf != nil {
			err = httpSrv.ServeTLS(httpLis, "", "")
		} else {
			err = httpSrv.Serve(httpLis)
		}
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("http server: %w", err)
		}
	}()
	s.mu.Lock()
	if !s.running {
		close(s.serving)
	}
	s.running = true
	if s.pipe != nil {
		go s.servePipe(s.pipe)
	}
	s.mu.Unlock()
	s.setServing(healthpb.HealthCheckResponse_SERVING)
	if s.tokenWritten != "" {
		s.logger.InfoContext(ctx, "operator token written; send it as 'authorization: Bearer <token>' to act as the operator", slog.String("path", s.tokenWritten))
	}
	watchCtx, stopWatch := context.WithCancel(context.WithoutCancel(ctx))
	watchDone := make(chan struct{})
	go func() { defer close(watchDone); s.watchReadiness(watchCtx) }()

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errc:
	}
	s.logger.InfoContext(ctx, "shutting down", slog.String("timeout", s.opts.ShutdownTimeout.String()))
	stopWatch()
	<-watchDone
	s.health.Shutdown() // every service NOT_SERVING first, so balancers stop sending
	s.stopOnce.Do(func() { close(s.stopping) })
	// ctx is done by now; the drain gets its own bounded context.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.ShutdownTimeout)
	defer cancel()
	if err := httpSrv.Shutdown(sctx); err != nil {
		s.logger.WarnContext(ctx, "http drain cut short; closing connections", slog.Any("err", err))
		cancelBase()
		_ = httpSrv.Close()
	}
	s.mu.Lock()
	drains := s.drains
	s.mu.Unlock()
	for _, fn := range drains {
		fn(sctx)
	}
	stopped, inprocDone := make(chan struct{}), s.inproc.stop()
	go func() { s.GRPC.GracefulStop(); <-inprocDone; close(stopped) }()
	select {
	case <-stopped:
	case <-sctx.Done():
		s.logger.WarnContext(ctx, "grpc drain cut short; stopping")
		s.inproc.cancel() // as Stop cancels the calls over a transport
		s.GRPC.Stop()
		<-stopped
	}
	s.inproc.cancel()
	return runErr
}

func (s *Server) setServing(st healthpb.HealthCheckResponse_ServingStatus) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.health.SetServingStatus("", st)
	for _, n := range s.services {
		s.health.SetServingStatus(n, st)
	}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
