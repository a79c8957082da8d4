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
	// CertFile and KeyFile, with CAFile, are the client certificate
	// presented to peers that require one (mTLS).
	CertFile, KeyFile string
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
	if (opts.CertFile != "" || opts.KeyFile != "") && opts.CAFile == "" {
		return nil, errors.New("a client certificate is presented over TLS only: give the CA bundle that verifies the server too")
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
		conf := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
		if opts.CertFile != "" || opts.KeyFile != "" {
			cert, err := tls.LoadX509KeyPair(opts.CertFile, opts.KeyFile)
			if err != nil {
				return nil, fmt.Errorf("load client certificate: %w", err)
			}
			conf.Certificates = []tls.Certificate{cert}
		}
		creds = credentials.NewTLS(conf)
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
