// Package server is the dispatcher's transport: the gRPC handlers of
// parley.dispatcher.v1.DispatcherService and the hand-written Agora HTTP
// routes. Each handler decodes and validates, calls the core, and maps its
// errors (toStatus); the core lives in concept packages that know nothing
// of gRPC:
//
//	inbound      an envelope or a step in, the answer out
//	outbound     Send: pick a protocol, write, post, read, negotiate
//	hub          connected SDK agents (Connect streams)
//	shadow       LLM-written routine candidates run beside the LLM
//	hosted       routines and tools: lookup, run, quarantine, Install
//	negotiation  the negotiator's interface and installing agreements
//	directory    the registry's agents and protocols, cached
//
// This package also adapts the peers to the core's small interfaces: the
// registry's and negotiator's gRPC clients (peers.go, negotiator.go) and
// the guarded HTTP client that sends envelopes.
package server

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	negotiatorv1 "github.com/parleyhq/parley/gen/parley/negotiator/v1"
	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/egress"
	"github.com/parleyhq/parley/platform/sweep"
	"github.com/parleyhq/parley/services/dispatcher/internal/agora"
	"github.com/parleyhq/parley/services/dispatcher/internal/deadline"
	"github.com/parleyhq/parley/services/dispatcher/internal/dialogue"
	"github.com/parleyhq/parley/services/dispatcher/internal/directory"
	"github.com/parleyhq/parley/services/dispatcher/internal/hosted"
	"github.com/parleyhq/parley/services/dispatcher/internal/hub"
	"github.com/parleyhq/parley/services/dispatcher/internal/inbound"
	"github.com/parleyhq/parley/services/dispatcher/internal/llm"
	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
	"github.com/parleyhq/parley/services/dispatcher/internal/metrics"
	"github.com/parleyhq/parley/services/dispatcher/internal/negotiation"
	"github.com/parleyhq/parley/services/dispatcher/internal/order"
	"github.com/parleyhq/parley/services/dispatcher/internal/outbound"
	"github.com/parleyhq/parley/services/dispatcher/internal/payment"
	"github.com/parleyhq/parley/services/dispatcher/internal/routine"
	"github.com/parleyhq/parley/services/dispatcher/internal/shadow"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

// Domain is the ErrorInfo domain of the dispatcher's errors.
const Domain = "dispatcher.parley.dev"

// NegotiationPDHash is the SHA-1 of Parley's negotiation PD.
const NegotiationPDHash = negotiation.PDHash

// LLM is internal/llm's LLM, for callers of this package (app, tests).
type LLM = llm.LLM

// LLMRequest is internal/llm's Request.
type LLMRequest = llm.Request

// LLMResult is internal/llm's Result.
type LLMResult = llm.Result

// LLMPurpose is internal/llm's Purpose.
type LLMPurpose = llm.Purpose

// NoLLM is internal/llm's NoLLM.
type NoLLM = llm.NoLLM

// LLMTool is internal/llm's Tool.
type LLMTool = llm.Tool

// LLM errors and purposes, re-exported from internal/llm.
var (
	ErrNoLLM     = llm.ErrNoLLM
	ErrLLMBudget = llm.ErrLLMBudget
)

// LLM purposes, re-exported from internal/llm.
const (
	PurposeReply     = llm.PurposeReply
	PurposeNegotiate = llm.PurposeNegotiate
	PurposeSend      = llm.PurposeSend
	PurposeParse     = llm.PurposeParse
	PurposeJudge     = llm.PurposeJudge
	PurposeStep      = llm.PurposeStep
)

