// Package app assembles the registry: its store, document fetcher, peer
// registries, gRPC server, gateway and hand-written HTTP routes, health and
// readiness. Both the one-service binary and `parley serve` use it.
package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/grpcclient"
	"github.com/parleyhq/parley/platform/pgdb"
	"github.com/parleyhq/parley/platform/serve"
	"github.com/parleyhq/parley/platform/sweep"
	"github.com/parleyhq/parley/services/registry/config"
	"github.com/parleyhq/parley/services/registry/internal/fetch"
	"github.com/parleyhq/parley/services/registry/internal/httpapi"
	"github.com/parleyhq/parley/services/registry/internal/pd"
	"github.com/parleyhq/parley/services/registry/internal/resolve"
	"github.com/parleyhq/parley/services/registry/internal/server"
	"github.com/parleyhq/parley/services/registry/internal/store"
	"github.com/parleyhq/parley/services/registry/internal/store/boltstore"
	"github.com/parleyhq/parley/services/registry/internal/store/pgstore"
)

// ServiceName is the registry's gRPC service name, also its health name.
const ServiceName = "parley.registry.v1.RegistryService"

// Request ids (AIP-155) are kept a day; the sweep looks for older ones
// this often.
const (
	requestIDTTL      = 24 * time.Hour
	requestSweepEvery = time.Hour
)

// Peer is a peer registry (--registry-peers) as a gRPC connection the
// caller dialed and closes, as every service's app takes its peers.
type Peer struct {
	Addr string
	Conn grpc.ClientConnInterface
}

// Peers are the peer registries, in the configured order.
type Peers []Peer

// DialPeers dials (lazily) the peer registries cfg lists, over TLS when
// --registry-peer-ca is set; the caller closes them with Close.
func DialPeers(cfg config.Config) (Peers, error) {
	var peers Peers
	for _, addr := range cfg.PeerList() {
		conn, err := grpcclient.Dial(addr, grpcclient.Options{CAFile: cfg.PeerCA})
		if err != nil {
			_ = peers.Close()
			return nil, fmt.Errorf("--registry-peers %s: %w", addr, err)
		}
		peers = append(peers, Peer{Addr: addr, Conn: conn})
	}
	return peers, nil
}

// Close closes the connections DialPeers opened.
func (p Peers) Close() error {
	var errs []error
	for _, peer := range p {
		if c, ok := peer.Conn.(interface{ Close() error }); ok {
			errs = append(errs, c.Close())
		}
	}
	return errors.Join(errs...)
}

// App is an assembled registry.
type App struct {
	cfg    config.Config
	logger *slog.Logger
	store  store.Store
	server *server.Server
	peers  Peers

	// Background loops (request-id sweep, peer sync) run from Register
	// until Close cancels stop and waits for them.
	stop    context.CancelFunc
	stopped context.Context
	loops   sync.WaitGroup
}

// New opens the store and builds the server over the peer registries the
// caller dialed (DialPeers). It does not listen.
func New(cfg config.Config, logger *slog.Logger, peers Peers) (_ *App, err error) {
	f, err := fetch.New(fetchOptions(cfg, logger))
	if err != nil {
		return nil, fmt.Errorf("--pd-fetch-allow: %w", err)
	}
	a := &App{cfg: cfg, logger: logger, peers: peers}
	a.stopped, a.stop = context.WithCancel(context.Background())
	defer func() {
		if err != nil {
			a.Close()
		}
	}()
	clients := map[string]registryv1.RegistryServiceClient{}
	var resolvers []resolve.Peer
	for _, p := range peers {
		c := registryv1.NewRegistryServiceClient(p.Conn)
		clients[p.Addr] = c
		resolvers = append(resolvers, peer{name: p.Addr, client: c})
	}
	finder := resolve.New(f, resolvers, resolveOptions(cfg), logger)
	st, err := openStore(cfg, logger)
	if err != nil {
		return nil, err
	}
	a.store = st
	opts := serverOptions(cfg)
	opts.Finder, opts.Context, opts.Peers = finder, a.stopped, clients
	if db := pgdb.Of(st); db != nil {
		opts.SharedLimits = db // open registrations count on every replica
	}
	a.server = server.New(st, logger, opts)
	return a, nil
}

