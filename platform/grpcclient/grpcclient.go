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
)

// Options configures a peer connection.
type Options struct {
	// CAFile, when set, makes the connection TLS and trusts this PEM bundle.
	CAFile string
	// MaxMessageBytes caps received messages; 16 MiB when zero.
	MaxMessageBytes int
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
	return grpc.NewClient(target,
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(opts.MaxMessageBytes)))
}
