// Package app assembles the registry: its store, gRPC server, gateway routes,
// health and readiness. Both the one-service binary and `parley serve` use it.
package app

import (
	"context"
	"log/slog"
	"time"

	"google.golang.org/grpc"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/serve"
	"github.com/parleyhq/parley/services/registry/config"
	"github.com/parleyhq/parley/services/registry/internal/server"
	"github.com/parleyhq/parley/services/registry/internal/store"
	"github.com/parleyhq/parley/services/registry/internal/store/boltstore"
)

// ServiceName is the registry's gRPC service name, also its health name.
const ServiceName = "parley.registry.v1.RegistryService"

// App is an assembled registry.
type App struct {
	cfg    config.Config
	logger *slog.Logger
	store  store.Store
	server *server.Server
}

// New opens the store and builds the server. It does not listen.
func New(cfg config.Config, logger *slog.Logger) (*App, error) {
	st, err := boltstore.Open(cfg.DataDir, 2*time.Second)
	if err != nil {
		return nil, err
	}
	return &App{cfg: cfg, logger: logger, store: st, server: server.New(st, logger)}, nil
}

// Register mounts the registry on s: gRPC service, gateway handlers, health
// name and readiness check.
func (a *App) Register(ctx context.Context, s *serve.Server) error {
	registryv1.RegisterRegistryServiceServer(s.GRPC, a.server)
	if err := registryv1.RegisterRegistryServiceHandlerServer(ctx, s.Gateway, a.server); err != nil {
		return err
	}
	s.HealthService(ServiceName)
	s.AddReadinessCheck("registry-store", a.store.Ping)
	return nil
}

// Close closes the store.
func (a *App) Close() error { return a.store.Close() }

// RegisterGateway mounts the registry's REST routes on s for a gateway process
// that reaches the registry over conn instead of in-process.
func RegisterGateway(ctx context.Context, s *serve.Server, conn *grpc.ClientConn) error {
	return registryv1.RegisterRegistryServiceHandler(ctx, s.Gateway, conn)
}
