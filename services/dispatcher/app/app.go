// Package app assembles the dispatcher: its store, gRPC server, gateway routes,
// health and readiness. Both the one-service binary and `parley serve` use it.
package app

import (
	"context"
	"log/slog"
	"time"

	"google.golang.org/grpc"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/platform/serve"
	"github.com/parleyhq/parley/services/dispatcher/config"
	"github.com/parleyhq/parley/services/dispatcher/internal/server"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
	"github.com/parleyhq/parley/services/dispatcher/internal/store/boltstore"
)

// ServiceName is the dispatcher's gRPC service name, also its health name.
const ServiceName = "parley.dispatcher.v1.DispatcherService"

// Peers are the services the dispatcher calls, as gRPC connections.
type Peers struct {
	Registry   grpc.ClientConnInterface
	Negotiator grpc.ClientConnInterface
}

// App is an assembled dispatcher.
type App struct {
	cfg    config.Config
	logger *slog.Logger
	store  store.Store
	server *server.Server
	peers  Peers
}

// New opens the store and builds the server. It does not listen.
func New(cfg config.Config, logger *slog.Logger, peers Peers) (*App, error) {
	st, err := boltstore.Open(cfg.DataDir, 2*time.Second)
	if err != nil {
		return nil, err
	}
	return &App{cfg: cfg, logger: logger, store: st, server: server.New(st, logger), peers: peers}, nil
}

// Register mounts the dispatcher on s: gRPC service, gateway handlers, health
// name and readiness check.
func (a *App) Register(ctx context.Context, s *serve.Server) error {
	dispatcherv1.RegisterDispatcherServiceServer(s.GRPC, a.server)
	if err := dispatcherv1.RegisterDispatcherServiceHandlerServer(ctx, s.Gateway, a.server); err != nil {
		return err
	}
	s.HealthService(ServiceName)
	s.AddReadinessCheck("dispatcher-store", a.store.Ping)
	s.AddReadinessCheck("registry", serve.PeerCheck(a.peers.Registry, "parley.registry.v1.RegistryService"))
	s.AddReadinessCheck("negotiator", serve.PeerCheck(a.peers.Negotiator, "parley.negotiator.v1.NegotiatorService"))
	return nil
}

// Close closes the store.
func (a *App) Close() error { return a.store.Close() }

// RegisterGateway mounts the dispatcher's REST routes on s for a gateway process
// that reaches the dispatcher over conn instead of in-process.
func RegisterGateway(ctx context.Context, s *serve.Server, conn *grpc.ClientConn) error {
	return dispatcherv1.RegisterDispatcherServiceHandler(ctx, s.Gateway, conn)
}
