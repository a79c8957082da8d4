// Package app assembles the dispatcher: its store, gRPC server, gateway routes,
// the hand-written Agora routes, health and readiness. Both the one-service
// binary and `parley serve` use it.
package app

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	negotiatorv1 "github.com/parleyhq/parley/gen/parley/negotiator/v1"
	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/boltdb"
	"github.com/parleyhq/parley/platform/pgdb"
	"github.com/parleyhq/parley/platform/serve"
	"github.com/parleyhq/parley/services/dispatcher/config"
	"github.com/parleyhq/parley/services/dispatcher/internal/agora"
	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
	"github.com/parleyhq/parley/services/dispatcher/internal/notify"
	"github.com/parleyhq/parley/services/dispatcher/internal/routine"
	"github.com/parleyhq/parley/services/dispatcher/internal/server"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
	"github.com/parleyhq/parley/services/dispatcher/internal/store/boltstore"
	"github.com/parleyhq/parley/services/dispatcher/internal/store/pgstore"
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
	store  backend
	peers  Peers
	srv    *server.Server
	// mailboxes are the agents' durable mailboxes (network delivery).
	mailboxes *mailbox.Mailboxes
	// dialogues is the store's dialogue side (the same database).
	dialogues store.DialogueStore
	// orders is the store's order side (the same database).
	orders store.OrderStore
	// timers is the store's protocol deadlines (the same database).
	timers store.TimerStore
	// payments is the store's ledger and daily spending (the same bbolt file).
	payments store.PaymentStore
	pool     *routine.Pool // the routine workers
	// serviceProtocols is set once the built-in service PDs are stored
	// in the registry (registerServiceProtocols); until then the
	// dispatcher is not ready (serviceProtocolsReady).
	serviceProtocols atomic.Bool
	// serviceProtocolsErr is why the last attempt to store them failed.
	serviceProtocolsErr atomic.Pointer[error]

	// Background loops (built-in protocols' registration, sweep,
	// deadlines, notification relay, PostgreSQL listener) run from
	// Register until Close cancels stop and waits for them.
	stop    context.CancelFunc
	stopped context.Context
	loops   sync.WaitGroup
	// closing closes when Close starts (closeOnce), ending the loop that
	// waits for the server to stop only if it never did.
	closing   chan struct{}
	closeOnce sync.Once
}

// IsRoutineWorker reports whether this process was started by the
// dispatcher as a routine worker (the binary re-executed, see docs/adr/0005).
// Every binary that runs the dispatcher, test binaries included, begins
// its main (or TestMain) with:
//
//	if app.IsRoutineWorker() {
//		os.Exit(app.ServeRoutineWorker())
//	}
func IsRoutineWorker() bool { return routine.IsWorker() }

// ServeRoutineWorker serves routine runs on stdin and stdout until the
// dispatcher closes them, and returns the exit code.
func ServeRoutineWorker() int { return routine.ServeWorker() }

// New opens the store, starts the routine workers and builds the server.
// It does not listen; Register mounts the server.
func New(cfg config.Config, logger *slog.Logger, peers Peers) (*App, error) {
	st, err := openStore(cfg, logger)
	if err != nil {
		return nil, err
	}
	mbOpts := mailbox.Options{
		Bound:     mailbox.Bound{MaxMessages: cfg.MailboxMaxMessages, MaxBytes: cfg.MailboxMaxBytes},
		Retention: cfg.MailboxRetention,
	}
	if pg, ok := st.(*pgstore.Store); ok {
		mbOpts.Streams = pg // one receive stream per agent across replicas
	}
	mb := mailbox.New(st, mbOpts)
	a := &App{cfg: cfg, logger: logger, store: st, peers: peers, mailboxes: mb, dialogues: st, orders: st, timers: st, payments: st}
	a.stopped, a.stop = context.WithCancel(context.Background())
	a.closing = make(chan struct{})
	if err := routine.Supported(); err != nil {
		st.Close()
		return nil, err
	}
	a.pool = routine.NewPoolWith(poolOptions(cfg))
	opts, err := a.options()
	if err != nil {
		a.Close()
		return nil, err
	}
	a.srv = server.New(st, logger, registryv1.NewRegistryServiceClient(peers.Registry), opts)
	return a, nil
}

