package e2e

import (
	"context"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/parleyhq/parley/platform/grpcclient"
	"github.com/parleyhq/parley/sdk"
)

// pingCountingListener hands out connections that count the PING frames
// (not acknowledgements) their client sends.
type pingCountingListener struct {
	net.Listener
	pings atomic.Int64
}

func (l *pingCountingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	pr, pw := io.Pipe()
	go func() {
		defer pr.Close()
		if _, err := io.ReadFull(pr, make([]byte, len(http2.ClientPreface))); err != nil {
			return
		}
		fr := http2.NewFramer(nil, pr)
		fr.SetMaxReadFrameSize(1 << 24)
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			if p, ok := f.(*http2.PingFrame); ok && !p.IsAck() {
				l.pings.Add(1)
			}
		}
	}()
	return &teeConn{Conn: c, w: pw}, nil
}

// teeConn copies what it reads to w.
type teeConn struct {
	net.Conn
	w *io.PipeWriter
}

func (c *teeConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		_, _ = c.w.Write(b[:n])
	}
	if err != nil {
		c.w.CloseWithError(err)
	}
	return n, err
}

// TestClientConnections_fixedFlowControlWindows checks that the
// connections Parley's clients make (grpcclient.Dial: the CLI and the
// services' peers; sdk.DialOptions: agents) have fixed flow-control
// windows. gRPC's default dynamic windows make the client send a PING
// after each DATA frame it receives while none is out, to estimate the
// bandwidth-delay product: a PING and its acknowledgement per response or
// streamed message, which cost both sides system calls and thread
// switches (docs/benchmarks.md, "workers and fixed client windows"). A
// connection with gRPC's defaults is the control: the count sees its
// pings.
func TestClientConnections_fixedFlowControlWindows(t *testing.T) {
	const calls = 40
	for _, tc := range []struct {
		name  string
		dial  func(addr string) (*grpc.ClientConn, error)
		pings func(n int64) bool
		want  string
	}{
		{"grpc defaults (control)", func(addr string) (*grpc.ClientConn, error) {
			return grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		}, func(n int64) bool { return n >= calls/4 }, "a PING for most responses"},
		{"grpcclient.Dial", func(addr string) (*grpc.ClientConn, error) {
			return grpcclient.Dial(addr, grpcclient.Options{})
		}, func(n int64) bool { return n == 0 }, "none"},
		{"sdk.DialOptions", func(addr string) (*grpc.ClientConn, error) {
			return grpc.NewClient(addr, append(sdk.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
		}, func(n int64) bool { return n == 0 }, "none"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			pl := &pingCountingListener{Listener: lis}
			srv := grpc.NewServer()
			healthpb.RegisterHealthServer(srv, health.NewServer())
			go srv.Serve(pl) //nolint:errcheck // ends with Stop
			defer srv.Stop()
			conn, err := tc.dial(lis.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			hc := healthpb.NewHealthClient(conn)
			for range calls {
				if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
					t.Fatal(err)
				}
			}
			// A ping answers a response the client has read: one sent
			// after the last call has arrived once a later call's has.
			time.Sleep(50 * time.Millisecond)
			if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
				t.Fatal(err)
			}
			if n := pl.pings.Load(); !tc.pings(n) {
				t.Errorf("the client sent %d PINGs during %d calls, want %s", n, calls+1, tc.want)
			}
		})
	}
}
