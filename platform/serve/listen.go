package serve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"

	"github.com/parleyhq/parley/platform/auth"
	"github.com/parleyhq/parley/platform/grpcclient"
)

// Listen opens the gRPC and HTTP listeners named by f. A port in use comes
// back as one clear error naming the flag's address.
func Listen(f Flags) (grpcLis, httpLis net.Listener, err error) {
	grpcLis, err = net.Listen("tcp", f.GRPCAddr)
	if err != nil {
		return nil, nil, fmt.Errorf("listen for gRPC on %s: %w", f.GRPCAddr, err)
	}
	httpLis, err = net.Listen("tcp", f.HTTPAddr)
	if err != nil {
		grpcLis.Close()
		return nil, nil, fmt.Errorf("listen for HTTP on %s: %w", f.HTTPAddr, err)
	}
	return grpcLis, httpLis, nil
}

// ListenAndRun listens on the addresses in f, logs the bound addresses as
// the JSON attributes "grpc":"<addr>" and "http":"<addr>" (so port 0 is usable), and runs
// s until ctx ends. Each of setup runs once s serves (it may call s over
// InProcessConn) and before the addresses are logged, so clients that wait
// for that line find its work done.
func ListenAndRun(ctx context.Context, s *Server, f Flags, setup ...func(context.Context)) error {
	grpcLis, httpLis, err := Listen(f)
	if err != nil {
		return err
	}
	scheme := "http"
	if s.tlsConf != nil {
		scheme = "https"
	}
	errc := make(chan error, 1)
	go func() { errc <- s.Run(ctx, grpcLis, httpLis) }()
	for _, fn := range setup {
		fn(ctx)
	}
	s.logger.InfoContext(ctx, "listening",
		slog.String("grpc", grpcLis.Addr().String()),
		slog.String("http", httpLis.Addr().String()),
		slog.String("url", scheme+"://"+httpLis.Addr().String()))
	return <-errc
}

// Options returns the serve.Options the flags describe.
func (f Flags) Options(logger *slog.Logger) Options {
	var policy auth.Policy
	if f.Auth {
		policy = auth.ParleyPolicy()
	}
	return Options{
		Policy:          policy,
		Logger:          logger,
		TLSCertFile:     f.TLSCert,
		TLSKeyFile:      f.TLSKey,
		TLSClientCAFile: f.TLSClientCA,
		ShutdownTimeout: f.ShutdownTimeout,
		Limits:          Limits{MaxConnections: f.MaxConnections},

		DataDir:           f.DataDir,
		OperatorTokenFile: f.OperatorTokenFile,
		MetricsPublic:     f.MetricsPublic,
	}
}

// PeerOptions is how a one-service binary or `parley gateway` dials its
// peers: a call waits up to --peer-ready-timeout for a connection; over
// TLS when --peer-ca or --tls-client-ca is set, presenting --tls-cert when
// --tls-client-ca is (the peers then require it), and with the operator
// token when --auth is on. Separate processes must
// share one token, so --auth there needs --operator-token-file.
func PeerOptions(f Flags) (grpcclient.Options, error) {
	if f.PeerReadyTimeout <= 0 {
		return grpcclient.Options{}, errors.New("--peer-ready-timeout must be positive")
	}
	o := grpcclient.Options{CAFile: f.PeerCA, ReadyTimeout: f.PeerReadyTimeout}
	if o.CAFile == "" {
		o.CAFile = f.TLSClientCA
	}
	if f.TLSClientCA != "" {
		o.CertFile, o.KeyFile = f.TLSCert, f.TLSKey
	}
	if !f.Auth {
		return o, nil
	}
	if err := f.checkSharedToken(); err != nil {
		return o, err
	}
	tok, _, _, err := auth.LoadOperatorToken(f.OperatorTokenFile, f.DataDir)
	o.Token = tok
	return o, err
}

// checkSharedToken refuses --auth without --operator-token-file in a
// one-service binary: each would write its own token to its data
// directory, and the services could not call each other.
func (f Flags) checkSharedToken() error {
	if f.Auth && f.OperatorTokenFile == "" {
		return errors.New("access control is on (--auth, the default), so a one-service binary needs --operator-token-file: the operator token every service of the deployment shares (or --auth=false)")
	}
	return nil
}
