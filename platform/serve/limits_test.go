package serve

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// The limits below are tested with short values set through Options. A
// connection the server should close is read until EOF under a client
// deadline (closeMargin) that is many times the limit, so a busy machine
// cannot fail the test; no test asserts how long anything took.
const closeMargin = 20 * time.Second

// newLimitedServer returns a server with the given limits and the rest of
// Options left to their defaults.
func newLimitedServer(t *testing.T, l Limits) *Server {
	t.Helper()
	s, err := New(Options{Logger: slog.New(slog.DiscardHandler), ShutdownTimeout: 2 * time.Second, Limits: l})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// waitClosed reads c until the server closes it, failing the test if that
// takes longer than closeMargin. It returns what was read.
func waitClosed(t *testing.T, c net.Conn, why string) string {
	t.Helper()
	if err := c.SetReadDeadline(time.Now().Add(closeMargin)); err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("%s: connection still open after %s", why, closeMargin)
	}
	return string(b)
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestHTTP_slowBodyIsCutOff(t *testing.T) {
	s := newLimitedServer(t, Limits{ReadTimeout: 200 * time.Millisecond})
	s.Handle("POST /upload", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
		}
	}))
	r := start(t, s)
	c := dial(t, strings.TrimPrefix(r.baseURL, "http://"))
	// A body announced as 1 MB that arrives one byte at a time: the
	// trickle alone would take hours.
	fmt.Fprintf(c, "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n")
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				if _, err := c.Write([]byte("x")); err != nil {
					return
				}
			}
		}
	}()
	waitClosed(t, c, "slow body")
}

func TestHTTP_routeWithLongerReadTimeoutTakesSlowBody(t *testing.T) {
	const read = 100 * time.Millisecond
	s := newLimitedServer(t, Limits{ReadTimeout: read})
	s.Handle("POST /upload", Timeouts(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, "%d", len(b))
	}), 50*read, 50*read))
	r := start(t, s)
	// The body arrives over about 5 read timeouts, well inside the route's 50.
	pr, pw := io.Pipe()
	go func() {
		for range 10 {
			time.Sleep(read / 2)
			if _, err := pw.Write([]byte("x")); err != nil {
				return
			}
		}
		pw.Close()
	}()
	req, err := http.NewRequest(http.MethodPost, r.baseURL+"/upload", pr)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = 10
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || string(b) != "10" {
		t.Errorf("slow upload = %d %q, want 200 \"10\"", resp.StatusCode, b)
	}
}

func TestHTTP_idleKeepAliveIsClosed(t *testing.T) {
	s := newLimitedServer(t, Limits{IdleTimeout: 200 * time.Millisecond})
	r := start(t, s)
	c := dial(t, strings.TrimPrefix(r.baseURL, "http://"))
	fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Close {
		t.Fatalf("GET /healthz = %d (close %v), want 200 on a kept-alive connection", resp.StatusCode, resp.Close)
	}
	waitClosed(t, c, "idle keep-alive connection")
}

// slowHandler writes a first line, waits until the server's write deadline
// has passed, and writes a second.
func slowHandler(wait time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		rc := http.NewResponseController(w)
		fmt.Fprintln(w, "first")
		_ = rc.Flush()
		time.Sleep(wait)
		fmt.Fprintln(w, "second")
		_ = rc.Flush()
	})
}

func TestHTTP_writeTimeoutSparesStreams(t *testing.T) {
	const write = 100 * time.Millisecond
	s := newLimitedServer(t, Limits{WriteTimeout: write})
	// Both handlers write their second line after 5 write timeouts.
	s.Handle("GET /short", slowHandler(5*write))
	s.Handle("GET /stream", Stream(slowHandler(5*write)))
	r := start(t, s)

	read := func(path string) (string, error) {
		resp, err := http.Get(r.baseURL + path)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return string(b), err
	}
	if body, err := read("/stream"); err != nil || body != "first\nsecond\n" {
		t.Errorf("GET /stream = %q, %v; want both lines: a stream outlives the write timeout", body, err)
	}
	if body, err := read("/short"); err == nil && strings.Contains(body, "second") {
		t.Errorf("GET /short = %q, want the response cut off by the write timeout", body)
	}
}