// backend is everything the dispatcher keeps: boltstore and pgstore each
// implement all of it over one database.
type backend interface {
	store.Store
	store.DialogueStore
	store.OrderStore
	store.TimerStore
	store.PaymentStore
	mailbox.Store
	notify.Store
}

// openStore opens PostgreSQL when cfg.DatabaseURL is set (several replicas
// share it), else dispatcher.db in the data directory.
func openStore(cfg config.Config, logger *slog.Logger) (backend, error) {
	if cfg.DatabaseURL != "" {
		ctx, cancel := context.WithTimeout(context.Background(), pgdb.OpenTimeout)
		defer cancel()
		return pgstore.Open(ctx, cfg.DatabaseURL, pgstore.Schema, logger)
	}
	opts := boltstore.Options{Logger: logger}
	if cfg.Journal {
		opts.Journal = &boltdb.JournalOptions{}
	}
	return boltstore.OpenWith(cfg.DataDir, 2*time.Second, opts)
}

func (a *App) options() (server.Options, error) {
	names, err := a.cfg.PeerDialects()
	if err != nil {
		return server.Options{}, err
	}
	dialects := map[string]agora.Dialect{}
	for p, n := range names {
		dialects[p], _ = agora.ParseDialect(n)
	}
	var (
		llm server.LLM = server.NoLLM{}
		neg negotiatorv1.NegotiatorServiceClient
	)
	if a.peers.Negotiator != nil {
		neg = negotiatorv1.NewNegotiatorServiceClient(a.peers.Negotiator)
		llm = server.NegotiatorLLM{C: neg}
	}
	return server.Options{
		LLM:                     llm,
		Negotiator:              neg,
		ConversationTTL:         a.cfg.ConversationTTL,
		MaxConversationsPerPeer: a.cfg.MaxConversationsPerPeer,
		RoutineLimits: routine.Limits{
			MaxSteps:       a.cfg.RoutineMaxSteps,
			Timeout:        a.cfg.RoutineTimeout,
			MaxOutputBytes: a.cfg.RoutineMaxOutputBytes,
			MaxToolCalls:   a.cfg.RoutineMaxToolCalls,
			MaxAllocBytes:  a.cfg.RoutineMaxAllocBytes,
			Pool:           a.pool,
		},
		QuarantineAfter:  a.cfg.QuarantineAfter,
		HandlerTimeout:   a.cfg.HandlerTimeout,
		HandlerQueue:     a.cfg.HandlerQueue,
		CacheTTL:         a.cfg.CacheTTL,
		NegativeCacheTTL: a.cfg.NegativeCacheTTL,
		PeerDialects:     dialects,
		PublicURL:        a.cfg.PublicURL,
		SendTimeout:      a.cfg.SendTimeout,
		SendRetries:      a.cfg.SendRetries,
		SendAllowPrivate: a.cfg.SendAllowPrivate,
		SendMaxListed:    a.cfg.SendMaxListed,
		SendMaxJudge:     a.cfg.SendMaxJudgeCalls,
		// The agent network's dialogues.
		Dialogues:                  a.dialogues,
		Mailboxes:                  a.mailboxes,
		Orders:                     a.orders,
		Timers:                     a.timers,
		Payments:                   a.payments,
		MessageMaxBodyBytes:        a.cfg.MessageMaxBodyBytes,
		MessageTimeout:             a.cfg.MessageTimeout,
		DialogueRetention:          a.cfg.DialogueRetention,
		PaymentMaxOpen:             a.cfg.PaymentMaxOpen,
		PaymentRetention:           a.cfg.PaymentRetention,
		ServiceProtocolsRegistered: a.serviceProtocols.Load,
		// Their receive streams.
		Delivery: a.mailboxes,
		MailboxOptions: server.MailboxOptions{
			Batch: a.cfg.MailboxStreamBatch, Keepalive: a.cfg.MailboxStreamKeepalive, MaxDuration: a.cfg.MailboxStreamMaxDuration,
			WriteTimeout: a.cfg.MailboxStreamWriteTimeout,
		},
	}, nil
}

