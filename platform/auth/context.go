package auth

import (
	"context"
	"errors"
	"net"

	"google.golang.org/grpc/peer"
)

// ErrInvalidCredential is a credential that is malformed, unknown or
// revoked. Errors wrapping it never hold the credential.
var ErrInvalidCredential = errors.New("the credential is not valid")

type remoteKey struct{}

// WithRemoteAddr returns ctx carrying the caller's address (host only), as
// the HTTP middleware sees it.
func WithRemoteAddr(ctx context.Context, addr string) context.Context {
	return context.WithValue(ctx, remoteKey{}, addr)
}

// RemoteAddr is the caller's host, for per-address rate limits: the one
// recorded by the HTTP middleware, else the gRPC peer's, else "unknown".
func RemoteAddr(ctx context.Context) string {
	if a, ok := ctx.Value(remoteKey{}).(string); ok && a != "" {
		return a
	}
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		return hostOf(p.Addr.String())
	}
	return "unknown"
}

func hostOf(addr string) string {
	if h, _, err := net.SplitHostPort(addr); err == nil {
		return h
	}
	return addr
}
