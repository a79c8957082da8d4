// Package config loads the negotiator's configuration from flags, with
// PARLEY_* environment variables as fallbacks.
package config

import (
	"errors"
	"flag"
	"fmt"
	"net/url"
	"time"

	"github.com/parleyhq/parley/platform/envflag"
	"github.com/parleyhq/parley/platform/serve"
	"github.com/parleyhq/parley/services/negotiator/internal/ledger"
	"github.com/parleyhq/parley/services/negotiator/internal/negotiation"
)

// LLM providers.
const (
	ProviderNone      = ""
	ProviderOpenAI    = "openai"
	ProviderAnthropic = "anthropic"
)

// LLM is the LLM configuration. APIKey is a secret: it has no default and
// is never logged (String redacts it).
type LLM struct {
	Provider string
	BaseURL  string
	Model    string
	APIKey   string
	// Per-role models; Model when empty.
	ModelNegotiation, ModelProgramming, ModelChecking, ModelConversation string
	// Structured is the OpenAI-compatible JSON mode: json_schema,
	// json_object or off.
	Structured    string
	Timeout       time.Duration
	MaxRetries    int
	MaxConcurrent int
	// BaseBackoff is the first retry's backoff ceiling; it doubles each
	// retry up to MaxBackoff.
	BaseBackoff, MaxBackoff time.Duration
	// Prices are extra "model=in/out" prices in USD per 1M tokens.
	Prices string
	// Daily budgets in USD; zero means none.
	BudgetAgentUSD, BudgetPeerUSD float64
}

// String describes the configuration without the key.
func (l LLM) String() string {
	key := "unset"
	if l.APIKey != "" {
		key = "set"
	}
	return fmt.Sprintf("provider=%q base_url=%q model=%q api_key=%s", l.Provider, l.BaseURL, l.Model, key)
}

// Config is the negotiator's configuration.
type Config struct {
	serve.Flags

	LLM LLM
	// NegotiationMaxRounds caps the messages of one negotiation.
	NegotiationMaxRounds int
	// Thresholds are per-(task, target) overrides, "task@target=3/5/10/5;...".
	Thresholds string
	// RoutineShadowCalls is how many agreeing shadow calls promote an
	// LLM-written routine.
	RoutineShadowCalls int
	// RegistryAddr is the registry gRPC address, asked to check client
	// and agent keys (one-service binary only; `parley serve` checks them
	// in-process); empty: only the operator token is accepted.
	RegistryAddr string
}

// RegisterFlags adds the negotiator's own flags (not the shared serving flags)
// to fs. The all-in-one `parley serve` calls it too, so names must not clash
// with other services' flags.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.LLM.Provider, "llm-provider", "", "LLM provider: openai (any OpenAI-compatible chat-completions API: OpenAI, Ollama, vLLM, llama.cpp, LiteLLM) or anthropic; empty: no LLM, only deterministic paths")
	fs.StringVar(&c.LLM.BaseURL, "llm-base-url", "", "LLM API root; default https://api.openai.com/v1 (openai) or https://api.anthropic.com (anthropic)")
	fs.StringVar(&c.LLM.Model, "llm-model", "", "default LLM model (required with --llm-provider)")
	fs.StringVar(&c.LLM.APIKey, "llm-api-key", "", "LLM API key (secret; prefer PARLEY_LLM_API_KEY)")
	fs.StringVar(&c.LLM.ModelNegotiation, "llm-model-negotiation", "", "model for negotiation turns (default --llm-model)")
	fs.StringVar(&c.LLM.ModelProgramming, "llm-model-programming", "", "model for writing routines (default --llm-model)")
	fs.StringVar(&c.LLM.ModelChecking, "llm-model-checking", "", "model for suitability checks (default --llm-model)")
	fs.StringVar(&c.LLM.ModelConversation, "llm-model-conversation", "", "model for natural-language replies and parsing (default --llm-model)")
	fs.StringVar(&c.LLM.Structured, "llm-structured", "json_schema", "how to ask an OpenAI-compatible server for JSON: json_schema, json_object or off")
	fs.DurationVar(&c.LLM.Timeout, "llm-timeout", 60*time.Second, "time-out of one LLM request attempt")
	fs.IntVar(&c.LLM.MaxRetries, "llm-max-retries", 3, "retries on HTTP 429, 5xx and transport errors, with exponential backoff and jitter")
	fs.IntVar(&c.LLM.MaxConcurrent, "llm-max-concurrent", 8, "LLM requests in flight at most")
	fs.DurationVar(&c.LLM.BaseBackoff, "llm-base-backoff", 500*time.Millisecond, "backoff ceiling of the first LLM retry; it doubles each retry")
	fs.DurationVar(&c.LLM.MaxBackoff, "llm-max-backoff", 20*time.Second, "largest wait between LLM retries, Retry-After included")
	fs.StringVar(&c.LLM.Prices, "llm-prices", "", "extra model prices, model=in/out USD per 1M tokens, comma-separated (defaults: gpt-4o=5/15, llama-3-405b=5/10, gemini-1.5-pro=3.5/10.5)")
	fs.Float64Var(&c.LLM.BudgetAgentUSD, "llm-budget-agent-usd", 0, "daily LLM budget per agent in USD; 0: none")
	fs.Float64Var(&c.LLM.BudgetPeerUSD, "llm-budget-peer-usd", 0, "daily LLM budget per peer in USD; 0: none")
	fs.IntVar(&c.NegotiationMaxRounds, "negotiation-max-rounds", 10, "messages one negotiation may take, both sides together")
	fs.StringVar(&c.Thresholds, "negotiation-thresholds", "", "per-(task, target) thresholds, task@target=lookup/negotiate/request[/routine];...; * matches any (defaults 3/5/10/5)")
	fs.IntVar(&c.RoutineShadowCalls, "routine-shadow-calls", 5, "agreeing shadow calls before an LLM-written routine is promoted")
}