// Register mounts the dispatcher on s: gRPC service, gateway handlers, the
// Agora routes, health name and readiness checks. The background loops it
// starts (expired conversations' sweep, deadlines, notification relay) run
// until ctx ends, s starts shutting down, or Close.
func (a *App) Register(ctx context.Context, s *serve.Server) error {
	srv := a.srv
	srv.Start(s.Stopping())
	for _, c := range srv.Collectors() {
		if err := s.Registry().Register(c); err != nil {
			return err
		}
	}
	if bs, ok := a.store.(*boltstore.Store); ok {
		commits := prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "parley_dispatcher_bbolt_commits_total",
			Help: "Write transactions committed durably to dispatcher.db (two fdatasyncs each, data pages then the meta page, or with --dispatcher-journal one, of its record in the journal); several writers' changes may share one (group commit).",
		}, func() float64 { return float64(bs.Commits().Synced) })
		pages := prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "parley_dispatcher_bbolt_pages_written_total",
			Help: "Pages (4 KiB) the commits to dispatcher.db wrote: the changed pages of every bucket touched, the root and the meta page. The first fdatasync of a commit writes them (with --dispatcher-journal, the next checkpoint's).",
		}, func() float64 { return float64(bs.Commits().Pages) })
		syncs := prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "parley_dispatcher_bbolt_fdatasyncs_total",
			Help: "fdatasyncs of dispatcher.db and its journal: two per commit bbolt synced itself (--dispatcher-journal=false), else one per journaled commit, two per checkpoint and one per step of the journal's growth.",
		}, func() float64 { return float64(bs.Commits().Syncs) })
		for _, c := range []prometheus.Collector{commits, pages, syncs} {
			if err := s.Registry().Register(c); err != nil {
				return err
			}
		}
	}
	dispatcherv1.RegisterDispatcherServiceServer(s, srv)
	s.FallbackKeyVerifier(introspector(registryv1.NewRegistryServiceClient(a.peers.Registry)))
	if err := dispatcherv1.RegisterDispatcherServiceHandlerServer(ctx, s.Gateway, srv); err != nil {
		return err
	}
	for pattern, h := range server.AgoraRoutes(srv, a.httpOptions()) {
		s.Handle(pattern, h)
	}
	for pattern, h := range srv.MailboxRoutes() {
		s.Handle(pattern, serve.Stream(h))
	}
	s.HealthService(ServiceName)
	s.AddReadinessCheck("dispatcher-store", a.store.Ping)
	if db := pgdb.Of(a.store); db != nil {
		s.ShareAuthLimits(db) // failed authentications count on every replica
	}
	s.AddReadinessCheck("registry", serve.PeerCheck(a.peers.Registry, "parley.registry.v1.RegistryService"))
	s.AddReadinessCheck("negotiator", serve.PeerCheck(a.peers.Negotiator, "parley.negotiator.v1.NegotiatorService"))
	s.AddReadinessCheck("service-protocols", a.serviceProtocolsReady)
	// The loops also end when ctx ends or s starts shutting down: the
	// relay's long poll goes through s (in `parley serve`), and s drains
	// its calls before Close runs.
	a.loops.Go(func() {
		select {
		case <-ctx.Done():
		case <-s.Stopping():
		case <-a.stopped.Done():
		}
		a.stop()
	})
	a.loops.Go(func() { a.registerServiceProtocols(a.stopped, registryv1.NewRegistryServiceClient(a.peers.Registry)) })
	// Background work runs on one replica at a time (pgdb.DB.Exclusive);
	// their effects are transactional, so a brief overlap at a takeover is
	// harmless.
	db := pgdb.Of(a.store)
	exclusive := pgdb.ExclusiveOptions{Logger: a.logger}
	a.loops.Go(func() {
		db.Every(a.stopped, "dispatcher.sweep", sweepEvery, exclusive, func(ctx context.Context) { a.sweep(ctx, srv) })
	})
	a.loops.Go(func() { db.Exclusive(a.stopped, "dispatcher.deadlines", exclusive, srv.RunDeadlines) })
	if pg, ok := a.store.(*pgstore.Store); ok {
		// Other replicas' appends wake the streams connected here, their
		// timers the deadlines, their routine changes drop ours, and their
		// streams end the older ones here.
		logger := a.logger.With("component", "listen")
		a.loops.Go(func() {
			pg.Listen(a.stopped, logger, pgstore.Wakeups{
				Mailboxes: a.mailboxes.Nudge, Timers: srv.WakeDeadlines, Routines: srv.RoutineChanged,
				Streams: func(agent string, epoch uint64) {
					if agent != "" {
						a.mailboxes.Supersede(agent, epoch)
						return
					}
					// Not on Listen's goroutine; Close waits for it too.
					a.loops.Go(func() { a.recheckStreams(a.stopped, pg, logger) })
				},
			})
		})
		// When this replica stops, its streams all end at once: their rows
		// go in batches, within the shutdown's time limit (Close waits).
		a.loops.Go(func() {
			select {
			case <-s.Stopping():
			case <-a.closing:
			}
			if !isClosed(s.Stopping()) {
				return // Close without a shutdown: no stream is left
			}
			ctx, cancel := context.WithTimeout(context.Background(), s.ShutdownTimeout())
			defer cancel()
			if err := a.mailboxes.EndStreams(ctx); err != nil {
				logger.WarnContext(ctx, "receive streams of this replica not all closed; the sweep deletes the rest", slog.Any("err", err))
			}
		})
		// This replica's streams stay in mailbox_streams while they live;
		// the rows of a replica that died without ending them are swept.
		a.loops.Go(func() {
			pgdb.Tick(a.stopped, streamTouchEvery, func(ctx context.Context) {
				local := a.mailboxes.StreamEpochs()
				stamped, err := pg.TouchStreams(ctx, local)
				if err != nil {
					if ctx.Err() == nil {
						logger.WarnContext(ctx, "receive streams not stamped as seen; retrying next tick", slog.Any("err", err))
					}
					return
				}
				// A stream whose row is gone or names another stream was
				// replaced, its notification missed: it ends now, within
				// a tick, even if the listener never reconnected.
				a.mailboxes.Recheck(local, stamped)
			})
		})
	}
	// The registry's network notifications reach mailboxes through this
	// relay; the registry never calls the dispatcher.
	relay := notify.New(server.NotificationSource(registryv1.NewRegistryServiceClient(a.peers.Registry)), a.mailboxes, a.store, notify.Options{
		RetryFor: a.cfg.NotificationRetryFor, Logger: a.logger.With("component", "notify"), Metrics: s.Registry(),
	})
	a.loops.Go(func() {
		db.Exclusive(a.stopped, "dispatcher.notifications", exclusive, func(ctx context.Context) { _ = relay.Run(ctx) }) // returns nil when ctx ends
	})
	return nil
}

