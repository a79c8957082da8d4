package auth

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/parleyhq/parley/platform/grpcerr"
)

// Domain is the ErrorInfo domain of refusals.
const Domain = "auth.parley.dev"

// Reasons (ErrorInfo.reason) of refusals.
const (
	ReasonMissing     = "CREDENTIAL_MISSING"
	ReasonMalformed   = "CREDENTIAL_MALFORMED"
	ReasonInvalid     = "CREDENTIAL_INVALID"
	ReasonRateLimited = "AUTH_RATE_LIMITED"
	ReasonKind        = "CALLER_KIND_NOT_ALLOWED"
	ReasonNotOwner    = "RESOURCE_NOT_OWNED"
	ReasonNoPolicy    = "NO_POLICY_ENTRY"
)

// Verifier turns a client or agent key into the Principal it identifies.
// It fails with ErrInvalidCredential for unknown, revoked and malformed
// keys, and with another error when it cannot tell (a registry outage).
type Verifier interface {
	VerifyKey(ctx context.Context, secret string) (Principal, error)
}

// VerifierFunc adapts a function to Verifier.
type VerifierFunc func(ctx context.Context, secret string) (Principal, error)

// VerifyKey calls f.
func (f VerifierFunc) VerifyKey(ctx context.Context, secret string) (Principal, error) {
	return f(ctx, secret)
}

// Options configure an Authenticator.
type Options struct {
	// OperatorToken is the operator's credential; empty means nobody is
	// the operator.
	OperatorToken string
	// Verifier checks keys; nil refuses every key until SetVerifier.
	Verifier Verifier
	// Policy says who may call what; calls without an entry are refused.
	Policy Policy
	// Logger receives one warning per refusal.
	Logger *slog.Logger
	// FailRate and FailBurst limit failed authentications per remote
	// address: past the burst, calls from that address get
	// RESOURCE_EXHAUSTED (HTTP 429) [1 per second, burst 20].
	FailRate  float64
	FailBurst int
	// Recheck is how often an open stream's key is verified again, so
	// that a revoked key ends it [2s].
	Recheck time.Duration
	// Now is the clock of the rate limiter [time.Now].
	Now func() time.Time
}

// Authenticator checks calls against the policy. It is safe for
// concurrent use.
type Authenticator struct {
	opts     Options
	verifier atomic.Pointer[Verifier]
	failures *Limiter
	routes   map[string]gatewayRoute // by "VERB /gateway/pattern"
	operator [32]byte                // HashSecret(opts.OperatorToken), when set

	outageMu         sync.Mutex // guards outageLogged and outageSuppressed
	outageLogged     time.Time  // when the last outage warning was written
	outageSuppressed int        // outage warnings left out since then
}

// outageLogInterval is the least time between two "key verification
// failed" warnings: an outage refuses every keyed call, and one line per
// call would flood the log.
const outageLogInterval = 10 * time.Second

// New returns an Authenticator.
func New(opts Options) *Authenticator {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.FailRate <= 0 {
		opts.FailRate = 1
	}
	if opts.FailBurst <= 0 {
		opts.FailBurst = 20
	}
	if opts.Recheck <= 0 {
		opts.Recheck = 2 * time.Second
	}
	a := &Authenticator{opts: opts, failures: NewLimiter(opts.FailRate, opts.FailBurst, opts.Now), routes: gatewayRoutes()}
	if opts.OperatorToken != "" {
		a.operator = HashSecret(opts.OperatorToken)
	}
	if opts.Verifier != nil {
		a.SetVerifier(opts.Verifier)
	}
	return a
}

// SetVerifier replaces the key verifier. The all-in-one server builds the
// Authenticator before the registry that verifies keys, then sets it.
func (a *Authenticator) SetVerifier(v Verifier) { a.verifier.Store(&v) }

// SetVerifierIfUnset sets v unless a verifier is set.
func (a *Authenticator) SetVerifierIfUnset(v Verifier) { a.verifier.CompareAndSwap(nil, &v) }

// ShareFailures keeps the failed-authentication limits in b, so that they
// hold across the replicas of a service (see Limiter.Share).
func (a *Authenticator) ShareFailures(b SharedBuckets) {
	a.failures.Share("auth.failures", b, a.opts.Logger)
}

// OperatorToken returns the operator token, for in-process clients.
func (a *Authenticator) OperatorToken() string { return a.opts.OperatorToken }

// Policy returns the policy the Authenticator enforces.
func (a *Authenticator) Policy() Policy { return a.opts.Policy }

// call is one call being checked.
type call struct {
	method   string // full gRPC method or HTTP route pattern
	header   string // the authorization header value, never logged
	remote   string
	resource func(field string) string
	// forwarded is the ForwardedCallerHeader value (gRPC only), and
	// verifiedPeer whether the connection carries a verified client
	// certificate.
	forwarded    string
	verifiedPeer bool
}

// check authenticates and authorises c. It returns the principal or a
// status error: UNAUTHENTICATED, PERMISSION_DENIED or RESOURCE_EXHAUSTED.
// Refusals are logged here, with the method, the principal and the
// reason, never the credential.
func (a *Authenticator) check(ctx context.Context, c call) (Principal, error) {
	rule, ok := a.opts.Policy[c.method]
	if !ok {
		return Principal{}, a.refuse(ctx, c, Principal{Kind: Anonymous}, codes.PermissionDenied, ReasonNoPolicy, c.method+" has no access policy entry, so nobody may call it")
	}
	return a.checkRule(ctx, c, rule)
}

