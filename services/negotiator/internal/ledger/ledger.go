// Package ledger puts every LLM call on the books: it checks the agent's
// and the peer's daily budgets before the call (denial of wallet), then
// records tokens, latency, model, role, agent and peer in the store, prices
// the call and updates Prometheus metrics.
//
// Budgets are checked against what is already recorded, so calls in flight
// at the same time may overshoot a budget by their own cost; the next call
// is refused.
package ledger

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	negotiatorv1 "github.com/parleyhq/parley/gen/parley/negotiator/v1"
	"github.com/parleyhq/parley/services/negotiator/internal/llm"
	"github.com/parleyhq/parley/services/negotiator/internal/store"
)

// ErrBudgetExhausted is wrapped by *BudgetError.
var ErrBudgetExhausted = errors.New("LLM budget exhausted")

// BudgetError says whose budget is spent.
type BudgetError struct {
	// Scope is "agent" or "peer".
	Scope string
	Who   string
	// Spent and Limit are today's micro-USD.
	Spent, Limit int64
}

func (e *BudgetError) Error() string {
	return fmt.Sprintf("%s %q has spent its daily LLM budget (%d of %d micro-USD)", e.Scope, e.Who, e.Spent, e.Limit)
}

func (e *BudgetError) Unwrap() error { return ErrBudgetExhausted }

// Budgets are daily (UTC) spending limits in micro-USD; zero means none.
type Budgets struct {
	PerAgent int64
	PerPeer  int64
}

// Call says on whose behalf an LLM call is made.
type Call struct {
	Agent     string
	Peer      string
	Operation string
}

// Ledger meters an llm.Client.
type Ledger struct {
	client  *llm.Client
	store   store.Store
	prices  Prices
	budgets Budgets
	metrics *Metrics
	logger  *slog.Logger
	now     func() time.Time
	// warned holds the unpriced models already logged.
	warned sync.Map
}

