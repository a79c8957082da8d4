// Package app assembles the negotiator: its store, LLM client, cost ledger,
// gRPC server, gateway routes, metrics, health and readiness. Both the
// one-service binary and `parley serve` use it.
package app

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	negotiatorv1 "github.com/parleyhq/parley/gen/parley/negotiator/v1"
	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/auth"
	"github.com/parleyhq/parley/platform/pgdb"
	"github.com/parleyhq/parley/platform/serve"
	"github.com/parleyhq/parley/services/negotiator/config"
	"github.com/parleyhq/parley/services/negotiator/internal/ledger"
	"github.com/parleyhq/parley/services/negotiator/internal/llm"
	"github.com/parleyhq/parley/services/negotiator/internal/negotiation"
	"github.com/parleyhq/parley/services/negotiator/internal/server"
	"github.com/parleyhq/parley/services/negotiator/internal/store"
	"github.com/parleyhq/parley/services/negotiator/internal/store/boltstore"
	"github.com/parleyhq/parley/services/negotiator/internal/store/pgstore"
)

// ServiceName is the negotiator's gRPC service name, also its health name.
const ServiceName = "parley.negotiator.v1.NegotiatorService"

// App is an assembled negotiator.
type App struct {
	cfg     config.Config
	logger  *slog.Logger
	store   store.Store
	metrics *ledger.Metrics
	server  *server.Server
	// registry checks keys when the negotiator runs alone; see
	// CheckKeysAt.
	registry registryv1.RegistryServiceClient
}

// CheckKeysAt makes the negotiator accept client and agent keys, checked
// by the registry over conn, when it runs in its own process. That is
// its one call to another service; the registry calls no service back.
func (a *App) CheckKeysAt(conn grpc.ClientConnInterface) {
	a.registry = registryv1.NewRegistryServiceClient(conn)
}

// New opens the store (negotiator.db in the data directory, or PostgreSQL
// with cfg.DatabaseURL) and builds the server. It does not listen. The
// negotiator calls no other service: the dispatcher calls it, relays
// negotiation messages, registers agreed PDs and runs the checks of the
// routines it writes (issue 9: no call cycle).
func New(cfg config.Config, logger *slog.Logger) (*App, error) {
	prices, err := ledger.ParsePrices(cfg.LLM.Prices, ledger.DefaultPrices())
	if err != nil {
		return nil, err
	}
	thresholds, err := negotiation.ParseThresholds(cfg.Thresholds)
	if err != nil {
		return nil, err
	}
	st, err := openStore(cfg, logger)
	if err != nil {
		return nil, err
	}
	client := NewLLMClient(cfg.LLM)
	if client.Configured() {
		logger.Info("llm configured", slog.String("provider", cfg.LLM.Provider), slog.String("model", cfg.LLM.Model))
	} else {
		logger.Info("no llm configured; only deterministic negotiation and routines are available")
	}
	metrics := ledger.NewMetrics()
	led := ledger.New(client, st, prices, ledger.Budgets{
		PerAgent: int64(cfg.LLM.BudgetAgentUSD * 1e6),
		PerPeer:  int64(cfg.LLM.BudgetPeerUSD * 1e6),
	}, metrics, logger)
	srv := server.New(st, led, logger, serverOptions(cfg, thresholds))
	return &App{cfg: cfg, logger: logger, store: st, metrics: metrics, server: srv}, nil
}

// serverOptions copies cfg into the server's options verbatim: the config
// owns every default and server.New fills in none.
func serverOptions(cfg config.Config, thresholds negotiation.ThresholdTable) server.Options {
	return server.Options{
		MaxRounds:   cfg.NegotiationMaxRounds,
		ShadowCalls: cfg.RoutineShadowCalls,
		Thresholds:  thresholds,
	}
}

// openStore opens PostgreSQL when cfg.DatabaseURL is set, else
// negotiator.db in the data directory.
func openStore(cfg config.Config, logger *slog.Logger) (store.Store, error) {
	if cfg.DatabaseURL == "" {
		return boltstore.Open(cfg.DataDir, 2*time.Second)
	}
	ctx, cancel := context.WithTimeout(context.Background(), pgdb.OpenTimeout)
	defer cancel()
	return pgstore.Open(ctx, cfg.DatabaseURL, pgstore.Schema, logger)
}

// NewLLMClient builds the LLM client the configuration describes; an
// unconfigured client when no provider is set. The key is passed to the
// provider and nowhere else.
func NewLLMClient(c config.LLM) *llm.Client {
	hc := &http.Client{}
	var p llm.Provider
	switch c.Provider {
	case config.ProviderOpenAI:
		base := c.BaseURL
		if base == "" {
			base = "https://api.openai.com/v1"
		}
		p = &llm.OpenAI{BaseURL: base, APIKey: c.APIKey, Structured: llm.StructuredMode(c.Structured), HTTP: hc}
	case config.ProviderAnthropic:
		base := c.BaseURL
		if base == "" {
			base = "https://api.anthropic.com"
		}
		p = &llm.Anthropic{BaseURL: base, APIKey: c.APIKey, HTTP: hc}
	}
	return llm.NewClient(p, llmOptions(c))
}

// llmOptions copies c into the LLM client's options verbatim: the config
// owns every default and llm.NewClient fills in none.
func llmOptions(c config.LLM) llm.Options {
	return llm.Options{
		DefaultModel: c.Model,
		Models: map[llm.Role]string{
			llm.RoleNegotiation:  c.ModelNegotiation,
			llm.RoleProgramming:  c.ModelProgramming,
			llm.RoleChecking:     c.ModelChecking,
			llm.RoleConversation: c.ModelConversation,
		},
		Timeout:       c.Timeout,
		MaxRetries:    c.MaxRetries,
		MaxConcurrent: c.MaxConcurrent,
		BaseBackoff:   c.BaseBackoff,
		MaxBackoff:    c.MaxBackoff,
	}
}

// Register mounts the negotiator on s: gRPC service, gateway handlers,
// metrics, health name and readiness checks.
func (a *App) Register(ctx context.Context, s *serve.Server) error {
	negotiatorv1.RegisterNegotiatorServiceServer(s, a.server)
	if err := negotiatorv1.RegisterNegotiatorServiceHandlerServer(ctx, s.Gateway, a.server); err != nil {
		return err
	}
	for _, c := range a.metrics.Collectors() {
		if err := s.Registry().Register(c); err != nil {
			return err
		}
	}
	if a.registry != nil {
		s.FallbackKeyVerifier(auth.Introspector(func(ctx context.Context, secret string) (proto.Message, error) {
			return a.registry.IntrospectKey(ctx, &registryv1.IntrospectKeyRequest{Secret: secret})
		}, auth.IntrospectionTTL, nil))
	}
	s.HealthService(ServiceName)
	s.AddReadinessCheck("negotiator-store", a.store.Ping)
	if db := pgdb.Of(a.store); db != nil {
		s.ShareAuthLimits(db) // failed authentications count on every replica
	}
	return nil
}

// Close closes the store.
func (a *App) Close() error { return a.store.Close() }

// RegisterGateway mounts the negotiator's REST routes on s for a gateway process
// that reaches the negotiator over conn instead of in-process.
func RegisterGateway(ctx context.Context, s *serve.Server, conn *grpc.ClientConn) error {
	return negotiatorv1.RegisterNegotiatorServiceHandler(ctx, s.Gateway, conn)
}
