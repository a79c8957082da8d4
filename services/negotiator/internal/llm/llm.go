// Package llm talks to large language models: an OpenAI-compatible
// chat-completions client, an Anthropic Messages API client, and Client,
// which adds what every call needs whatever the provider: a model per role,
// a time-out per attempt, retries with exponential backoff and full jitter on
// 429 and 5xx (honouring Retry-After), and a concurrency limit.
//
// Structured output: when a Request carries a JSON Schema, the OpenAI client
// sends response_format json_schema (or json_object, see StructuredMode) and
// the Anthropic client forces a single tool whose input_schema is the schema
// and returns the tool input as the response text. Either way the caller gets
// JSON text it must still validate: providers do not all enforce schemas.
//
// Nothing here records costs or checks budgets; the ledger package wraps a
// Client for that.
package llm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Role is what a call is for. Each role may use its own model.
type Role string

// The roles of LLM calls.
const (
	RoleNegotiation  Role = "negotiation"
	RoleProgramming  Role = "programming"
	RoleChecking     Role = "checking"
	RoleConversation Role = "conversation"
)

// Roles lists every role, in a stable order.
var Roles = []Role{RoleNegotiation, RoleProgramming, RoleChecking, RoleConversation}

// ErrNotConfigured is returned by every call of a Client built without a
// provider.
var ErrNotConfigured = errors.New("no LLM is configured")

// Message is one chat turn.
type Message struct {
	// Role is "user" or "assistant".
	Role    string
	Content string
}

// Request is one completion request.
type Request struct {
	Role     Role
	System   string
	Messages []Message
	// JSONSchema, when set, asks for one JSON object matching it.
	JSONSchema json.RawMessage
	// SchemaName names the schema (OpenAI) or the forced tool (Anthropic);
	// "result" when empty.
	SchemaName string
	// MaxTokens caps the completion; 1024 when zero.
	MaxTokens int
}

// Response is a completion.
type Response struct {
	Text string
	// Model is the model that answered, as the provider reports it (or as
	// requested when it does not).
	Model            string
	PromptTokens     int64
	CompletionTokens int64
}

// Provider is one LLM API.
type Provider interface {
	// Complete sends one request to model. A non-2xx answer is a *HTTPError.
	Complete(ctx context.Context, model string, req Request) (Response, error)
}

// HTTPError is a provider's non-2xx answer.
type HTTPError struct {
	StatusCode int
	// RetryAfter is the parsed Retry-After header; zero when absent.
	RetryAfter time.Duration
	// Message is the provider's error message, at most 512 bytes.
	Message string
}

func (e *HTTPError) Error() string {
	return fmt.Sprintf("llm provider answered HTTP %d: %s", e.StatusCode, e.Message)
}

// Retryable reports whether the request may succeed if sent again.
func (e *HTTPError) Retryable() bool {
	return e.StatusCode == http.StatusTooManyRequests || e.StatusCode >= 500
}

// parseRetryAfter reads a Retry-After header in seconds or as an HTTP date.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil && s >= 0 {
		return time.Duration(s * float64(time.Second))
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

// Options configure a Client. Zero values take the defaults shown.
type Options struct {
	// Models maps a role to its model; DefaultModel is used for the others.
	Models       map[Role]string
	DefaultModel string
	// Timeout bounds each attempt.
	Timeout time.Duration
	// MaxRetries is the number of retries after the first attempt; zero
	// means none (config owns the default).
	MaxRetries int
	// BaseBackoff is the first retry's backoff ceiling; it doubles
	// each retry up to MaxBackoff. A Retry-After header replaces it,
	// capped at MaxBackoff.
	BaseBackoff, MaxBackoff time.Duration
	// MaxConcurrent limits calls in flight.
	MaxConcurrent int
	// Sleep waits between retries; a test seam.
	Sleep func(ctx context.Context, d time.Duration) error
	// Jitter returns a uniform value in [0, n); a test seam.
	Jitter func(n int64) int64
}

// Client is a provider with models per role, time-outs, retries and a
// concurrency limit. A nil *Client, or one built with a nil provider,
// answers every call with ErrNotConfigured.
type Client struct {
	provider Provider
	opts     Options
	sem      chan struct{}
}

// NewClient wraps provider. provider may be nil: no LLM is configured.
// It fills in no limit: Timeout, BaseBackoff, MaxBackoff and MaxConcurrent
// must be positive (config owns their defaults).
func NewClient(provider Provider, opts Options) *Client {
	if opts.Sleep == nil {
		opts.Sleep = sleep
	}
	if opts.Jitter == nil {
		opts.Jitter = rand.Int64N
	}
	return &Client{provider: provider, opts: opts, sem: make(chan struct{}, opts.MaxConcurrent)}
}

// Configured reports whether calls can reach an LLM.
func (c *Client) Configured() bool { return c != nil && c.provider != nil }

// Model returns the model used for role.
func (c *Client) Model(role Role) string {
	if c == nil {
		return ""
	}
	if m := c.opts.Models[role]; m != "" {
		return m
	}
	return c.opts.DefaultModel
}

// Complete sends req with the model of its role, retrying 429 and 5xx
// answers and transport errors. It waits for a concurrency slot first.
func (c *Client) Complete(ctx context.Context, req Request) (Response, error) {
	if !c.Configured() {
		return Response{}, ErrNotConfigured
	}
	select {
	case c.sem <- struct{}{}:
	case <-ctx.Done():
		return Response{}, ctx.Err()
	}
	defer func() { <-c.sem }()
	model := c.Model(req.Role)
	var lastErr error
	for attempt := 0; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, c.opts.Timeout)
		resp, err := c.provider.Complete(actx, model, req)
		cancel()
		if err == nil {
			if resp.Model == "" {
				resp.Model = model
			}
			return resp, nil
		}
		if ctx.Err() != nil {
			return Response{}, ctx.Err()
		}
		lastErr = err
		var he *HTTPError
		if errors.As(err, &he) && !he.Retryable() {
			return Response{}, err
		}
		if attempt >= c.opts.MaxRetries {
			return Response{}, fmt.Errorf("after %d attempts: %w", attempt+1, lastErr)
		}
		if err := c.opts.Sleep(ctx, c.backoff(attempt, he)); err != nil {
			return Response{}, err
		}
	}
}

// backoff is full jitter over an exponentially growing ceiling, unless the
// provider said when to come back.
func (c *Client) backoff(attempt int, he *HTTPError) time.Duration {
	if he != nil && he.RetryAfter > 0 {
		return min(he.RetryAfter, c.opts.MaxBackoff)
	}
	ceiling := c.opts.BaseBackoff << min(attempt, 30)
	if ceiling <= 0 || ceiling > c.opts.MaxBackoff {
		ceiling = c.opts.MaxBackoff
	}
	return time.Duration(c.opts.Jitter(int64(ceiling)) + 1)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func schemaName(req Request) string {
	if req.SchemaName != "" {
		return req.SchemaName
	}
	return "result"
}

func maxTokens(req Request) int {
	if req.MaxTokens > 0 {
		return req.MaxTokens
	}
	return 1024
}
