package server

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/platform/grpcerr"
)

// fakeResolver maps host names to addresses: the seam that lets a test
// aim Send at an "internal" address without any real private network.
func fakeResolver(m map[string]string) func(context.Context, string, string) ([]netip.Addr, error) {
	return func(_ context.Context, _, host string) ([]netip.Addr, error) {
		ip, ok := m[host]
		if !ok {
			// What the system resolver says, internals included.
			return nil, &net.DNSError{Err: "no such host", Name: host, Server: "10.255.255.53:53", IsNotFound: true}
		}
		return []netip.Addr{netip.MustParseAddr(ip)}, nil
	}
}

// TestSend_guardRefusesInternalAddresses runs Send on its real path with
// the outbound guard on (no --send-allow-private): names that resolve to
// loopback or private addresses are refused before connecting, and no
// error tells the caller what our resolver or network said.
func TestSend_guardRefusesInternalAddresses(t *testing.T) {
	var hits atomic.Int64
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hits.Add(1)
		_, _ = w.Write([]byte(`{"status":"success","body":"ok"}`)) // a failed write shows as the client's error
	}))
	t.Cleanup(target.Close)
	_, port, _ := net.SplitHostPort(target.Listener.Addr().String())
	lookup := fakeResolver(map[string]string{"loop.example": "127.0.0.1", "private.example": "10.1.2.3", "nat64.example": "64:ff9b::a01:203"})

	e := startWeather(t, 0, Options{SendLookup: lookup})
	e.reg.addAgent(agentRes(senderAgent, 0, 0))
	for _, tt := range []struct {
		name, url string
		code      codes.Code
		reason    string
		want      string
	}{
		{"loopback by name", "http://loop.example:" + port + "/agent", codes.InvalidArgument, "TARGET_REFUSED", "refused: internal address"},
		{"loopback literal", target.URL + "/agent", codes.InvalidArgument, "TARGET_REFUSED", "refused: internal address"},
		{"private by name", "http://private.example:" + port + "/agent", codes.InvalidArgument, "TARGET_REFUSED", "refused: internal address"},
		{"NAT64 by name", "http://nat64.example:" + port + "/agent", codes.InvalidArgument, "TARGET_REFUSED", "refused: internal address"},
		{"unknown name", "http://nowhere.example:" + port + "/agent", codes.Unavailable, "TARGET_UNAVAILABLE", "could not be reached"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := e.client.Send(t.Context(), &dispatcherv1.SendRequest{Agent: senderAgent, TargetUrl: tt.url, Text: "hi"})
			msg := status.Convert(err).Message()
			if status.Code(err) != tt.code || grpcerr.Reason(err) != tt.reason || !strings.Contains(msg, tt.want) {
				t.Fatalf("Send(%s) = %v; want %v %s saying %q", tt.url, err, tt.code, tt.reason, tt.want)
			}
			// The caller's own URL may be repeated; nothing else of ours.
			rest := strings.Replace(msg, tt.url, "", 1)
			for _, leak := range []string{"127.0.0.1", "10.1.2.3", "64:ff9b", "10.255.255.53", "lookup", "dial"} {
				if strings.Contains(rest, leak) {
					t.Errorf("Send(%s) error %q leaks %q", tt.url, msg, leak)
				}
			}
		})
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("target got %d requests through the guard, want 0", n)
	}

	// The same names with the guard off reach the target: the refusals
	// above were the guard's.
	off := startWeather(t, 0, Options{SendLookup: lookup, SendAllowPrivate: true})
	off.reg.addAgent(agentRes(senderAgent, 0, 0))
	resp, err := off.client.Send(t.Context(), &dispatcherv1.SendRequest{Agent: senderAgent, TargetUrl: "http://loop.example:" + port + "/agent", Text: "hi"})
	if err != nil || resp.GetStatus() != "success" || hits.Load() != 1 {
		t.Errorf("Send(guard off) = %v, %v, target hits %d; want success and 1 hit", resp, err, hits.Load())
	}
}