// fetchOptions, resolveOptions and serverOptions copy cfg verbatim: the
// config owns every default and the New functions fill in none.
func fetchOptions(cfg config.Config, logger *slog.Logger) fetch.Options {
	return fetch.Options{
		MaxBytes:       cfg.PDMaxBytes,
		AllowHTTP:      cfg.FetchAllowHTTP,
		Allow:          cfg.AllowList(),
		ConnectTimeout: cfg.FetchConnectTimeout,
		Timeout:        cfg.FetchTimeout,
		MaxRedirects:   cfg.FetchMaxRedirects,
		MaxConcurrent:  cfg.FetchMaxConcurrent,
		MaxPerHost:     cfg.FetchMaxPerHost,
		Logger:         logger,
	}
}

func resolveOptions(cfg config.Config) resolve.Options {
	return resolve.Options{
		MaxSources:      cfg.FetchMaxSources,
		NegativeTTL:     cfg.FetchNegativeTTL,
		NegativeEntries: cfg.FetchNegativeEntries,
		PeerTimeout:     cfg.FetchConnectTimeout,
	}
}

// serverOptions leaves Finder, Context and Peers to the caller.
func serverOptions(cfg config.Config) server.Options {
	return server.Options{
		MaxBytes:   cfg.PDMaxBytes,
		Strict:     cfg.PDStrictMetadata,
		PublicURL:  cfg.PublicURL,
		CacheBytes: cfg.PDCacheBytes,
		// One budget for peers and every source: the dispatcher waits for
		// the answer, with a time limit of its own.
		ResolveTimeout: cfg.FetchTimeout,

		OpenRegistration:     cfg.OpenRegistration,
		RegistrationBurst:    cfg.RegistrationBurst,
		RegistrationInterval: cfg.RegistrationInterval,
	}
}

// openStore opens PostgreSQL when cfg.DatabaseURL is set, else registry.db
// in the data directory.
func openStore(cfg config.Config, logger *slog.Logger) (store.Store, error) {
	if cfg.DatabaseURL == "" {
		return boltstore.Open(cfg.DataDir, 2*time.Second)
	}
	ctx, cancel := context.WithTimeout(context.Background(), pgdb.OpenTimeout)
	defer cancel()
	return pgstore.Open(ctx, cfg.DatabaseURL, pgstore.Schema, logger)
}

// Register mounts the registry on s: gRPC service, gateway handlers, the
// raw-document and discovery routes, metrics, health name and readiness.
func (a *App) Register(ctx context.Context, s *serve.Server) error {
	registryv1.RegisterRegistryServiceServer(s, a.server)
	s.SetKeyVerifier(a.server) // keys are checked against this store
	if err := registryv1.RegisterRegistryServiceHandlerServer(ctx, s.Gateway, a.server); err != nil {
		return err
	}
	if a.cfg.PublicURL == "" {
		a.logger.WarnContext(ctx, "--public-url is not set: discovery advertises this registry's documents at the address each request reached (a loopback Host header is kept, any other is ignored); set --public-url when serving others")
	}
	mountRoutes(s, a.server, a.cfg.PublicURL)
	for _, c := range a.server.Collectors() {
		if err := s.Registry().Register(c); err != nil {
			return fmt.Errorf("register registry metrics: %w", err)
		}
	}
	s.HealthService(ServiceName)
	s.AddReadinessCheck("registry-store", a.store.Ping)
	if db := pgdb.Of(a.store); db != nil {
		s.ShareAuthLimits(db) // failed authentications count on every replica
	}
	a.every("request-sweep", requestSweepEvery, a.sweepRequests)
	if a.cfg.PeerSyncInterval > 0 && len(a.peers) > 0 {
		a.every("peer-sync", a.cfg.PeerSyncInterval, a.syncPeers)
	}
	return nil
}

