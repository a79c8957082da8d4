// Package grpcclient dials Parley peers: other services reached through
// their gRPC APIs, with addresses given by flags (dns:///registry:9090).
package grpcclient

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

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
	// ReadyTimeout, when positive, makes a unary call that finds no ready
	// connection (a peer restarting, or the connection in reconnect
	// backoff) wait up to this long for one, or until the call's own
	// deadline when sooner, instead of failing at once. Still none, the
	// call fails UNAVAILABLE. Once a connection is ready the call runs
	// under its own deadline only, so a long poll is not cut short. Zero
	// fails at once, as a CLI wants; a service's calls to its peers take
	// --peer-ready-timeout.
	ReadyTimeout time.Duration
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
	dial := append(FlowControl(),
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(opts.MaxMessageBytes)))
	if opts.Token != "" {
		dial = append(dial, grpc.WithPerRPCCredentials(auth.Bearer(opts.Token)))
	}
	if opts.ReadyTimeout > 0 {
		dial = append(dial, grpc.WithChainUnaryInterceptor(waitForReady(opts.ReadyTimeout)))
	}
	return grpc.NewClient(target, dial...)
}

// The flow-control windows of Parley's gRPC connections, fixed, on both
// sides (platform/serve's server too): what a stream, and a connection's
// streams together, may be sent before the receiver acknowledges. The SDK
// keeps a copy (sdk.DialOptions: it imports no platform package), which
// e2e/flowcontrol_test.go checks against these.
const (
	StreamWindow = 1 << 20
	ConnWindow   = 4 << 20
)

// FlowControl are the dial options that fix a connection's flow-control
// windows. With gRPC's default dynamic windows the client sends a PING
// after each DATA frame it receives while none is out, to estimate the
// bandwidth-delay product: a PING and its acknowledgement per response or
// streamed message, which cost both sides system calls and thread switches
// (e2e/flowcontrol_test.go).
func FlowControl() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithStaticStreamWindowSize(StreamWindow),
		grpc.WithStaticConnWindowSize(ConnWindow),
	}
}

// waitForReady makes each unary call wait up to timeout for a ready
// connection before it is sent.
func waitForReady(timeout time.Duration) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoke grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if err := awaitReady(ctx, cc, timeout); err != nil {
			return err
		}
		return invoke(ctx, method, req, reply, cc, opts...)
	}
}

// awaitReady returns once cc is ready. It fails UNAVAILABLE when timeout
// passes first (the peer is down, which is not the caller's deadline), or
// with ctx's error when the caller gives up.
func awaitReady(ctx context.Context, cc *grpc.ClientConn, timeout time.Duration) error {
	s := cc.GetState()
	if s == connectivity.Ready {
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cc.Connect() // an idle connection starts connecting
	for ; s != connectivity.Ready; s = cc.GetState() {
		if s == connectivity.Shutdown {
			return status.Error(codes.Canceled, "the connection to the peer is closed")
		}
		if !cc.WaitForStateChange(wctx, s) {
			if err := ctx.Err(); err != nil {
				return status.FromContextError(err).Err()
			}
			return status.Errorf(codes.Unavailable, "no connection to the peer became ready within %s (%s)",
				timeout, strings.ReplaceAll(strings.ToLower(cc.GetState().String()), "_", " "))
		}
	}
	return nil
}
