package egress

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// TestBlocked lists every refused range with an address inside it and the
// address just outside it (after its last address, or before its first when
// that is the interesting side). An outside address is public ("") unless
// it falls in a neighbouring range, which the want column names.
func TestBlocked(t *testing.T) {
	for _, tt := range []struct {
		prefix               string
		inside, insideWant   string
		outside, outsideWant string
	}{
		{"0.0.0.0/8", "0.0.0.1", "this-network", "1.0.0.0", ""},
		{"10.0.0.0/8", "10.0.0.1", "private", "11.0.0.0", ""},
		{"10.0.0.0/8 (before)", "10.255.255.255", "private", "9.255.255.255", ""},
		{"100.64.0.0/10", "100.64.0.1", "CGNAT", "100.128.0.0", ""},
		{"100.64.0.0/10 (before)", "100.127.255.255", "CGNAT", "100.63.255.255", ""},
		{"127.0.0.0/8", "127.0.0.1", "loopback", "128.0.0.0", ""},
		{"169.254.0.0/16", "169.254.0.1", "link-local", "169.255.0.0", ""},
		{"169.254.169.254", "169.254.169.254", "cloud metadata", "169.254.169.253", "link-local"},
		{"172.16.0.0/12", "172.16.0.1", "private", "172.32.0.0", ""},
		{"172.16.0.0/12 (before)", "172.31.255.255", "private", "172.15.255.255", ""},
		{"192.0.0.0/24", "192.0.0.1", "IETF protocol assignment", "192.0.1.0", ""},
		{"192.0.2.0/24", "192.0.2.1", "documentation", "192.0.3.0", ""},
		{"192.88.99.0/24", "192.88.99.1", "6to4 relay anycast", "192.88.100.0", ""},
		{"192.168.0.0/16", "192.168.0.1", "private", "192.169.0.0", ""},
		{"198.18.0.0/15", "198.19.255.255", "benchmarking", "198.20.0.0", ""},
		{"198.18.0.0/15 (before)", "198.18.0.0", "benchmarking", "198.17.255.255", ""},
		{"198.51.100.0/24", "198.51.100.1", "documentation", "198.51.101.0", ""},
		{"203.0.113.0/24", "203.0.113.1", "documentation", "203.0.114.0", ""},
		{"224.0.0.0/4", "224.0.0.1", "multicast", "223.255.255.255", ""},
		{"240.0.0.0/4", "240.0.0.1", "reserved", "239.255.255.255", "multicast"},
		{"255.255.255.255", "255.255.255.255", "broadcast", "255.255.255.254", "reserved"},
		{"::/96", "::a00:1", "IPv4-compatible IPv6", "::1:0:0", "reserved IPv6"},
		{"::1", "::1", "loopback", "::2", "IPv4-compatible IPv6"},
		{"::ffff:0:0/96", "::ffff:8.8.8.8", "IPv4-mapped IPv6", "::1:0:0:0", "reserved IPv6"},
		{"::ffff:0:0:0/96", "::ffff:0:7f00:1", "IPv4-translated IPv6", "::ffff:1:0:0", "reserved IPv6"},
		{"64:ff9b::/96", "64:ff9b::a00:1", "NAT64", "64:ff9b::1:0:0", "reserved IPv6"},
		{"64:ff9b:1::/48", "64:ff9b:1::1", "NAT64", "64:ff9b:2::", "reserved IPv6"},
		{"100::/64", "100::1", "discard", "100:0:0:1::", "dummy prefix"},
		{"100:0:0:1::/64", "100:0:0:1::1", "dummy prefix", "100:0:0:2::", "reserved IPv6"},
		{"2001::/23", "2001::1", "IETF protocol assignment", "2001:200::", ""},
		{"2001::/23 (before)", "2001:1ff::1", "IETF protocol assignment", "2000:ffff:ffff:ffff:ffff:ffff:ffff:ffff", ""},
		{"2001:db8::/32", "2001:db8::1", "documentation", "2001:db9::", ""},
		{"2002::/16", "2002::1", "6to4", "2003::", ""},
		{"2002::/16 (before)", "2002:ffff::1", "6to4", "2001:ffff:ffff:ffff:ffff:ffff:ffff:ffff", ""},
		{"3fff::/20", "3fff::1", "documentation", "3fff:1000::", ""},
		{"2000::/3 (after)", "3fff:ffff::1", "", "4000::", "reserved IPv6"},
		{"5f00::/16", "5f00::1", "SRv6 SID", "5f01::", "reserved IPv6"},
		{"fc00::/7", "fc00::1", "unique-local", "fe00::", "reserved IPv6"},
		{"fd00:ec2::254", "fd00:ec2::254", "cloud metadata", "fd00:ec2::255", "unique-local"},
		{"fe80::/10", "fe80::1", "link-local", "fec0::", "site-local"},
		{"fec0::/10", "fec0::1", "site-local", "ff00::", "multicast"},
		{"ff00::/8", "ff02::1", "multicast", "feff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "site-local"},
	} {
		t.Run(tt.prefix, func(t *testing.T) {
			if got := Blocked(netip.MustParseAddr(tt.inside)); got != tt.insideWant {
				t.Errorf("Blocked(%s) = %q, want %q", tt.inside, got, tt.insideWant)
			}
			if got := Blocked(netip.MustParseAddr(tt.outside)); got != tt.outsideWant {
				t.Errorf("Blocked(%s) = %q, want %q", tt.outside, got, tt.outsideWant)
			}
		})
	}
	if got := Blocked(netip.Addr{}); got != "invalid" {
		t.Errorf("Blocked(zero Addr) = %q, want invalid", got)
	}
}

// listen returns a loopback listener.
func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// lookupTo is the resolver seam: every name resolves to ip.
func lookupTo(ip string) Lookup {
	return func(context.Context, string, string) ([]netip.Addr, error) {
		return []netip.Addr{netip.MustParseAddr(ip)}, nil
	}
}

func TestDialer_refusesAfterResolution(t *testing.T) {
	ln := listen(t)
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	d := &Dialer{Lookup: lookupTo("127.0.0.1")}
	_, err := d.DialContext(t.Context(), "tcp", net.JoinHostPort("peer.example", port))
	var refused *RefusedError
	if !errors.As(err, &refused) || !errors.Is(err, ErrRefused) {
		t.Fatalf("DialContext(peer.example -> 127.0.0.1) error = %v, want a RefusedError", err)
	}
	if refused.Addr != "127.0.0.1" || refused.Reason != "loopback" {
		t.Errorf("RefusedError = %+v, want Addr 127.0.0.1, Reason loopback", refused)
	}
	if msg := refused.Error(); strings.Contains(msg, "127.0.0.1") || msg != "refused: internal address" {
		t.Errorf("RefusedError.Error() = %q, want %q with no address", msg, "refused: internal address")
	}

	// The same name and listener with the prefix allowed connects: the
	// refusal above was the guard, not the network.
	d.Allow = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
	c, err := d.DialContext(t.Context(), "tcp", net.JoinHostPort("peer.example", port))
	if err != nil {
		t.Fatalf("DialContext(allowed) error = %v", err)
	}
	c.Close()
}

func TestDialer_checksLiteralsAndAllowAll(t *testing.T) {
	ln := listen(t)
	if _, err := (&Dialer{}).DialContext(t.Context(), "tcp", ln.Addr().String()); !errors.Is(err, ErrRefused) {
		t.Errorf("DialContext(%s) error = %v, want ErrRefused", ln.Addr(), err)
	}
	c, err := (&Dialer{Allow: AllowAll}).DialContext(t.Context(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("DialContext(%s) with AllowAll error = %v", ln.Addr(), err)
	}
	c.Close()
}

// The zero Dialer is documented to bound a connect at 2 s; a set Timeout
// is used as given.
func TestDialer_connectTimeout(t *testing.T) {
	for _, tt := range []struct {
		timeout, want time.Duration
	}{
		{0, 2 * time.Second},
		{-time.Second, 2 * time.Second},
		{time.Nanosecond, time.Nanosecond},
		{5 * time.Second, 5 * time.Second},
	} {
		d := &Dialer{Timeout: tt.timeout}
		if got := d.connectTimeout(); got != tt.want {
			t.Errorf("Dialer{Timeout: %v}.connectTimeout() = %v, want %v", tt.timeout, got, tt.want)
		}
	}
}
