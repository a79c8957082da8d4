// Package app assembles the negotiator: its gRPC server, gateway routes,
// health and readiness. Both the one-service binary and `parley serve` use it.
package app

import (
	"context"
	"log/slog"

	"google.golang.org/grpc"

	negotiatorv1 "github.com/parleyhq/parley/gen/parley/negotiator/v1"
	"github.com/parleyhq/parley/platform/serve"
	"github.com/parleyhq/parley/services/negotiator/config"
	"github.com/parleyhq/parley/services/negotiator/internal/server"
)

// ServiceName is the negotiator's gRPC service name, also its health name.
const ServiceName = "parley.negotiator.v1.NegotiatorService"

// Peers are the services the negotiator calls, as gRPC connections.
type Peers struct {
	Registry   grpc.ClientConnInterface
	Dispatcher grpc.ClientConnInterface
}

// App is an assembled negotiator.
type App struct {
	cfg    config.Config
	logger *slog.Logger
	server *server.Server
	peers  Peers
}

// New builds the server. It does not listen.
func New(cfg config.Config, logger *slog.Logger, peers Peers) (*App, error) {
	return &App{cfg: cfg, logger: logger, server: server.New(logger), peers: peers}, nil
}

// Register mounts the negotiator on s: gRPC service, gateway handlers, health
// name and readiness check.
func (a *App) Register(ctx context.Context, s *serve.Server) error {
	negotiatorv1.RegisterNegotiatorServiceServer(s.GRPC, a.server)
	if err := negotiatorv1.RegisterNegotiatorServiceHandlerServer(ctx, s.Gateway, a.server); err != nil {
		return err
	}
	s.HealthService(ServiceName)
	s.AddReadinessCheck("registry", serve.PeerCheck(a.peers.Registry, "parley.registry.v1.RegistryService"))
	s.AddReadinessCheck("dispatcher", serve.PeerCheck(a.peers.Dispatcher, "parley.dispatcher.v1.DispatcherService"))
	return nil
}

// Close releases the negotiator's resources. It is stateless today.
func (a *App) Close() error { return nil }

// RegisterGateway mounts the negotiator's REST routes on s for a gateway process
// that reaches the negotiator over conn instead of in-process.
func RegisterGateway(ctx context.Context, s *serve.Server, conn *grpc.ClientConn) error {
	return negotiatorv1.RegisterNegotiatorServiceHandler(ctx, s.Gateway, conn)
}