// New returns a Ledger. client may be unconfigured; metrics and logger may
// be nil.
func New(client *llm.Client, st store.Store, prices Prices, budgets Budgets, metrics *Metrics, logger *slog.Logger) *Ledger {
	if metrics == nil {
		metrics = NewMetrics()
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Ledger{client: client, store: st, prices: prices, budgets: budgets, metrics: metrics, logger: logger, now: time.Now}
}

// Configured reports whether an LLM is configured.
func (l *Ledger) Configured() bool { return l.client.Configured() }

func dayKey(t time.Time, scope, who string) string {
	return "day/" + t.UTC().Format(time.DateOnly) + "/" + scope + "/" + who
}

// AgentKey is the totals key of one agent's lifetime spending.
func AgentKey(agent string) string { return "agent/" + agent }

// AllKey is the totals key of all spending.
const AllKey = "all"

// CheckBudget returns a *BudgetError when the agent's or the peer's budget
// for today is spent.
func (l *Ledger) CheckBudget(ctx context.Context, c Call) error {
	now := l.now()
	for _, b := range []struct {
		scope, who string
		limit      int64
	}{{"agent", c.Agent, l.budgets.PerAgent}, {"peer", c.Peer, l.budgets.PerPeer}} {
		if b.limit <= 0 {
			continue
		}
		t, err := l.store.Totals(ctx, dayKey(now, b.scope, b.who))
		if err != nil {
			return err
		}
		if t.GetCostMicroUsd() >= b.limit {
			return &BudgetError{Scope: b.scope, Who: b.who, Spent: t.GetCostMicroUsd(), Limit: b.limit}
		}
	}
	return nil
}

// Complete checks budgets, calls the LLM and records the call. It returns
// llm.ErrNotConfigured, a *BudgetError, the provider's error, or the
// response. A call the provider answered is recorded even if recording
// fails; that error is returned with the response.
func (l *Ledger) Complete(ctx context.Context, c Call, req llm.Request) (llm.Response, error) {
	role := string(req.Role)
	if !l.client.Configured() {
		l.metrics.calls.WithLabelValues(role, "not_configured").Inc()
		return llm.Response{}, llm.ErrNotConfigured
	}
	if err := l.CheckBudget(ctx, c); err != nil {
		l.metrics.calls.WithLabelValues(role, "budget_exhausted").Inc()
		return llm.Response{}, err
	}
	start := l.now()
	resp, err := l.client.Complete(ctx, req)
	latency := l.now().Sub(start)
	if err != nil {
		l.metrics.calls.WithLabelValues(role, "error").Inc()
		return llm.Response{}, err
	}
	l.metrics.calls.WithLabelValues(role, "ok").Inc()
	price, priced := l.prices.Lookup(resp.Model)
	if !priced {
		// Costs 0 for the budgets: config.Validate refuses unpriced
		// configured models when a budget is set, but a provider may answer
		// with a model name no price matches.
		l.metrics.unpriced.WithLabelValues(resp.Model).Inc()
		if _, seen := l.warned.LoadOrStore(resp.Model, true); !seen {
			l.logger.WarnContext(ctx, "llm model has no price; its calls cost 0 and budgets do not count them (set --llm-prices)", slog.String("model", resp.Model))
		}
	}
	cost := price.CostMicroUSD(resp.PromptTokens, resp.CompletionTokens)
	l.metrics.tokens.WithLabelValues(role, resp.Model, "prompt").Add(float64(resp.PromptTokens))
	l.metrics.tokens.WithLabelValues(role, resp.Model, "completion").Add(float64(resp.CompletionTokens))
	l.metrics.cost.WithLabelValues(role, resp.Model).Add(float64(cost) / 1e6)
	l.metrics.seconds.WithLabelValues(role, resp.Model).Observe(latency.Seconds())
	end := l.now()
	keys := []string{AllKey, AgentKey(c.Agent), dayKey(end, "agent", c.Agent), dayKey(end, "peer", c.Peer)}
	_, recErr := l.store.AppendLedgerEntry(ctx, &negotiatorv1.LedgerEntry{
		Agent:            c.Agent,
		Peer:             c.Peer,
		Role:             role,
		Model:            resp.Model,
		PromptTokens:     resp.PromptTokens,
		CompletionTokens: resp.CompletionTokens,
		CostMicroUsd:     cost,
		Latency:          durationpb.New(latency),
		Operation:        c.Operation,
		CreateTime:       timestamppb.New(end),
	}, keys)
	if recErr != nil {
		return resp, fmt.Errorf("record llm call: %w", recErr)
	}
	return resp, nil
}

// Summary totals the ledger for one agent, or all when agent is empty.
func (l *Ledger) Summary(ctx context.Context, agent string) (*negotiatorv1.CostSummary, error) {
	if agent == "" {
		return l.store.Totals(ctx, AllKey)
	}
	return l.store.Totals(ctx, AgentKey(agent))
}

// Metrics are the ledger's Prometheus collectors, registered by the caller.
type Metrics struct {
	tokens  *prometheus.CounterVec
	cost    *prometheus.CounterVec
	seconds *prometheus.HistogramVec
	calls   *prometheus.CounterVec
	// unpriced counts calls answered by a model with no price.
	unpriced *prometheus.CounterVec
}

// NewMetrics builds the collectors.
func NewMetrics() *Metrics {
	return &Metrics{
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "parley_negotiator_llm_tokens_total",
			Help: "LLM tokens used, by role, model and kind (prompt or completion).",
		}, []string{"role", "model", "kind"}),
		cost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "parley_negotiator_llm_cost_usd_total",
			Help: "LLM cost in USD at the configured prices, by role and model.",
		}, []string{"role", "model"}),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "parley_negotiator_llm_call_seconds",
			Help:    "Wall time of LLM calls, retries included.",
			Buckets: prometheus.ExponentialBuckets(0.05, 2, 12),
		}, []string{"role", "model"}),
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "parley_negotiator_llm_calls_total",
			Help: "LLM calls by role and outcome (ok, error, budget_exhausted, not_configured).",
		}, []string{"role", "outcome"}),
		unpriced: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "parley_negotiator_llm_unpriced_calls_total",
			Help: "LLM calls answered by a model with no configured price (recorded at cost 0), by model.",
		}, []string{"model"}),
	}
}

// Collectors returns the collectors to register.
func (m *Metrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.tokens, m.cost, m.seconds, m.calls, m.unpriced}
}
