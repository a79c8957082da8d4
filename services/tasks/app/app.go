// Package app assembles the tasks: its store, gRPC server, gateway routes,
// health and readiness. Both the one-service binary and `parley serve` use it.
package app

import (
	"context"
	"log/slog"
	"time"

	"google.golang.org/grpc"

	tasksv1 "github.com/parleyhq/parley/gen/parley/tasks/v1"
	"github.com/parleyhq/parley/platform/serve"
	"github.com/parleyhq/parley/services/tasks/config"
	"github.com/parleyhq/parley/services/tasks/internal/server"
	"github.com/parleyhq/parley/services/tasks/internal/store"
	"github.com/parleyhq/parley/services/tasks/internal/store/boltstore"
)

// ServiceName is the tasks's gRPC service name, also its health name.
const ServiceName = "parley.tasks.v1.TasksService"

// Peers are the services the tasks calls, as gRPC connections.
type Peers struct {
	Dispatcher grpc.ClientConnInterface
}

// App is an assembled tasks.
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

// Register mounts the tasks on s: gRPC service, gateway handlers, health
// name and readiness check.
func (a *App) Register(ctx context.Context, s *serve.Server) error {
	tasksv1.RegisterTasksServiceServer(s.GRPC, a.server)
	if err := tasksv1.RegisterTasksServiceHandlerServer(ctx, s.Gateway, a.server); err != nil {
		return err
	}
	s.HealthService(ServiceName)
	s.AddReadinessCheck("tasks-store", a.store.Ping)
	s.AddReadinessCheck("dispatcher", serve.PeerCheck(a.peers.Dispatcher, "parley.dispatcher.v1.DispatcherService"))
	return nil
}

// Close closes the store.
func (a *App) Close() error { return a.store.Close() }

// RegisterGateway mounts the tasks's REST routes on s for a gateway process
// that reaches the tasks over conn instead of in-process.
func RegisterGateway(ctx context.Context, s *serve.Server, conn *grpc.ClientConn) error {
	return tasksv1.RegisterTasksServiceHandler(ctx, s.Gateway, conn)
}
