package serve

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
)

// Registrar is a service assembled by its app package: it mounts itself on
// a Server.
type Registrar interface {
	Register(ctx context.Context, s *Server) error
}

// RunUntilSignal is the body of a one-service binary: it builds a Server
// from f, registers apps on it, listens on f's addresses and serves until
// SIGINT or SIGTERM, then shuts down gracefully. The caller closes its apps
// after it returns.
func RunUntilSignal(f Flags, logger *slog.Logger, apps ...Registrar) error {
	if err := f.checkSharedToken(); err != nil {
		return err
	}
	srv, err := New(f.Options(logger))
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	for _, a := range apps {
		if err := a.Register(ctx, srv); err != nil {
			return err
		}
	}
	return ListenAndRun(ctx, srv, f)
}