// checkRule is check against a given rule.
func (a *Authenticator) checkRule(ctx context.Context, c call, rule Rule) (Principal, error) {
	p, err := a.authenticate(ctx, c)
	if err != nil {
		return Principal{}, err
	}
	if rule.Allow&p.Kind == 0 {
		if p.Kind == Anonymous {
			return Principal{}, a.refuse(ctx, c, p, codes.Unauthenticated, ReasonMissing, c.method+" needs a credential: send 'authorization: Bearer <key>'")
		}
		return Principal{}, a.refuse(ctx, c, p, codes.PermissionDenied, ReasonKind, "callers with "+p.Kind.String()+" credentials may not call "+c.method)
	}
	if rule.Resource != "" && p.Kind != Operator {
		res := c.resource(rule.Resource)
		if !p.Owns(res) {
			return Principal{}, a.refuse(ctx, c, p, codes.PermissionDenied, ReasonNotOwner, p.String()+" may not act on "+quoteResource(res))
		}
	}
	return p, nil
}

// authenticate turns the header into a principal: Anonymous without one.
func (a *Authenticator) authenticate(ctx context.Context, c call) (Principal, error) {
	if c.forwarded != "" {
		return a.forwarded(ctx, c)
	}
	if c.header == "" {
		return Principal{Kind: Anonymous}, nil
	}
	if a.failures.Exhausted(ctx, c.remote) {
		return Principal{}, a.refuse(ctx, c, Principal{Kind: Anonymous}, codes.ResourceExhausted, ReasonRateLimited, "too many failed authentications from this address; wait and retry with a valid credential")
	}
	token, ok := bearer(c.header)
	if !ok {
		return Principal{}, a.fail(ctx, c, ReasonMalformed, "the authorization header must be 'Bearer <key>' with a parley_ck_, parley_ak_ or parley_op_ credential of at most 256 characters")
	}
	if strings.HasPrefix(token, OperatorPrefix) {
		if a.opts.OperatorToken != "" && SameHash(HashSecret(token), a.operator) {
			return Principal{Kind: Operator}, nil
		}
		return Principal{}, a.fail(ctx, c, ReasonInvalid, "the operator token is not valid")
	}
	if _, _, ok := ParseKey(token); !ok {
		return Principal{}, a.fail(ctx, c, ReasonMalformed, "the credential is not a Parley key: keys start with parley_ck_ or parley_ak_")
	}
	v := a.verifier.Load()
	if v == nil {
		return Principal{}, a.fail(ctx, c, ReasonInvalid, "this server checks no keys; use the operator token")
	}
	p, err := (*v).VerifyKey(ctx, token)
	switch {
	case errors.Is(err, ErrInvalidCredential):
		return Principal{}, a.fail(ctx, c, ReasonInvalid, "the key is unknown or revoked")
	case err != nil:
		a.logOutage(ctx, c, errText(err, token))
		return Principal{}, grpcerr.New(codes.Unavailable, "keys cannot be checked right now; retry shortly", "AUTH_UNAVAILABLE", Domain, nil)
	}
	return p, nil
}

// logOutage warns that keys cannot be checked, at most once per
// outageLogInterval, counting the warnings left out in between.
func (a *Authenticator) logOutage(ctx context.Context, c call, errText string) {
	now := time.Now()
	if a.opts.Now != nil {
		now = a.opts.Now()
	}
	a.outageMu.Lock()
	if !a.outageLogged.IsZero() && now.Sub(a.outageLogged) < outageLogInterval {
		a.outageSuppressed++
		a.outageMu.Unlock()
		return
	}
	suppressed := a.outageSuppressed
	a.outageLogged, a.outageSuppressed = now, 0
	a.outageMu.Unlock()
	a.opts.Logger.WarnContext(ctx, "key verification failed; refusing keyed calls as unavailable", slog.String("method", c.method), slog.String("err", errText), slog.Int("suppressed", suppressed), slog.String("interval", outageLogInterval.String()))
}

// fail refuses an invalid credential and counts it against the address.
func (a *Authenticator) fail(ctx context.Context, c call, reason, msg string) error {
	a.failures.Allow(ctx, c.remote)
	return a.refuse(ctx, c, Principal{Kind: Anonymous}, codes.Unauthenticated, reason, msg)
}

func (a *Authenticator) refuse(ctx context.Context, c call, p Principal, code codes.Code, reason, msg string) error {
	a.opts.Logger.WarnContext(ctx, "call refused", slog.String("method", c.method), slog.String("principal", p.String()), slog.String("reason", reason), slog.String("remote", c.remote))
	return grpcerr.New(code, msg, reason, Domain, nil)
}

// bearer extracts the token of "Bearer <token>", refusing oversized or
// oddly shaped values.
func bearer(h string) (string, bool) {
	if len(h) > len("Bearer ")+MaxTokenSize {
		return "", false
	}
	scheme, token, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" || strings.ContainsAny(token, " \t\r\n") {
		return "", false
	}
	return token, true
}

// errText is err's message with token removed, in case a verifier echoed
// it.
func errText(err error, token string) string {
	return strings.ReplaceAll(err.Error(), token, "[credential]")
}

func quoteResource(r string) string {
	if r == "" {
		return "an unnamed resource (name one you own)"
	}
	if len(r) > 200 {
		r = r[:200] + "…"
	}
	return r
}
