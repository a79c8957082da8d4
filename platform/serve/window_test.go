package serve

import (
	"bytes"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// TestGRPC_staticFlowControlWindows speaks HTTP/2 to the gRPC port by
// hand: the server advertises its fixed stream window, and answers a call
// without a PING of its own. With gRPC's default dynamic windows it pings
// after every DATA frame it receives while no ping is out (to estimate the
// bandwidth-delay product): one ping and its acknowledgement per small
// message, both ways, which cost a message at one sender several system
// calls and thread switches (docs/benchmarks.md, "one sender: CPU per
// message").
func TestGRPC_staticFlowControlWindows(t *testing.T) {
	r := start(t, newServer(t))
	c, err := net.Dial("tcp", r.grpcConn.Target())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(closeMargin)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(c, c)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	var hdr bytes.Buffer
	enc := hpack.NewEncoder(&hdr)
	for _, f := range [][2]string{
		{":method", "POST"}, {":scheme", "http"}, {":path", "/grpc.health.v1.Health/Check"},
		{":authority", "localhost"}, {"content-type", "application/grpc"}, {"te", "trailers"},
	} {
		if err := enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]}); err != nil {
			t.Fatal(err)
		}
	}
	if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hdr.Bytes(), EndHeaders: true}); err != nil {
		t.Fatal(err)
	}
	// An empty HealthCheckRequest: uncompressed, zero bytes long.
	if err := fr.WriteData(1, true, []byte{0, 0, 0, 0, 0}); err != nil {
		t.Fatal(err)
	}
	var window uint32
	pings := 0
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("reading the server's frames: %v (the call's trailers never came)", err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if f.IsAck() {
				continue
			}
			if v, ok := f.Value(http2.SettingInitialWindowSize); ok {
				window = v
			}
			if err := fr.WriteSettingsAck(); err != nil {
				t.Fatal(err)
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				pings++
				if err := fr.WritePing(true, f.Data); err != nil {
					t.Fatal(err)
				}
			}
		case *http2.HeadersFrame:
			if f.StreamID != 1 || !f.StreamEnded() {
				continue
			}
			if window != grpcStreamWindow {
				t.Errorf("server's SETTINGS_INITIAL_WINDOW_SIZE = %d, want %d", window, grpcStreamWindow)
			}
			if pings != 0 {
				t.Errorf("server sent %d PINGs during one call, want none (a dynamic window's estimate)", pings)
			}
			return
		}
	}
}