// recheckStreams ends the streams connected here that a newer stream on
// another replica replaced while this replica missed its notifications,
// including those whose newer stream ended meanwhile (their row is gone).
// It runs each time the listening connection (re)connects.
func (a *App) recheckStreams(ctx context.Context, pg *pgstore.Store, logger *slog.Logger) {
	local := a.mailboxes.StreamEpochs()
	if len(local) == 0 {
		return
	}
	agents := make([]string, 0, len(local))
	for agent := range local {
		agents = append(agents, agent)
	}
	newest, err := pg.StreamEpochs(ctx, agents)
	if err != nil {
		logger.WarnContext(ctx, "receive streams not checked against other replicas", slog.Any("err", err))
		return
	}
	a.mailboxes.Recheck(local, newest)
}

// isClosed reports whether ch is closed.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// Mailboxes returns the agents' mailboxes, which the network's senders
// append to; tests append through it too.
func (a *App) Mailboxes() mailbox.Appender { return a.mailboxes }

func (a *App) httpOptions() server.HTTPOptions { return httpOptions(a.cfg) }

func httpOptions(cfg config.Config) server.HTTPOptions {
	return server.HTTPOptions{MaxBodyBytes: cfg.AgoraMaxBodyBytes, PeerHeader: cfg.AgoraPeerHeader}
}

