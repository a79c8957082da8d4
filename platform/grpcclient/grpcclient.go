// Package grpcclient dials Parley peers: other services reached through
// their gRPC APIs, with addresses given by flags (dns:///registry:9090).
package grpcclient

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/parleyhq/parley/platform/auth"
)

// Options configures a peer connection.
type Options struct {
	// CAFile, when set, makes the connection TLS and trusts this PEM bundle.
	CAFile string
	// MaxMessageBytes caps received messages; 16 MiB when zero.
	MaxMessageBytes int
	// Token, when set, is sent as `authorization: Bearer <token>` on every
	// call: a key, or the operator token between services.
	Token string
}

// Dial returns a lazily connecting client for target. It does no I/O.
func Dial(target string, opts Options) (*grpc.ClientConn, error) {
	if target == "" {
		return nil, errors.New("empty peer address")
	}
	if opts.MaxMessageBytes <= 0 {
		opts.MaxMessageBytes = 16 << 20
	}
	creds := insecure.NewCredentials()
	if opts.CAFile != "" {
		pem, err := os.ReadFile(opts.CAFile)
		if err != nil {
			return nil, fmt.Errorf("read CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("CA file %s holds no PEM certificate", opts.CAFile)
		}
		creds = credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})
	}
	dial := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(opts.MaxMessageBytes)),
	}
	if opts.Token != "" {
		dial = append(dial, grpc.WithPerRPCCredentials(auth.Bearer(opts.Token)))
	}
	return grpc.NewClient(target, dial...)
}
