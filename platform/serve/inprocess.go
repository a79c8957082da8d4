package serve

import (
	"context"
	"crypto/tls"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	"github.com/parleyhq/parley/platform/auth"
)

// InProcessConn returns a client connection to this server's own gRPC
// services over an in-memory pipe, for the all-in-one binary where services
// still talk to each other only through their gRPC APIs. The pipe is served
// by Run; calls made before Run wait for it.
func (s *Server) InProcessConn() (*grpc.ClientConn, error) {
	s.mu.Lock()
	if s.pipe == nil {
		s.pipe = bufconn.Listen(1 << 20)
		if s.running {
			go s.servePipe(s.pipe)
		}
	}
	lis := s.pipe
	s.mu.Unlock()
	creds := insecure.NewCredentials()
	if s.tlsConf != nil {
		// The server side insists on TLS once a certificate is configured.
		// The pipe never leaves the process, so there is nothing to verify.
		creds = credentials.NewTLS(&tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}) //nolint:gosec // in-memory pipe to ourselves
	}
	opts := []grpc.DialOption{
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(int(s.opts.MaxBodyBytes) * 4)),
	}
	if s.auth != nil {
		// Services in one process call each other as the operator: the
		// pipe cannot be reached from outside it.
		opts = append(opts, grpc.WithPerRPCCredentials(auth.Bearer(s.operatorToken)))
	}
	return grpc.NewClient("passthrough:///in-process", opts...)
}

func (s *Server) servePipe(lis *bufconn.Listener) { _ = s.GRPC.Serve(lis) }
