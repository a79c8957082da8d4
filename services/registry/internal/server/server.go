// Package server implements parley.registry.v1.RegistryService.
package server

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/singleflight"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/auth"
	"github.com/parleyhq/parley/services/registry/internal/pd"
	"github.com/parleyhq/parley/services/registry/internal/resolve"
	"github.com/parleyhq/parley/services/registry/internal/store"
)

// Domain is the ErrorInfo domain of the registry's errors.
const Domain = "registry.parley.dev"

// Finder finds documents that are not stored; *resolve.Resolver is one.
type Finder interface {
	Find(ctx context.Context, h pd.Hash, sources []string) (*resolve.Found, error)
}

// Options are the Server's optional settings.
type Options struct {
	// MaxBytes caps a document [256 KiB].
	MaxBytes int64
	// Strict rejects documents without complete metadata.
	Strict bool
	// PublicURL is the public base URL of the HTTP side; with it, default
	// protocol sources are absolute.
	PublicURL string
	// CacheBytes caps the in-memory document cache; 0 disables it.
	CacheBytes int64
	// Finder resolves unknown hashes; nil means only stored ones resolve.
	Finder Finder
	// ResolveTimeout bounds one shared resolution, peers and every source
	// together.
	ResolveTimeout time.Duration
	// Context is the server's lifetime: shared resolutions stop when it
	// ends [never]. Close then waits for them.
	Context context.Context
	// Peers are the peer registries SyncProtocols copies from, by the name
	// they were configured with.
	Peers map[string]registryv1.RegistryServiceClient
	// OpenRegistration lets callers other than the operator create clients,
	// at most RegistrationBurst at once and then one per
	// RegistrationInterval per remote address. New fills in no limit:
	// MaxBytes, ResolveTimeout, RegistrationInterval and RegistrationBurst
	// must be positive (config owns their defaults).
	OpenRegistration     bool
	RegistrationInterval time.Duration
	RegistrationBurst    int
	// SharedLimits, when set (the store's database), keeps the
	// registration limit where every replica sees it; without it each
	// replica limits alone.
	SharedLimits auth.SharedBuckets
}

// Server implements the registry's gRPC API.
type Server struct {
	registryv1.UnimplementedRegistryServiceServer

	store   store.Store
	logger  *slog.Logger
	opts    Options
	cache   *protocolCache
	flight  singleflight.Group // one resolution per hash in flight
	metrics *metrics
	now     func() time.Time

	// Shared resolutions in flight, so that Close can wait for them
	// before the store closes.
	mu       sync.Mutex // guards closed and Add on running
	closed   bool
	running  sync.WaitGroup
	resolves atomic.Int64 // callers waiting on a resolution (tests)

	registrations *auth.Limiter // open registrations per remote address
	outbox        *outboxSignal // wakes ListNotifications on new notifications
}

// errClosed refuses resolutions once Close has begun.
var errClosed = errors.New("the registry is shutting down")

var _ registryv1.RegistryServiceServer = (*Server)(nil)

// New returns a Server over st.
func New(st store.Store, logger *slog.Logger, opts Options) *Server {
	if opts.Context == nil {
		opts.Context = context.Background()
	}
	opts.PublicURL = strings.TrimRight(opts.PublicURL, "/")
	registrations := auth.NewLimiter(1/opts.RegistrationInterval.Seconds(), opts.RegistrationBurst, nil)
	if opts.SharedLimits != nil {
		registrations.Share("registry.registrations", opts.SharedLimits, logger)
	}
	return &Server{
		registrations: registrations,
		store:         st,
		logger:        logger,
		opts:          opts,
		cache:         newProtocolCache(opts.CacheBytes),
		metrics:       newMetrics(),
		now:           time.Now,
		outbox:        newOutboxSignal(),
	}
}

// Close waits for shared resolutions to end and refuses new ones; cancel
// Options.Context first so that they end promptly. The store stays open.
func (s *Server) Close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.running.Wait()
}

// begin registers a shared resolution; false once Close has begun.
func (s *Server) begin() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.running.Add(1)
	return true
}

// Collectors returns the server's Prometheus collectors, for the caller to
// register.
func (s *Server) Collectors() []prometheus.Collector { return s.metrics.collectors() }

// ProtocolURL is where this registry serves a document: the public URL's
// /protocols/{sha1-hex}, or that path alone when no public URL is set
// (discovery then resolves it against the request's host).
func (s *Server) ProtocolURL(h pd.Hash) string {
	return s.opts.PublicURL + "/protocols/" + h.Hex()
}

type metrics struct {
	resolves *prometheus.CounterVec
	stored   *prometheus.CounterVec
}

func newMetrics() *metrics {
	return &metrics{
		resolves: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "parley_registry_resolves_total",
			Help: "Protocol resolutions (ResolveProtocol, AddSupportedProtocol) by outcome: stored, peer, source, failed.",
		}, []string{"outcome"}),
		stored: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "parley_registry_protocols_stored_total",
			Help: "Protocol documents newly stored, by how they arrived: api, peer, source.",
		}, []string{"via"}),
	}
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.resolves, m.stored}
}
