// Package app assembles the tasks: its store, artifact files, gRPC server,
// the hand-written Agent Protocol routes, health and readiness. Both the
// one-service binary and `parley serve` use it.
package app

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	tasksv1 "github.com/parleyhq/parley/gen/parley/tasks/v1"
	"github.com/parleyhq/parley/platform/auth"
	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/platform/pgdb"
	"github.com/parleyhq/parley/platform/serve"
	"github.com/parleyhq/parley/services/tasks/config"
	"github.com/parleyhq/parley/services/tasks/internal/artifactfs"
	"github.com/parleyhq/parley/services/tasks/internal/rest"
	"github.com/parleyhq/parley/services/tasks/internal/server"
	"github.com/parleyhq/parley/services/tasks/internal/store"
	"github.com/parleyhq/parley/services/tasks/internal/store/boltstore"
	"github.com/parleyhq/parley/services/tasks/internal/store/pgstore"
)

// ServiceName is the tasks's gRPC service name, also its health name.
const ServiceName = "parley.tasks.v1.TasksService"

// Peers are the services the tasks calls, as gRPC connections.
type Peers struct {
	Dispatcher grpc.ClientConnInterface
	// Registry, optional, is asked for each agent's Agent Protocol access
	// setting (public or token); without it every agent is public.
	Registry grpc.ClientConnInterface
}

// App is an assembled tasks.
type App struct {
	cfg    config.Config
	logger *slog.Logger
	store  store.Store
	server *server.Server
	peers  Peers

	// Background loops (the orphan scan on PostgreSQL) run from Register
	// until Register's context ends, shutdown starts, or Close; stop ends
	// them, and Close also waits for them.
	stop    context.CancelFunc
	stopped context.Context
	loops   sync.WaitGroup
}

// openStore opens the metadata store and the artifact bytes: PostgreSQL
// for both when cfg.DatabaseURL is set, else tasks.db and artifact files
// in the data directory.
func openStore(cfg config.Config, logger *slog.Logger) (store.Store, store.Blobs, error) {
	if cfg.DatabaseURL != "" {
		ctx, cancel := context.WithTimeout(context.Background(), pgdb.OpenTimeout)
		defer cancel()
		st, err := pgstore.Open(ctx, cfg.DatabaseURL, pgstore.Schema, logger)
		if err != nil {
			return nil, nil, err
		}
		return st, st.Blobs(), nil
	}
	st, err := boltstore.Open(cfg.DataDir, 2*time.Second)
	if err != nil {
		return nil, nil, err
	}
	files, err := artifactfs.New(cfg.DataDir)
	if err != nil {
		st.Close()
		return nil, nil, err
	}
	return st, files, nil
}

// New opens the store and builds the server. It does not listen.
func New(cfg config.Config, logger *slog.Logger, peers Peers) (*App, error) {
	st, files, err := openStore(cfg, logger)
	if err != nil {
		return nil, err
	}
	srv := server.New(st, files, dispatcherv1.NewDispatcherServiceClient(peers.Dispatcher), logger, serverOptions(cfg))
	a := &App{cfg: cfg, logger: logger, store: st, server: srv, peers: peers}
	a.stopped, a.stop = context.WithCancel(context.Background())
	return a, nil
}

// Register mounts the tasks on s: gRPC service, gateway handlers, the Agent
// Protocol routes, health name and readiness check. It also resumes steps
// left pending by the last run. The background loops it starts (on
// PostgreSQL, the scan for the steps of replicas that died) run until ctx
// ends, s starts shutting down, or Close.
func (a *App) Register(ctx context.Context, s *serve.Server) error {
	// gRPC and v1 REST callers see only their own tasks; the Agent
	// Protocol routes below use the server itself (rest.Options.TokenRequired).
	tasksv1.RegisterTasksServiceServer(s, a.server.Owned())
	if err := tasksv1.RegisterTasksServiceHandlerServer(ctx, s.Gateway, a.server.Owned()); err != nil {
		return err
	}
	opts := restOptions(a.cfg)
	opts.Stopping = s.Stopping()
	if a.peers.Registry != nil {
		reg := registryv1.NewRegistryServiceClient(a.peers.Registry)
		opts.TokenRequired = tokenRequired(reg)
		// Run alone, the tasks service checks client and agent keys at
		// the registry; in `parley serve` the registry's own check wins.
		s.FallbackKeyVerifier(auth.Introspector(func(ctx context.Context, secret string) (proto.Message, error) {
			return reg.IntrospectKey(ctx, &registryv1.IntrospectKeyRequest{Secret: secret})
		}, auth.IntrospectionTTL, nil))
	}
	rest.New(a.server, opts).Register(s.Handle)
	registerErrorShapes(s)
	for _, c := range a.server.Collectors() {
		if err := s.Registry().Register(c); err != nil {
			return err
		}
	}
	s.HealthService(ServiceName)
	s.AddReadinessCheck("tasks-store", a.store.Ping)
	if db := pgdb.Of(a.store); db != nil {
		s.ShareAuthLimits(db) // failed authentications count on every replica
	}
	s.AddReadinessCheck("dispatcher", serve.PeerCheck(a.peers.Dispatcher, "parley.dispatcher.v1.DispatcherService"))
	if err := a.server.Start(ctx, s.Stopping()); err != nil {
		return err
	}
	// A draining replica claims no more steps: the scan ends when
	// shutdown starts, not only at Close, and a live replica takes over.
	a.loops.Go(func() {
		select {
		case <-ctx.Done():
		case <-s.Stopping():
		case <-a.stopped.Done():
		}
		a.stop()
	})
	if pg, ok := a.store.(*pgstore.Store); ok {
		a.loops.Go(func() {
			pgdb.Tick(a.stopped, orphanScan, func(ctx context.Context) { a.takeOver(ctx, pg) })
		})
	}
	return nil
}