// every runs fn each interval until Close, on one replica at a time when
// the store is PostgreSQL (pgdb.DB.Exclusive, named name).
func (a *App) every(name string, interval time.Duration, fn func(context.Context)) {
	a.loops.Go(func() {
		pgdb.Of(a.store).Every(a.stopped, "registry."+name, interval, pgdb.ExclusiveOptions{Logger: a.logger}, fn)
	})
}

// sweepRequests forgets the day-old request ids, sweep.Batch per
// transaction.
func (a *App) sweepRequests(ctx context.Context) {
	n, err := sweep.InBatches(ctx, time.Now().Add(-requestIDTTL), a.store.SweepRequests)
	if err != nil && ctx.Err() == nil {
		a.logger.WarnContext(ctx, "request id sweep failed; retrying next time", slog.Any("err", err))
		return
	}
	a.logger.DebugContext(ctx, "request ids swept", slog.Int("dropped", n))
}

// syncPeers copies missing protocols from each peer in turn, so that one
// peer being down does not hold up the others.
func (a *App) syncPeers(ctx context.Context) {
	for _, p := range a.peers {
		peer := p.Addr
		resp, err := a.server.SyncPeer(ctx, peer)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			a.logger.WarnContext(ctx, "peer sync failed; retrying next interval", slog.String("peer", peer), slog.Any("err", err))
		case resp.GetCopiedCount() > 0 || len(resp.GetFailures()) > 0:
			a.logger.InfoContext(ctx, "protocols copied from peer", slog.String("peer", peer), slog.Int("copied", int(resp.GetCopiedCount())), slog.Int("failures", len(resp.GetFailures())))
		}
	}
}

func mountRoutes(s *serve.Server, b httpapi.Backend, publicURL string) {
	s.Handle(httpapi.ProtocolRoute, httpapi.Protocols(b))
	disc := httpapi.Discovery(b, publicURL, s.Logger())
	s.Handle(httpapi.WellKnownRoute, disc)
	s.Handle(httpapi.WellKnownAliasRoute, disc)
}

// Close stops the background loops and shared resolutions, then closes
// the store (the caller closes the peer connections).
func (a *App) Close() error {
	a.stop()
	a.loops.Wait()
	if a.server != nil {
		a.server.Close()
	}
	if a.store != nil {
		return a.store.Close()
	}
	return nil
}

// RegisterGateway mounts the registry's REST routes on s for a gateway
// process that reaches the registry over conn instead of in-process,
// including GET /protocols/{hash} and discovery. Sources stored as paths
// are made absolute against each request's host there.
//
// The REST routes call over conn with each caller's credential; the public
// hand-written routes (documents, Agora discovery) call over service as
// the gateway itself (the operator token with access control on; conn
// when nil), as they do in-process in `parley serve`.
func RegisterGateway(ctx context.Context, s *serve.Server, conn *grpc.ClientConn, service grpc.ClientConnInterface) error {
	if service == nil {
		service = conn
	}
	if err := registryv1.RegisterRegistryServiceHandler(ctx, s.Gateway, conn); err != nil {
		return err
	}
	mountRoutes(s, httpapi.ClientBackend(registryv1.NewRegistryServiceClient(service)), "")
	return nil
}

// peer is a peer registry reached over gRPC.
type peer struct {
	name   string
	client registryv1.RegistryServiceClient
}

func (p peer) Name() string { return p.name }

func (p peer) Get(ctx context.Context, h pd.Hash) ([]byte, error) {
	got, err := p.client.GetProtocol(ctx, &registryv1.GetProtocolRequest{Name: "protocols/" + h.Hex()})
	if err != nil {
		return nil, err
	}
	return got.GetContent(), nil
}
