package auth

import (
	"context"

	"google.golang.org/grpc/credentials"
)

// Bearer returns per-call credentials sending token as
// `authorization: Bearer <token>`, for clients of Parley services.
func Bearer(token string) credentials.PerRPCCredentials { return bearerCreds(token) }

type bearerCreds string

func (t bearerCreds) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(t)}, nil
}

// RequireTransportSecurity is false so that loopback and in-process
// connections work without TLS; over a network, configure TLS
// (--server-ca, peer CA flags) so that the credential is not sent in the
// clear.
func (bearerCreds) RequireTransportSecurity() bool { return false }