// Options configures a Server. The dispatcher's config owns every default
// and copies its values here verbatim; New substitutes none. The limits and
// durations below must be positive unless their comment says what zero means
// (config.Validate refuses the rest).
type Options struct {
	// LLM answers what no routine or handler can; NoLLM when nil.
	LLM LLM
	// Negotiator runs protocol negotiations (Send with task schemas, and
	// envelopes under the negotiation PD or "negotiation") and keeps
	// routine candidates; none when nil.
	Negotiator negotiatorv1.NegotiatorServiceClient
	// Metrics receives the dispatcher's collectors; none when nil.
	Metrics prometheus.Registerer
	// ConversationTTL is the sliding lifetime of a conversation.
	ConversationTTL time.Duration
	// MaxConversationsPerPeer caps a peer's open conversations.
	MaxConversationsPerPeer int
	// RoutineLimits are each routine run's budgets.
	RoutineLimits routine.Limits
	// QuarantineAfter consecutive failures quarantine a routine.
	QuarantineAfter int
	// HandlerTimeout is how long a connected SDK agent has to answer.
	HandlerTimeout time.Duration
	// Stopping, when it closes, ends every connected agent's stream with
	// UNAVAILABLE so that a graceful shutdown need not wait for agents to
	// hang up (the SDK reconnects); never closes when nil.
	Stopping <-chan struct{}
	// HandlerQueue bounds each connected SDK agent's queue of requests not
	// yet written to its stream.
	HandlerQueue int
	// CacheTTL is how long agents and routines are cached. Protocols,
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
	// SendTimeout bounds one outbound HTTP attempt.
	SendTimeout time.Duration
	// SendRetries is how many times a safe-to-retry send is retried; zero
	// sends once.
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
	// document lists Send resolves at most (in hash order).
	SendMaxListed int
	// SendMaxJudge caps the LLM calls one Send spends judging whether a
	// listed protocol fits its task; zero judges none.
	SendMaxJudge int
	// Now is the clock; time.Now when nil.
	Now func() time.Time

	// The agent network (issue 13). Dialogues and Mailboxes both set turn
	// on the dialogue RPCs; without them they answer UNAVAILABLE.
	Dialogues store.DialogueStore
	Mailboxes dialogue.Mailboxes // the mailboxes Dialogues appends to, in its own transactions
	// MessageMaxBodyBytes caps a network message's body_json.
	MessageMaxBodyBytes int64
	// MessageTimeout bounds one dialogue RPC.
	MessageTimeout time.Duration
	// DialogueRetention is how long a closed dialogue is kept before Sweep
	// removes it (--dialogue-retention).
	DialogueRetention time.Duration
	// ServiceProtocolsRegistered reports whether the built-in service PDs
	// are stored in the registry yet (app registers them at start). While
	// it reports false, a request under one the registry does not know is
	// UNAVAILABLE (retry), not INVALID_ARGUMENT. nil reports true.
	ServiceProtocolsRegistered func() bool
	// Orders keeps service transactions' orders; GetOrder and ListOrders
	// answer UNAVAILABLE without it, and no order is recorded.
	Orders store.OrderStore
	// Timers keeps protocol deadlines (RunDeadlines fires them); without
	// it late messages are still refused, but no expiry is sent.
	Timers store.TimerStore
	// Payments keeps the ledger provider's payments and the owners' daily
	// spending; without it the payment RPCs are UNAVAILABLE.
	Payments store.PaymentStore
	// PaymentMaxOpen bounds each payer's open (not captured) payments;
	// 0 means no bound.
	PaymentMaxOpen int
	// PaymentRetention is how long Sweep keeps a payment not reserved
	// after its last change, and the spend records of a UTC day after it
	// ended (today's and yesterday's always); 0 keeps both forever.
	PaymentRetention time.Duration
	// Acceptances checks every message that would form an order (an
	// accept_offer) before it is recorded: payments, signed approvals,
	// spending limits. nil lets each through to the state machine.
	Acceptances dialogue.AcceptanceGate

	// Delivery is the mailboxes that ReceiveMessages, AcknowledgeMessages
	// and the SSE route read; those answer UNIMPLEMENTED when nil.
	Delivery *mailbox.Mailboxes
	// MailboxOptions tune the receive streams.
	MailboxOptions MailboxOptions
}

// Server implements the dispatcher's gRPC API over the core.
type Server struct {
	dispatcherv1.UnimplementedDispatcherServiceServer

	store    store.Store
	logger   *slog.Logger
	opts     Options
	metrics  *metrics.Metrics
	dir      *directory.Directory
	routines *hosted.Set
	hub      *hub.Hub
	shadows  *shadow.Runner
	inbound  *inbound.Pipeline
	outbound *outbound.Sender
	// dialogues is nil when Options has no Dialogues or Mailboxes.
	dialogues *dialogue.Service
	// deadlines fires protocol deadlines; nil without Options.Timers.
	deadlines *deadline.Scheduler
	// ledger and payments are nil without Options.Payments.
	ledger   *payment.Ledger
	payments *payment.Gate
	owners   ownerSource
	// sseStreams are the SSE streams served on hijacked connections.
	sseStreams streamSet
}

var _ dispatcherv1.DispatcherServiceServer = (*Server)(nil)

