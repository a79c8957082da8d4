// Package egress guards outbound connections to destinations a caller
// named (protocol sources, Agora targets) against server-side request
// forgery.
//
// Dialer checks every TCP connection in its Control function, after DNS
// resolution and before connect(2), so DNS rebinding gets nothing: only
// global unicast addresses pass (IPv6 only inside 2000::/3); loopback,
// private, link-local (cloud metadata included), multicast, unspecified,
// this-network, CGNAT, benchmarking, reserved, unique-local, site-local,
// IPv4-mapped, -compatible and -translated, NAT64, 6to4 and the other
// special-purpose ranges are refused. Blocked is that one rule.
//
// Errors never carry the resolved address or the resolver: RefusedError
// says only "refused: internal address" and keeps the address and reason
// for the log.
package egress

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"syscall"
	"time"
)

// ErrRefused is wrapped by every refusal of a destination address.
var ErrRefused = errors.New("refused: internal address")

// RefusedError is the dialer's refusal of an address; it wraps ErrRefused.
// Addr and Reason are for the log: Error does not reveal them, since the
// address is what our DNS made of the caller's host name.
type RefusedError struct {
	Addr   string
	Reason string
}

// Error says only that the destination was refused.
func (e *RefusedError) Error() string { return ErrRefused.Error() }

// Unwrap makes errors.Is(err, ErrRefused) hold.
func (e *RefusedError) Unwrap() error { return ErrRefused }

// Lookup resolves a host name to addresses, as net.Resolver.LookupNetIP.
type Lookup func(ctx context.Context, network, host string) ([]netip.Addr, error)

// Dialer dials TCP connections, refusing every address Blocked names
// unless Allow contains it. The zero value guards with a 2 s connect
// timeout and the system resolver.
type Dialer struct {
	// Timeout bounds one connect; 2 s when zero.
	Timeout time.Duration
	// Allow lists trusted prefixes that pass despite Blocked (a local
	// demo, a test server). AllowAll lets everything through.
	Allow []netip.Prefix
	// Lookup, when set, resolves host names instead of the system
	// resolver: a test seam that maps names to chosen addresses. The
	// address check is the same either way.
	Lookup Lookup
}

// AllowAll is an Allow list that lets every address through: the guard
// off, for tests and private deployments.
var AllowAll = []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}

// DialContext connects to address (host:port) on network, refusing
// internal destinations with a *RefusedError.
func (d *Dialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	nd := &net.Dialer{Timeout: d.connectTimeout(), ControlContext: d.control}
	if d.Lookup == nil {
		return nd.DialContext(ctx, network, address)
	}
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return nil, err
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return nd.DialContext(ctx, network, address)
	}
	ips, err := d.Lookup(ctx, "ip", host)
	if err != nil {
		return nil, err
	}
	err = &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	for _, ip := range ips {
		var c net.Conn
		c, err = nd.DialContext(ctx, network, net.JoinHostPort(ip.String(), port))
		if err == nil {
			return c, nil
		}
	}
	return nil, err
}

// defaultTimeout bounds one connect when Dialer.Timeout is not set.
const defaultTimeout = 2 * time.Second

// connectTimeout is Timeout, or defaultTimeout when it is not positive.
func (d *Dialer) connectTimeout() time.Duration {
	if d.Timeout <= 0 {
		return defaultTimeout
	}
	return d.Timeout
}

// control runs for every connection after DNS resolution, before connect.
func (d *Dialer) control(_ context.Context, _, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return &RefusedError{Addr: address, Reason: "unparseable address"}
	}
	ip := ap.Addr().WithZone("")
	for _, p := range d.Allow {
		if p.Contains(ip) {
			return nil
		}
	}
	if reason := Blocked(ip); reason != "" {
		return &RefusedError{Addr: ip.String(), Reason: reason}
	}
	return nil
}

var specialPrefixes = []struct {
	p      netip.Prefix
	reason string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "this-network"},
	{netip.MustParsePrefix("100.64.0.0/10"), "CGNAT"},
	{netip.MustParsePrefix("192.0.0.0/24"), "IETF protocol assignment"},
	{netip.MustParsePrefix("192.0.2.0/24"), "documentation"},
	{netip.MustParsePrefix("198.18.0.0/15"), "benchmarking"},
	{netip.MustParsePrefix("198.51.100.0/24"), "documentation"},
	{netip.MustParsePrefix("203.0.113.0/24"), "documentation"},
	{netip.MustParsePrefix("192.88.99.0/24"), "6to4 relay anycast"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved"},
	{netip.MustParsePrefix("::/96"), "IPv4-compatible IPv6"},
	{netip.MustParsePrefix("::ffff:0:0:0/96"), "IPv4-translated IPv6"},
	{netip.MustParsePrefix("100:0:0:1::/64"), "dummy prefix"},
	{netip.MustParsePrefix("3fff::/20"), "documentation"},
	{netip.MustParsePrefix("5f00::/16"), "SRv6 SID"},
	{netip.MustParsePrefix("fec0::/10"), "site-local"},
	{netip.MustParsePrefix("64:ff9b::/96"), "NAT64"},
	{netip.MustParsePrefix("64:ff9b:1::/48"), "NAT64"},
	{netip.MustParsePrefix("100::/64"), "discard"},
	{netip.MustParsePrefix("2001::/23"), "IETF protocol assignment"},
	{netip.MustParsePrefix("2001:db8::/32"), "documentation"},
	{netip.MustParsePrefix("2002::/16"), "6to4"},
}

var (
	metadataV4     = netip.MustParseAddr("169.254.169.254")
	metadataV6     = netip.MustParseAddr("fd00:ec2::254")
	globalUnicast6 = netip.MustParsePrefix("2000::/3")
)

// Blocked returns why ip is not a public destination, or "" when it is.
func Blocked(ip netip.Addr) string {
	switch {
	case !ip.IsValid():
		return "invalid"
	case ip == metadataV4, ip == metadataV6:
		return "cloud metadata"
	case ip.Is4In6():
		return "IPv4-mapped IPv6"
	case ip.IsUnspecified():
		return "unspecified"
	case ip.IsLoopback():
		return "loopback"
	case ip.IsMulticast():
		return "multicast"
	case ip.IsLinkLocalUnicast():
		return "link-local"
	case ip.Is4() && ip.IsPrivate():
		return "private"
	case ip.IsPrivate():
		return "unique-local"
	case ip == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return "broadcast"
	}
	for _, s := range specialPrefixes {
		if s.p.Contains(ip) {
			return s.reason
		}
	}
	switch {
	case !ip.IsGlobalUnicast():
		return "not global unicast"
	case ip.Is6() && !globalUnicast6.Contains(ip):
		// Every global unicast IPv6 assignment is inside 2000::/3; the rest
		// of the space is reserved or special.
		return "reserved IPv6"
	}
	return ""
}
