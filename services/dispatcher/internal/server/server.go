// Package server implements parley.dispatcher.v1.DispatcherService: the
// Agora receiving path (DeliverEnvelope, behind the hand-written /agora HTTP
// routes), the sending path (Send), routines and tools, SDK agent streams
// (Connect) and Agent Protocol steps (ExecuteStep).
package server

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	negotiatorv1 "github.com/parleyhq/parley/gen/parley/negotiator/v1"
	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/egress"
	"github.com/parleyhq/parley/services/dispatcher/internal/agora"
	"github.com/parleyhq/parley/services/dispatcher/internal/pdschema"
	"github.com/parleyhq/parley/services/dispatcher/internal/routine"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

// Domain is the ErrorInfo domain of the dispatcher's errors.
const Domain = "dispatcher.parley.dev"

// Options configures a Server. Zero values take the defaults noted.
type Options struct {
	// LLM answers what no routine or handler can; NoLLM when nil.
	LLM LLM
	// Negotiator runs protocol negotiations (Send with task schemas, and
	// envelopes under the negotiation PD or "negotiation"); none when nil.
	Negotiator negotiatorv1.NegotiatorServiceClient
	// Metrics receives the dispatcher's collectors; none when nil.
	Metrics prometheus.Registerer
	// ConversationTTL is the sliding lifetime of a conversation; 5 min.
	ConversationTTL time.Duration
	// MaxConversationsPerPeer caps a peer's open conversations; 100.
	MaxConversationsPerPeer int
	// RoutineLimits are each routine run's budgets.
	RoutineLimits routine.Limits
	// QuarantineAfter consecutive failures quarantine a routine; 3.
	QuarantineAfter int
	// HandlerTimeout is how long a connected SDK agent has to answer; 10 s.
	HandlerTimeout time.Duration
	// Stopping, when it closes, ends every connected agent's stream with
	// UNAVAILABLE so that a graceful shutdown need not wait for agents to
	// hang up (the SDK reconnects); never closes when nil.
	Stopping <-chan struct{}
	// HandlerQueue bounds each connected SDK agent's queue of requests not
	// yet written to its stream; 64. A full queue fails requests at once,
	// and one full for HandlerTimeout drops the connection.
	HandlerQueue int
	// CacheTTL is how long agents and routines are cached; 5 s. Protocols,
	// being immutable, are cached for at least a minute.
	CacheTTL time.Duration
	// NegativeCacheTTL is how long an agent the registry reports NOT_FOUND
	// stays unknown without asking again; 0 asks every time.
	NegativeCacheTTL time.Duration
	// PeerDialects fixes the reply dialect of some peers (as DeliverEnvelope's
	// peer field names them).
	PeerDialects map[string]agora.Dialect
	// PublicURL is our HTTP side's public base URL, for protocolSources.
	PublicURL string
	// SendTimeout bounds one outbound HTTP attempt; 10 s.
	SendTimeout time.Duration
	// SendRetries is how many times a safe-to-retry send is retried; 2.
	SendRetries int
	// HTTPClient sends outbound envelopes; when nil, a client that refuses
	// loopback and private addresses unless SendAllowPrivate.
	HTTPClient *http.Client
	// SendAllowPrivate lets Send reach loopback and private addresses.
	SendAllowPrivate bool
	// SendLookup resolves target host names for Send instead of the system
	// resolver; a test seam (the address guard applies either way).
	SendLookup egress.Lookup
	// SendMaxListed is how many of the protocols a target's well-known
	// document lists Send resolves at most (in hash order); 5.
	SendMaxListed int
	// SendMaxJudge caps the LLM calls one Send spends judging whether a
	// listed protocol fits its task; 2 when zero, none when negative.
	SendMaxJudge int
	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

// Server implements the dispatcher's gRPC API.
type Server struct {
	dispatcherv1.UnimplementedDispatcherServiceServer

	store    store.Store
	logger   *slog.Logger
	registry registryv1.RegistryServiceClient
	opts     Options
	llm      LLM
	neg      negotiatorv1.NegotiatorServiceClient
	metrics  *metrics
	now      func() time.Time

	agents    *cache[*agentEntry]
	protocols *cache[*protocolEntry]
	schemas   *pdschema.Cache
	routines  *routineCache
	shadows   *shadows
	hub       *hub
	wellknown *cache[map[string][]string]
	// pickMisses remembers, per target, listed protocols that did not
	// resolve or that the LLM judged unfit for a task, for 10 minutes.
	pickMisses *expirySet
	client     *http.Client

	backoff negotiationBackoff
	negPDMu sync.Mutex // guards negPD
	negPD   []byte     // the negotiation PD, once fetched from the negotiator
}

var _ dispatcherv1.DispatcherServiceServer = (*Server)(nil)

// New returns a Server over st that reaches the registry through reg.
func New(st store.Store, logger *slog.Logger, reg registryv1.RegistryServiceClient, opts Options) *Server {
	if opts.LLM == nil {
		opts.LLM = NoLLM{}
	}
	if opts.ConversationTTL <= 0 {
		opts.ConversationTTL = 5 * time.Minute
	}
	if opts.MaxConversationsPerPeer <= 0 {
		opts.MaxConversationsPerPeer = 100
	}
	if opts.QuarantineAfter <= 0 {
		opts.QuarantineAfter = 3
	}
	if opts.HandlerTimeout <= 0 {
		opts.HandlerTimeout = 10 * time.Second
	}
	if opts.HandlerQueue <= 0 {
		opts.HandlerQueue = 64
	}
	if opts.CacheTTL <= 0 {
		opts.CacheTTL = 5 * time.Second
	}
	if opts.SendTimeout <= 0 {
		opts.SendTimeout = 10 * time.Second
	}
	if opts.SendMaxListed <= 0 {
		opts.SendMaxListed = 5
	}
	if opts.SendMaxJudge == 0 {
		opts.SendMaxJudge = 2
	}
	if opts.SendRetries < 0 {
		opts.SendRetries = 0
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	s := &Server{
		store:    st,
		logger:   logger,
		registry: reg,
		opts:     opts,
		llm:      opts.LLM,
		neg:      opts.Negotiator,
		metrics:  newMetrics(opts.Metrics),
		now:      opts.Now,
	}
	s.agents = newCache[*agentEntry](opts.CacheTTL, opts.Now).
		withNegative(opts.NegativeCacheTTL, func(err error) bool { return status.Code(err) == codes.NotFound })
	s.protocols = newCache[*protocolEntry](max(opts.CacheTTL, time.Minute), opts.Now)
	s.schemas = pdschema.NewCache(10_000)
	s.wellknown = newCache[map[string][]string](max(opts.CacheTTL, 30*time.Second), opts.Now)
	s.routines = newRoutineCache(s)
	s.shadows = newShadows(opts.CacheTTL, opts.Now)
	s.pickMisses = newExpirySet(10*time.Minute, opts.Now)
	s.hub = newHub(s.metrics)
	s.client = opts.HTTPClient
	if s.client == nil {
		s.client = newSendClient(opts.SendAllowPrivate, opts.SendLookup)
	}
	return s
}

// Sweep removes conversations that expired more than a day ago, keeping
// recent ones as tombstones so that late follow-ups get "Conversation
// expired" rather than 404. app runs it periodically.
func (s *Server) Sweep(ctx context.Context) (int, error) {
	return s.store.SweepConversations(ctx, s.now().Add(-24*time.Hour))
}