// New returns a Server over st that reaches the registry through reg.
func New(st store.Store, logger *slog.Logger, reg registryv1.RegistryServiceClient, opts Options) *Server {
	if opts.LLM == nil {
		opts.LLM = NoLLM{}
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	m := metrics.New(opts.Metrics)
	dir := directory.New(registryPeer{reg}, directory.Options{CacheTTL: opts.CacheTTL, NegativeTTL: opts.NegativeCacheTTL, Now: opts.Now})
	routines := hosted.New(st, agentChecker{dir}, hosted.Options{
		Limits: opts.RoutineLimits, QuarantineAfter: opts.QuarantineAfter, CacheTTL: opts.CacheTTL, Now: opts.Now, Logger: logger, Metrics: m,
	})
	var (
		neg        negotiation.Negotiator
		candidates shadow.Candidates
	)
	if opts.Negotiator != nil {
		neg = negotiatorPeer{opts.Negotiator}
		candidates = candidatePeer{opts.Negotiator}
	}
	shadows := shadow.New(candidates, routines, shadow.Options{CacheTTL: opts.CacheTTL, Now: opts.Now, Logger: logger, Metrics: m})
	h := hub.New(hub.Options{Queue: opts.HandlerQueue, Timeout: opts.HandlerTimeout, Stopping: opts.Stopping, Logger: logger, Metrics: m})
	model := llm.Counted{LLM: opts.LLM, Metrics: m}
	client := opts.HTTPClient
	if client == nil {
		client = newSendClient(opts.SendAllowPrivate, opts.SendLookup)
	}
	var (
		dialogues *dialogue.Service
		deadlines *deadline.Scheduler
	)
	if opts.Dialogues != nil && opts.Mailboxes != nil {
		obs := pairObserver{}
		if opts.Orders != nil {
			obs.orders = order.New(opts.Orders)
		}
		if opts.Timers != nil {
			deadlines = deadline.New(opts.Timers, serviceMachines{dir}, opts.Mailboxes, deadline.Options{
				Now: opts.Now, Logger: logger, Expired: obs.expired, Failures: m.DeadlineFailures,
			})
			obs.deadlines = deadlines
		}
		dopts := dialogue.Options{
			Protocols: protocolMachines{dir}, Logger: logger, Now: opts.Now, Observer: obs, Retention: opts.DialogueRetention, Acceptances: opts.Acceptances,
		}
		if opts.Orders != nil {
			// Orders are written in the dialogue store's transactions:
			// the two are one backend (app.New).
			dopts.Orders = orderWrite
		}
		dialogues = dialogue.New(opts.Dialogues, opts.Mailboxes, registryResolver{c: reg}, dopts)
	}
	var (
		ledger *payment.Ledger
		gate   *payment.Gate
	)
	if opts.Payments != nil {
		ledger = payment.NewLedger(opts.Payments, dialogue.NewID, opts.Now, payment.LedgerLimits{
			MaxOpen: opts.PaymentMaxOpen, Retention: opts.PaymentRetention,
		})
		gate = payment.NewGate(opts.Payments, map[string]payment.Provider{payment.LedgerName: ledger})
	}
	return &Server{
		dialogues: dialogues,
		deadlines: deadlines,
		ledger:    ledger, payments: gate, owners: ownerSource{reg},
		store: st, logger: logger, opts: opts, metrics: m, dir: dir, routines: routines, hub: h, shadows: shadows,
		inbound: inbound.New(st, dir, routines, h, model, shadows, neg, inbound.Options{
			ConversationTTL: opts.ConversationTTL, MaxConversationsPerPeer: opts.MaxConversationsPerPeer,
			PeerDialects: opts.PeerDialects, Now: opts.Now, Logger: logger, Metrics: m,
		}),
		outbound: outbound.New(client, dir, routines, shadows, model, st, neg, outbound.Options{
			PublicURL: opts.PublicURL, Timeout: opts.SendTimeout, Retries: opts.SendRetries,
			MaxListed: opts.SendMaxListed, MaxJudge: opts.SendMaxJudge, CacheTTL: opts.CacheTTL,
			Now: opts.Now, Logger: logger, Metrics: m,
		}),
	}
}

// Sweep removes conversations that expired more than a day ago, keeping
// recent ones as tombstones so that late follow-ups get "Conversation
// expired" rather than 404. It also forgets the day-old request_ids of
// network sends and of CreatePayment, and removes the dialogues closed longer than
// DialogueRetention ago, the payments not reserved and unchanged for
// PaymentRetention, and the spend records of the UTC days that ended
// PaymentRetention ago (never today's or yesterday's). Each removes at
// most sweep.Batch per transaction.
// app runs it periodically.
func (s *Server) Sweep(ctx context.Context) (int, error) {
	n, err := sweep.InBatches(ctx, s.opts.Now().Add(-24*time.Hour), s.store.SweepConversations)
	if s.dialogues != nil {
		_, rerr := s.dialogues.SweepRequests(ctx)
		_, derr := s.dialogues.SweepDialogues(ctx)
		err = errors.Join(err, rerr, derr)
	}
	if s.ledger != nil {
		_, perr := s.ledger.Sweep(ctx)
		err = errors.Join(err, perr)
	}
	return n, err
}

// Collectors returns the server's metrics, for the app to register on the
// server it mounts this one on (Options.Metrics nil).
func (s *Server) Collectors() []prometheus.Collector { return s.metrics.Collectors() }

// Start hands the server the channel that closes when a graceful stop
// begins (serve.Server.Stopping): every SDK agent's stream and mailbox
// stream then ends. It replaces Options.Stopping. Call it before serving.
func (s *Server) Start(stopping <-chan struct{}) {
	s.opts.Stopping = stopping
	s.hub.Start(stopping)
}

// StopShadows cancels the shadow runs in flight and waits for them to end;
// later calls start none. The app calls it before closing the store.
func (s *Server) StopShadows() { s.shadows.Stop() }

// Deliver answers one envelope in process: what the Agora HTTP routes call
// in `parley serve`, with no proto in between.
func (s *Server) Deliver(ctx context.Context, e inbound.Envelope) (inbound.Reply, error) {
	return s.inbound.Deliver(ctx, e), nil
}