// Validate reports every bad value at once.
func (c *Config) Validate() error {
	var errs []error
	switch c.LLM.Provider {
	case ProviderNone:
	case ProviderOpenAI, ProviderAnthropic:
		if c.LLM.Model == "" {
			errs = append(errs, errors.New("--llm-model is required with --llm-provider"))
		}
	default:
		errs = append(errs, fmt.Errorf("--llm-provider %q: want openai, anthropic or empty", c.LLM.Provider))
	}
	if c.LLM.BaseURL != "" {
		if u, err := url.Parse(c.LLM.BaseURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("--llm-base-url %q: want an http or https URL", c.LLM.BaseURL))
		}
	}
	switch c.LLM.Structured {
	case "json_schema", "json_object", "off":
	default:
		errs = append(errs, fmt.Errorf("--llm-structured %q: want json_schema, json_object or off", c.LLM.Structured))
	}
	if c.LLM.Timeout <= 0 {
		errs = append(errs, errors.New("--llm-timeout must be positive"))
	}
	if c.LLM.MaxRetries < 0 {
		errs = append(errs, errors.New("--llm-max-retries must not be negative"))
	}
	if c.LLM.MaxConcurrent <= 0 {
		errs = append(errs, errors.New("--llm-max-concurrent must be positive"))
	}
	if c.LLM.BaseBackoff <= 0 {
		errs = append(errs, errors.New("--llm-base-backoff must be positive"))
	}
	if c.LLM.MaxBackoff <= 0 {
		errs = append(errs, errors.New("--llm-max-backoff must be positive"))
	}
	if c.LLM.BudgetAgentUSD < 0 || c.LLM.BudgetPeerUSD < 0 {
		errs = append(errs, errors.New("--llm-budget-agent-usd and --llm-budget-peer-usd must not be negative"))
	}
	if prices, err := ledger.ParsePrices(c.LLM.Prices, ledger.DefaultPrices()); err != nil {
		errs = append(errs, fmt.Errorf("--llm-prices: %w", err))
	} else if c.LLM.Provider != ProviderNone && (c.LLM.BudgetAgentUSD > 0 || c.LLM.BudgetPeerUSD > 0) {
		errs = append(errs, unpriced(c.LLM, prices)...)
	}
	if _, err := negotiation.ParseThresholds(c.Thresholds); err != nil {
		errs = append(errs, fmt.Errorf("--negotiation-thresholds: %w", err))
	}
	if c.NegotiationMaxRounds < 2 {
		errs = append(errs, errors.New("--negotiation-max-rounds must be at least 2"))
	}
	if c.RoutineShadowCalls < 0 {
		errs = append(errs, errors.New("--routine-shadow-calls must not be negative"))
	}
	return errors.Join(errs...)
}

// unpriced reports every configured model with no price: a budget would
// count its calls at 0 and never stop them.
func unpriced(l LLM, prices ledger.Prices) []error {
	var errs []error
	for _, m := range []struct{ flag, model string }{
		{"--llm-model", l.Model}, {"--llm-model-negotiation", l.ModelNegotiation}, {"--llm-model-programming", l.ModelProgramming},
		{"--llm-model-checking", l.ModelChecking}, {"--llm-model-conversation", l.ModelConversation},
	} {
		if m.model == "" {
			continue
		}
		if _, ok := prices.Lookup(m.model); !ok {
			errs = append(errs, fmt.Errorf("%s %q has no price, so an LLM budget cannot count its calls: add it with --llm-prices %q (USD per 1M tokens in/out)", m.flag, m.model, m.model+"=IN/OUT"))
		}
	}
	return errs
}

// doc is the one-service binary's --help.
var doc = envflag.Doc{
	Usage:   "negotiator [flags]",
	Summary: "Run the Parley negotiator alone: LLM providers, negotiation, suitability verdicts, routine synthesis and the cost ledger. It calls no other service.",
	Examples: []string{
		"negotiator --data /var/lib/parley --operator-token-file /run/parley/operator.token",
		"PARLEY_LLM_PROVIDER=openai PARLEY_LLM_BASE_URL=http://127.0.0.1:11434/v1 PARLEY_LLM_MODEL=llama3.2 negotiator --operator-token-file ./operator.token",
	},
	Prefix: "PARLEY_",
}

// Load parses the one-service binary's flags from args, falling back to the
// environment (PARLEY_GRPC_ADDR, PARLEY_DATA, PARLEY_LLM_PROVIDER, ...).
func Load(args []string, getenv func(string) string) (Config, error) {
	var c Config
	fs := flag.NewFlagSet("negotiator", flag.ContinueOnError)
	c.Flags.Register(fs, ":9090", ":8080", "/var/lib/parley")
	c.RegisterFlags(fs)
	fs.StringVar(&c.RegistryAddr, "registry-addr", "dns:///registry:9090", "registry gRPC address, asked to check client and agent keys (with --auth); empty: only the operator token is accepted")
	fs.String("dispatcher-addr", "", "deprecated and ignored: the negotiator does not call the dispatcher")
	pos, err := doc.ParseArgs(fs, args, getenv)
	if err != nil {
		return c, err
	}
	if len(pos) > 0 {
		return c, fmt.Errorf("negotiator takes no arguments, got %q", pos)
	}
	return c, c.Validate()
}
