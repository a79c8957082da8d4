package e2e

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/parleyhq/parley/platform/grpcclient"
	"github.com/parleyhq/parley/sdk"
)

// clientFrames is a listener whose connections read what their client
// sends through an HTTP/2 framer too: it counts the client's PINGs (not
// acknowledgements) and keeps the stream window of its SETTINGS.
type clientFrames struct {
	net.Listener
	pings  atomic.Int64
	mu     sync.Mutex
	window uint32 // SETTINGS_INITIAL_WINDOW_SIZE, 0 if not sent
}

func (l *clientFrames) Accept() (net.Conn, error) {
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
			switch f := f.(type) {
			case *http2.PingFrame:
				if !f.IsAck() {
					l.pings.Add(1)
				}
			case *http2.SettingsFrame:
				if v, ok := f.Value(http2.SettingInitialWindowSize); ok {
					l.mu.Lock()
					l.window = v
					l.mu.Unlock()
				}
			}
		}
	}()
	return &teeConn{Conn: c, w: pw}, nil
}

func (l *clientFrames) streamWindow() uint32 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.window
}

// teeConn copies what it reads to w, and waits until w's reader has it.
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
// connections Parley's clients make (grpcclient.Dial: the CLI, the
// gateway and the services' peers; sdk.DialOptions: agents) have fixed
// flow-control windows, the same in both. gRPC's default dynamic windows
// make the client send a PING after each DATA frame it receives while
// none is out, to estimate the bandwidth-delay product: a PING and its
// acknowledgement per response or streamed message, which cost both sides
// system calls and thread switches (docs/benchmarks.md, "One sender:
// in-process workers, fixed client windows"). A connection with gRPC's
// defaults is the control: the count sees its PINGs. It lives here, not
// beside grpcclient or the SDK, because it holds the two to the same
// windows, and only this module imports both.
func TestClientConnections_fixedFlowControlWindows(t *testing.T) {
	const calls = 40
	for _, tc := range []struct {
		name               string
		opts               []grpc.DialOption // with grpc.NewClient; nil: grpcclient.Dial
		minPings, maxPings int64
		window             uint32 // the stream window the client announces; 0: gRPC's default
	}{
		{name: "grpc defaults (control)", opts: []grpc.DialOption{}, minPings: calls / 2, maxPings: calls + 1},
		{name: "grpcclient.Dial", window: grpcclient.StreamWindow},
		{name: "sdk.DialOptions", opts: sdk.DialOptions(), window: grpcclient.StreamWindow},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			frames := &clientFrames{Listener: lis}
			srv := grpc.NewServer()
			healthpb.RegisterHealthServer(srv, health.NewServer())
			go srv.Serve(frames) //nolint:errcheck // ends with Stop
			defer srv.Stop()
			var conn *grpc.ClientConn
			if tc.opts == nil {
				conn, err = grpcclient.Dial(lis.Addr().String(), grpcclient.Options{})
			} else {
				conn, err = grpc.NewClient(lis.Addr().String(), append(tc.opts, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
			}
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			hc := healthpb.NewHealthClient(conn)
			// A PING answers a response the client has read, and goes out
			// ahead of the next call's frames, which the server reads only
			// once the framer has (teeConn): after the last call, every
			// PING for the ones before it is counted.
			for range calls + 1 {
				if _, err := hc.Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil {
					t.Fatal(err)
				}
			}
			if n := frames.pings.Load(); n < tc.minPings || n > tc.maxPings {
				t.Errorf("the client sent %d PINGs during %d calls, want %d to %d", n, calls+1, tc.minPings, tc.maxPings)
			}
			if tc.window != 0 {
				if got := frames.streamWindow(); got != tc.window {
					t.Errorf("the client's SETTINGS_INITIAL_WINDOW_SIZE = %d, want %d (grpcclient.StreamWindow)", got, tc.window)
				}
			}
		})
	}
}