func TestListener_refusesConnectionsOverTheCap(t *testing.T) {
	s := newLimitedServer(t, Limits{MaxConnections: 2})
	r := start(t, s)
	addr := strings.TrimPrefix(r.baseURL, "http://")
	held := []net.Conn{dial(t, addr), dial(t, addr)}
	// The server has accepted both once each answers a request; then a
	// third connection is over the cap.
	for _, c := range held {
		fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	third := dial(t, addr)
	fmt.Fprintf(third, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	if got := waitClosed(t, third, "connection over the cap"); strings.Contains(got, "200 OK") {
		t.Fatalf("third connection got %q, want it refused", got)
	}
	if n := testutil.ToFloat64(s.refused.WithLabelValues("http")); n < 1 {
		t.Errorf("parley_connections_refused_total{server=http} = %v, want >= 1", n)
	}

	// Once a held connection closes, a new one is served again.
	held[0].Close()
	deadline := time.Now().Add(closeMargin)
	for {
		resp, err := http.Get(r.baseURL + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no connection served within %s of one closing: %v", closeMargin, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// http2Preface is what every HTTP/2 client sends first.
const http2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

func TestGRPC_prefaceOnlyConnectionIsClosed(t *testing.T) {
	s := newLimitedServer(t, Limits{HandshakeTimeout: 200 * time.Millisecond})
	r := start(t, s)
	c := dial(t, r.grpcConn.Target())
	if _, err := io.WriteString(c, http2Preface); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, c, "preface-only gRPC connection")
}

func TestGRPC_silentConnectionIsClosed(t *testing.T) {
	// A client that completes the handshake (preface and SETTINGS) and then
	// never answers the server's keepalive pings nor opens a stream.
	s := newLimitedServer(t, Limits{
		GRPCKeepaliveTime:    100 * time.Millisecond,
		GRPCKeepaliveTimeout: 100 * time.Millisecond,
	})
	r := start(t, s)
	c := dial(t, r.grpcConn.Target())
	// An empty SETTINGS frame: length 0, type 4, flags 0, stream 0.
	if _, err := io.WriteString(c, http2Preface+"\x00\x00\x00\x04\x00\x00\x00\x00\x00"); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, c, "silent gRPC connection")
}

func TestGRPC_idleConnectionIsClosed(t *testing.T) {
	// A connection with no call open is closed after GRPCMaxConnectionIdle,
	// even while the keepalive pings (default interval) have not yet begun.
	s := newLimitedServer(t, Limits{GRPCMaxConnectionIdle: 200 * time.Millisecond})
	r := start(t, s)
	addr := r.grpcConn.Target()
	c := dial(t, addr)
	if _, err := io.WriteString(c, http2Preface+"\x00\x00\x00\x04\x00\x00\x00\x00\x00"); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, c, "idle gRPC connection")
}

func TestGRPC_streamOutlivesMaxConnectionAge(t *testing.T) {
	// A long-lived stream (an SDK agent's Connect, WatchTask) keeps its
	// connection past GRPCMaxConnectionAge: the server only stops new calls
	// on it. health.Watch stands in for such a stream.
	const age = 100 * time.Millisecond
	s := newLimitedServer(t, Limits{GRPCMaxConnectionAge: age})
	s.HealthService("parley.test.v1.TestService")
	r := start(t, s)
	stream, err := healthpb.NewHealthClient(r.grpcConn).Watch(t.Context(),
		&healthpb.HealthCheckRequest{Service: "parley.test.v1.TestService"}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatal(err)
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			break
		}
	}
	time.Sleep(5 * age) // let the connection pass its age
	s.health.SetServingStatus("parley.test.v1.TestService", healthpb.HealthCheckResponse_NOT_SERVING)
	resp, err := stream.Recv()
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("Recv() after the connection's max age = %v, %v; want NOT_SERVING on the same stream", resp.GetStatus(), err)
	}
}

func TestNew_limitDefaults(t *testing.T) {
	s := newServer(t)
	l := s.opts.Limits
	for name, v := range map[string]time.Duration{
		"ReadTimeout": l.ReadTimeout, "WriteTimeout": l.WriteTimeout, "IdleTimeout": l.IdleTimeout,
		"HandshakeTimeout": l.HandshakeTimeout, "GRPCKeepaliveTime": l.GRPCKeepaliveTime,
		"GRPCKeepaliveTimeout": l.GRPCKeepaliveTimeout, "GRPCMinPingInterval": l.GRPCMinPingInterval,
		"GRPCMaxConnectionIdle": l.GRPCMaxConnectionIdle, "GRPCMaxConnectionAge": l.GRPCMaxConnectionAge,
	} {
		if v <= 0 {
			t.Errorf("default %s = %v, want a positive limit", name, v)
		}
	}
	if l.MaxConnections <= 0 {
		t.Errorf("default MaxConnections = %d, want a positive cap", l.MaxConnections)
	}
}

func TestFlags_maxConnectionsReachesOptions(t *testing.T) {
	var f Flags
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	f.Register(fs, "", "", "")
	if err := fs.Parse([]string{"--max-connections", "7"}); err != nil {
		t.Fatal(err)
	}
	if got := f.Options(slog.New(slog.DiscardHandler)).Limits.MaxConnections; got != 7 {
		t.Errorf("Options().Limits.MaxConnections = %d, want 7 from --max-connections", got)
	}
}