// orphanScan is how often a replica on PostgreSQL claims the pending steps
// of replicas that died: the bound on their takeover, after PostgreSQL
// ends the dead replica's session.
const orphanScan = 10 * time.Second

// takeOver resumes the pending steps of replicas that died. Every replica
// does it: the claim is one UPDATE, so each step goes to one of them.
func (a *App) takeOver(ctx context.Context, pg *pgstore.Store) {
	refs, err := pg.ClaimOrphans(ctx)
	if err != nil {
		if ctx.Err() == nil {
			a.logger.WarnContext(ctx, "claiming the steps of stopped replicas failed; retrying", slog.Any("err", err))
		}
		return
	}
	a.server.Resume(ctx, refs)
}

// tokenRequired reads an agent's Agent Protocol access from the registry
// on every call, so that a change applies at once. An agent the registry
// does not know is public: the routes then answer as they would anyway.
func tokenRequired(reg registryv1.RegistryServiceClient) func(context.Context, string) (bool, error) {
	return func(ctx context.Context, agent string) (bool, error) {
		a, err := reg.GetAgent(ctx, &registryv1.GetAgentRequest{Name: agent})
		switch status.Code(err) {
		case codes.OK:
			return a.GetAgentProtocolAccess() == registryv1.AgentProtocolAccess_AGENT_PROTOCOL_ACCESS_TOKEN, nil
		case codes.NotFound:
			return false, nil
		case codes.Canceled, codes.DeadlineExceeded:
			return false, err
		}
		return false, grpcerr.New(codes.Unavailable, "the agent's access setting cannot be read from the registry right now; retry shortly", "REGISTRY_UNAVAILABLE", server.Domain, nil)
	}
}

func restOptions(cfg config.Config) rest.Options {
	return rest.Options{DefaultAgent: cfg.AgentName(), MaxPageSize: cfg.MaxPageSize, MaxUploadBytes: cfg.MaxUploadBytes}
}

// Close stops the background loops and step execution and waits for
// them, then closes the store.
func (a *App) Close() error {
	a.stop()
	a.loops.Wait()
	a.server.Close()
	return a.store.Close()
}

// RegisterGateway mounts the tasks's REST routes on s for a gateway process
// that reaches the tasks over conn instead of in-process. cfg holds the
// flags of config.RegisterGatewayFlags, which the gateway registers on its
// own flag set (--ap-agent and the Agent Protocol limits).
func RegisterGateway(ctx context.Context, s *serve.Server, peers GatewayPeers, cfg config.Config) error {
	if err := cfg.ValidateGateway(); err != nil {
		return err
	}
	opts := restOptions(cfg)
	opts.Stopping = s.Stopping()
	if peers.Registry != nil {
		opts.TokenRequired = tokenRequired(registryv1.NewRegistryServiceClient(peers.Registry))
	}
	service := peers.Service
	if service == nil {
		service = peers.Tasks
	}
	rest.New(rest.NewClientBackend(tasksv1.NewTasksServiceClient(service)), opts).Register(s.Handle)
	registerErrorShapes(s)
	return tasksv1.RegisterTasksServiceHandler(ctx, s.Gateway, peers.Tasks)
}

// GatewayPeers are the connections a gateway process mounts the tasks
// service's routes with.
type GatewayPeers struct {
	// Tasks carries the REST routes' calls with each caller's own
	// credential, which the tasks service checks.
	Tasks *grpc.ClientConn
	// Service, when set, carries the Agent Protocol routes' calls as the
	// gateway itself (the operator token with access control on): those
	// routes are public or checked by the gateway per agent, like
	// `parley serve`'s. Tasks when nil.
	Service grpc.ClientConnInterface
	// Registry, when set, tells each agent's Agent Protocol access
	// (public or token), asked as the gateway itself; without it every
	// agent is public.
	Registry grpc.ClientConnInterface
}

// registerErrorShapes makes unknown paths and wrong methods under the
// Agent Protocol routes answer in the spec's {"message"} shape.
func registerErrorShapes(s *serve.Server) {
	s.HandleErrors("/ap/", rest.WriteRouteError)
	s.HandleErrors("/agents/", rest.WriteRouteError)
}

// serverOptions are the server's options, copied from cfg.
func serverOptions(cfg config.Config) server.Options {
	return server.Options{
		StepWait:        cfg.StepWait,
		StepTimeout:     cfg.StepTimeout,
		RetryMax:        cfg.RetryMax,
		MaxPageSize:     cfg.MaxPageSize,
		MaxUploadBytes:  cfg.MaxUploadBytes,
		MaxWatchers:     cfg.MaxWatchers,
		MaxInFlight:     cfg.MaxInFlight,
		MaxWaitingSteps: cfg.MaxWaitingSteps,
		MaxStepAttempts: cfg.MaxStepAttempts,
	}
}