// sweepEvery is how often expired conversations are swept and
// acknowledged messages compacted.
const sweepEvery = 10 * time.Minute

// Each replica stamps its receive streams in mailbox_streams every
// streamTouchEvery; the sweep deletes rows unstamped for streamUnseenFor,
// those of replicas that died (an ended stream deletes its own row).
const (
	streamTouchEvery = time.Minute
	streamUnseenFor  = 5 * time.Minute
)

// sweep drops expired conversations and compacts acknowledged messages.
func (a *App) sweep(ctx context.Context, srv *server.Server) {
	if n, err := srv.Sweep(ctx); err != nil {
		a.logger.WarnContext(ctx, "conversation sweep failed; retrying next tick", slog.Any("err", err))
	} else if n > 0 {
		a.logger.InfoContext(ctx, "swept expired conversations", slog.Int("count", n))
	}
	if n, err := a.mailboxes.Compact(ctx, 1000); err != nil {
		a.logger.WarnContext(ctx, "mailbox compaction failed; retrying next tick", slog.Any("err", err))
	} else if n > 0 {
		a.logger.InfoContext(ctx, "compacted acknowledged messages", slog.Int("count", n))
	}
	if pg, ok := a.store.(*pgstore.Store); ok {
		if n, err := pg.SweepStreams(ctx, streamUnseenFor); err != nil {
			a.logger.WarnContext(ctx, "receive stream sweep failed; retrying next tick", slog.Any("err", err))
		} else if n > 0 {
			a.logger.InfoContext(ctx, "swept the receive streams of replicas gone", slog.Int("count", n))
		}
	}
}

// Close stops the background loops and the shadow runs in flight and
// waits for them, then stops the routine workers and closes the store.
func (a *App) Close() error {
	a.closeOnce.Do(func() { close(a.closing) })
	a.stop()
	a.loops.Wait()
	if a.srv != nil {
		a.srv.StopShadows() // they may install a routine in the store
		a.srv.StopStreams() // SSE streams on hijacked connections read it
	}
	return errors.Join(a.pool.Close(), a.store.Close())
}

// RegisterGateway mounts the dispatcher's REST routes, the Agora routes and
// the mailboxes' SSE route on s for a gateway process that reaches the
// dispatcher over gRPC instead of in-process: the REST and SSE routes over
// conn, with each caller's own credential, and the public Agora routes over
// service, as the gateway itself (the operator token with access control
// on; conn when nil). cfg needs only the flags of
// config.RegisterGatewayFlags.
func RegisterGateway(ctx context.Context, s *serve.Server, conn *grpc.ClientConn, service grpc.ClientConnInterface, cfg config.Config) error {
	if service == nil {
		service = conn
	}
	if err := cfg.ValidateGateway(); err != nil {
		return err
	}
	if err := dispatcherv1.RegisterDispatcherServiceHandler(ctx, s.Gateway, conn); err != nil {
		return err
	}
	client := dispatcherv1.NewDispatcherServiceClient(conn)
	for pattern, h := range server.AgoraRoutes(server.RemoteDeliverer{C: dispatcherv1.NewDispatcherServiceClient(service)}, httpOptions(cfg)) {
		s.Handle(pattern, h)
	}
	routes, stopStreams := server.RemoteMailboxRoutes(client, s.Stopping(), cfg.MailboxStreamWriteTimeout)
	for pattern, h := range routes {
		s.Handle(pattern, serve.Stream(h))
	}
	s.OnDrain(stopStreams)
	return nil
}

// poolOptions are the routine pool's options, copied from cfg.
func poolOptions(cfg config.Config) routine.PoolOptions {
	return routine.PoolOptions{
		Workers:     cfg.RoutineWorkers,
		MemoryBytes: cfg.RoutineMemoryBytes,
		KillMargin:  cfg.RoutineKillMargin,
		WorkerCPU:   cfg.RoutineWorkerCPU,
	}
}
