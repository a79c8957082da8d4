package serve

import (
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/parleyhq/parley/platform/grpcclient"
)

// Limits bound what one connection may hold, so that slow or silent peers
// cannot exhaust the server's file descriptors or goroutines. Zero fields
// take the defaults noted.
type Limits struct {
	// ReadTimeout bounds reading one HTTP request, body included; 30s. A
	// body that trickles in slower is cut off. Routes wrapped in Stream
	// are exempt.
	ReadTimeout time.Duration
	// WriteTimeout bounds one HTTP response, from the end of its headers'
	// read to the last byte written; 60s. Stream routes are exempt.
	WriteTimeout time.Duration
	// IdleTimeout closes a kept-alive HTTP connection that sends no new
	// request; 2m.
	IdleTimeout time.Duration
	// MaxConnections caps the open connections on each listener (HTTP and
	// gRPC separately); 400, so both fit under the common limit of 1,024
	// open files with room for stores and outbound calls. Connections over
	// the cap are closed at once and counted in
	// parley_connections_refused_total.
	MaxConnections int
	// HandshakeTimeout bounds a new gRPC connection's TLS handshake and
	// HTTP/2 preface and settings; 10s. A connection that sends only the
	// preface is closed after it.
	HandshakeTimeout time.Duration
	// GRPCKeepaliveTime is how long a gRPC connection may be silent before
	// the server pings it; 1m. GRPCKeepaliveTimeout is how long the ping
	// may go unanswered before the connection is closed; 20s.
	GRPCKeepaliveTime, GRPCKeepaliveTimeout time.Duration
	// GRPCMinPingInterval is the shortest interval at which clients may
	// ping; 10s. A client pinging faster is disconnected.
	GRPCMinPingInterval time.Duration
	// GRPCMaxConnectionIdle closes a gRPC connection with no call open for
	// this long; 5m.
	GRPCMaxConnectionIdle time.Duration
	// GRPCMaxConnectionAge stops new calls on a gRPC connection this old, so
	// clients reconnect (and rebalance); 30m. Calls already open, such as an
	// SDK agent's Connect stream, carry on until they end.
	GRPCMaxConnectionAge time.Duration
}

// withDefaults fills the zero fields of l.
func (l Limits) withDefaults() Limits {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&l.ReadTimeout, 30*time.Second)
	def(&l.WriteTimeout, 60*time.Second)
	def(&l.IdleTimeout, 2*time.Minute)
	def(&l.HandshakeTimeout, 10*time.Second)
	def(&l.GRPCKeepaliveTime, time.Minute)
	def(&l.GRPCKeepaliveTimeout, 20*time.Second)
	def(&l.GRPCMinPingInterval, 10*time.Second)
	def(&l.GRPCMaxConnectionIdle, 5*time.Minute)
	def(&l.GRPCMaxConnectionAge, 30*time.Minute)
	if l.MaxConnections <= 0 {
		l.MaxConnections = 400
	}
	return l
}

// The gRPC flow-control windows are fixed, as Parley's clients fix
// theirs (grpcclient.StreamWindow, grpcclient.ConnWindow). gRPC's dynamic
// windows (its default) would grow up to 16 MiB by estimating each
// connection's bandwidth-delay product, which costs a PING round trip per
// small message received; these fixed ones let a 4 MiB request
// (--max-body-bytes' default) arrive in four round trips.
const (
	grpcStreamWindow = grpcclient.StreamWindow
	grpcConnWindow   = grpcclient.ConnWindow
)

// grpcOptions are the gRPC server options enforcing l.
func (l Limits) grpcOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ConnectionTimeout(l.HandshakeTimeout),
		// Fixed windows: gRPC's dynamic ones cost a PING and its
		// acknowledgement per small message received (window_test.go).
		grpc.StaticStreamWindowSize(grpcStreamWindow),
		grpc.StaticConnWindowSize(grpcConnWindow),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			Time:              l.GRPCKeepaliveTime,
			Timeout:           l.GRPCKeepaliveTimeout,
			MaxConnectionIdle: l.GRPCMaxConnectionIdle,
			MaxConnectionAge:  l.GRPCMaxConnectionAge,
			// MaxConnectionAgeGrace stays infinite: open streams end on
			// their own terms.
		}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             l.GRPCMinPingInterval,
			PermitWithoutStream: true,
		}),
	}
}

// Stream marks h as a long-lived stream (server-sent events and the like):
// the server's read and write timeouts do not apply to it. The handler must
// end when the client goes away or the server stops (Server.Stopping).
func Stream(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		// Errors mean the connection cannot change deadlines (a test
		// recorder); the stream then keeps the server's.
		_ = rc.SetReadDeadline(time.Time{})
		_ = rc.SetWriteDeadline(time.Time{})
		h.ServeHTTP(w, r)
	})
}

// Timeouts gives h its own read and write timeouts, counted from when the
// handler starts, in place of the server's: a route taking large uploads
// needs more than ReadTimeout. Zero keeps the server's.
func Timeouts(h http.Handler, read, write time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		now := time.Now()
		if read > 0 {
			_ = rc.SetReadDeadline(now.Add(read))
		}
		if write > 0 {
			_ = rc.SetWriteDeadline(now.Add(write))
		}
		h.ServeHTTP(w, r)
	})
}

// newRefusedCounter is parley_connections_refused_total, by server.
func newRefusedCounter(reg prometheus.Registerer) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "parley_connections_refused_total",
		Help: "Connections closed on accept because the listener held Limits.MaxConnections already.",
	}, []string{"server"})
	reg.MustRegister(c)
	return c
}

// capListener closes accepted connections beyond max open ones. Refusing at
// once, rather than leaving them queued in the kernel, tells a client the
// server is full instead of letting it wait for a timeout.
type capListener struct {
	net.Listener
	refused prometheus.Counter

	mu   sync.Mutex
	open int
	max  int
}

func limitListener(l net.Listener, max int, refused prometheus.Counter) net.Listener {
	return &capListener{Listener: l, max: max, refused: refused}
}

func (l *capListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		l.mu.Lock()
		if l.open >= l.max {
			l.mu.Unlock()
			l.refused.Inc()
			c.Close()
			continue
		}
		l.open++
		l.mu.Unlock()
		return &cappedConn{Conn: c, l: l}, nil
	}
}

type cappedConn struct {
	net.Conn
	l    *capListener
	once sync.Once
}

func (c *cappedConn) Close() error {
	c.once.Do(func() {
		c.l.mu.Lock()
		c.l.open--
		c.l.mu.Unlock()
	})
	return c.Conn.Close()
}
