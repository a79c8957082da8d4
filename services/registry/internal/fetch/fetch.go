// Package fetch downloads protocol documents from protocolSources, hardened
// against server-side request forgery (specs/agora.md, section 12).
//
// A source is a data: URI in one of the two byte-exact forms the reference
// library sends, or an https URL (http only when allowed). Every TCP
// connection goes through platform/egress's dialer, which checks the
// address after DNS resolution and before connect(2) against its one
// Blocked rule, so DNS rebinding and redirects into the internal network
// get nothing. Redirects
// are followed at most MaxRedirects times, each re-checked. Time, size and
// the scheme are capped. No cookies, credentials or proxies are used.
//
// An allowlist of CIDRs or host names lifts the address check for trusted
// destinations, such as a local demo or a test server on loopback. A host
// name on it trusts that name's DNS: whatever it resolves to (rebinding
// included) is dialed, so prefer addresses and CIDRs.
//
// Errors are written for the caller who named the source: they never carry
// resolved addresses or raw network errors, which go to the log.
package fetch

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/parleyhq/parley/platform/egress"
)

// Error classes; every error from Fetch wraps exactly one.
var (
	// ErrMalformed: the source is not a usable URL or data: URI.
	ErrMalformed = errors.New("malformed source")
	// ErrRefused: the destination or scheme is not allowed.
	ErrRefused = errors.New("destination refused")
	// ErrTooLarge: the document exceeds the size limit.
	ErrTooLarge = errors.New("document too large")
	// ErrUnavailable: the fetch failed: network error, time-out, non-200
	// status, too many redirects.
	ErrUnavailable = errors.New("source unavailable")
	// ErrBusy: no fetch slot came free in time (MaxConcurrent or
	// MaxPerHost); the source itself was not tried.
	ErrBusy = errors.New("fetch capacity exhausted")
)

var (
	errHostBusy   = errors.New("host busy")
	errGlobalBusy = errors.New("all busy")
)

// The two data: URI prefixes the Agora reference library sends; any other
// data: URI is malformed.
const (
	DataBase64Prefix  = "data:text/plain;charset=utf-8;base64,"
	DataPercentPrefix = "data:text/plain;charset=utf-8,"
)

// Options configure a Fetcher. New fills in no limit: MaxBytes,
// ConnectTimeout, Timeout, MaxConcurrent and MaxPerHost must be positive
// (config owns their defaults).
type Options struct {
	// MaxBytes caps a document.
	MaxBytes int64
	// AllowHTTP permits plain http sources [false].
	AllowHTTP bool
	// Allow lists trusted destinations exempt from the address check: CIDRs
	// ("127.0.0.0/8"), addresses ("10.1.2.3"), host names
	// ("pd.internal.example") or host:port ("127.0.0.1:8443").
	Allow []string
	// ConnectTimeout bounds each TCP connect and TLS handshake.
	ConnectTimeout time.Duration
	// Timeout bounds one fetch, redirects and body included.
	Timeout time.Duration
	// MaxRedirects caps redirects followed; zero follows none (config owns
	// the default).
	MaxRedirects int
	// MaxConcurrent caps URL fetches in flight; MaxPerHost those to one
	// host, by the source URL's host name. A fetch waits for a slot at
	// most ConnectTimeout (within Timeout), then fails with ErrBusy. data:
	// URIs take no slot.
	MaxConcurrent int
	MaxPerHost    int
	// Logger receives what callers must not see: the address a refused
	// destination resolved to and raw network errors [discard].
	Logger *slog.Logger
	// TLSConfig overrides the TLS client configuration (tests trust their
	// own CA with it); nil uses the system roots.
	TLSConfig *tls.Config
}

// Fetcher fetches sources. It is safe for concurrent use.
type Fetcher struct {
	opts       Options
	allowNets  []netip.Prefix
	allowHosts map[string]bool // lowercase host or host:port
	client     *http.Client
	limit      *limiter
}

// New returns a Fetcher, or an error naming each bad allowlist entry.
func New(opts Options) (*Fetcher, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	f := &Fetcher{opts: opts, allowHosts: map[string]bool{}, limit: newLimiter(opts.MaxConcurrent, opts.MaxPerHost)}
	var errs []error
	for _, e := range opts.Allow {
		e = strings.TrimSpace(e)
		switch {
		case e == "":
		case strings.Contains(e, "/"):
			p, err := netip.ParsePrefix(e)
			if err != nil {
				errs = append(errs, fmt.Errorf("allowlist entry %q is not a CIDR", e))
				continue
			}
			f.allowNets = append(f.allowNets, p.Masked())
		default:
			if a, err := netip.ParseAddr(e); err == nil {
				f.allowNets = append(f.allowNets, netip.PrefixFrom(a, a.BitLen()))
				continue
			}
			f.allowHosts[strings.ToLower(e)] = true
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	checked := &egress.Dialer{Timeout: opts.ConnectTimeout, Allow: f.allowNets}
	trusted := &net.Dialer{Timeout: opts.ConnectTimeout}
	transport := &http.Transport{
		Proxy: nil, // a proxy would dial for us and bypass the address check
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			host, _, _ := net.SplitHostPort(addr)
			if f.allowHosts[strings.ToLower(addr)] || f.allowHosts[strings.ToLower(host)] {
				return trusted.DialContext(ctx, network, addr)
			}
			return checked.DialContext(ctx, network, addr)
		},
		TLSClientConfig:        opts.TLSConfig,
		TLSHandshakeTimeout:    opts.ConnectTimeout,
		ResponseHeaderTimeout:  opts.Timeout,
		MaxResponseHeaderBytes: 64 << 10,
		MaxIdleConns:           32,
		IdleConnTimeout:        30 * time.Second,
		ForceAttemptHTTP2:      true,
	}
	f.client = &http.Client{
		Transport:     transport,
		Timeout:       opts.Timeout,
		CheckRedirect: f.checkRedirect,
	}
	return f, nil
}

// Fetch returns the exact bytes of source, at most MaxBytes of them. Its
// errors are fit for the caller who named source: they never carry the
// address a host name resolved to, nor raw network errors (which may name
// internal hosts or the resolver); those go to the log.
func (f *Fetcher) Fetch(ctx context.Context, source string) ([]byte, error) {
	switch {
	case strings.HasPrefix(source, DataBase64Prefix), strings.HasPrefix(source, DataPercentPrefix):
		return DecodeData(source, f.opts.MaxBytes)
	case hasScheme(source, "data"):
		return nil, fmt.Errorf("data: URI must start with %q or %q: %w", DataBase64Prefix, DataPercentPrefix, ErrMalformed)
	}
	u, err := url.Parse(source)
	if err != nil {
		return nil, fmt.Errorf("not a URL: %w", ErrMalformed)
	}
	if err := f.checkURL(u); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, f.opts.Timeout)
	defer cancel()
	release, err := f.slot(ctx, u)
	if err != nil {
		return nil, err
	}
	defer release()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, fmt.Errorf("not a URL: %w", ErrMalformed)
	}
	req.Header.Set("Accept", "text/plain, */*;q=0.5")
	req.Header.Set("User-Agent", "parley-registry")
	resp, err := f.client.Do(req)
	if err != nil {
		return nil, f.classify(ctx, source, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("answered HTTP %d, want 200: %w", resp.StatusCode, ErrUnavailable)
	}
	if resp.ContentLength > f.opts.MaxBytes {
		return nil, fmt.Errorf("declares %d bytes, over the %d-byte limit: %w", resp.ContentLength, f.opts.MaxBytes, ErrTooLarge)
	}
	// Read one byte past the cap, so that a body of exactly MaxBytes is
	// accepted and anything longer is detected without reading it all.
	body, err := io.ReadAll(io.LimitReader(resp.Body, f.opts.MaxBytes+1))
	if err != nil {
		return nil, f.classify(ctx, source, err)
	}
	if int64(len(body)) > f.opts.MaxBytes {
		return nil, fmt.Errorf("body exceeds the %d-byte limit: %w", f.opts.MaxBytes, ErrTooLarge)
	}
	return body, nil
}

// slot waits for a fetch slot to u's host, at most ConnectTimeout.
func (f *Fetcher) slot(ctx context.Context, u *url.URL) (func(), error) {
	wctx, cancel := context.WithTimeout(ctx, f.opts.ConnectTimeout)
	defer cancel()
	host := strings.ToLower(u.Hostname())
	release, err := f.limit.acquire(wctx, host)
	switch {
	case err == nil:
		return release, nil
	case ctx.Err() != nil:
		return nil, fmt.Errorf("timed out waiting for a fetch slot: %w", ErrUnavailable)
	case errors.Is(err, errHostBusy):
		return nil, fmt.Errorf("%d fetches from %s already in flight, none finished within %v: %w", f.opts.MaxPerHost, host, f.opts.ConnectTimeout, ErrBusy)
	default:
		return nil, fmt.Errorf("%d fetches already in flight, none finished within %v: %w", f.opts.MaxConcurrent, f.opts.ConnectTimeout, ErrBusy)
	}
}

func hasScheme(s, scheme string) bool {
	return len(s) > len(scheme) && s[len(scheme)] == ':' && strings.EqualFold(s[:len(scheme)], scheme)
}

// DecodeData decodes a data: URI in one of the two accepted forms. The
// percent form is unescaped with URL path rules, so '+' stays '+'.
func DecodeData(source string, maxBytes int64) ([]byte, error) {
	var (
		b   []byte
		err error
	)
	switch {
	case strings.HasPrefix(source, DataBase64Prefix):
		rest := source[len(DataBase64Prefix):]
		if int64(base64.StdEncoding.DecodedLen(len(rest))) > maxBytes+3 {
			return nil, fmt.Errorf("data: URI holds more than %d bytes: %w", maxBytes, ErrTooLarge)
		}
		b, err = base64.StdEncoding.DecodeString(rest)
		if err != nil {
			return nil, fmt.Errorf("data: URI is not valid standard base64 (%w): %w", err, ErrMalformed)
		}
	case strings.HasPrefix(source, DataPercentPrefix):
		var s string
		s, err = url.PathUnescape(source[len(DataPercentPrefix):])
		if err != nil {
			return nil, fmt.Errorf("data: URI has a bad percent escape (%w): %w", err, ErrMalformed)
		}
		b = []byte(s)
	default:
		return nil, fmt.Errorf("data: URI must start with %q or %q: %w", DataBase64Prefix, DataPercentPrefix, ErrMalformed)
	}
	if int64(len(b)) > maxBytes {
		return nil, fmt.Errorf("data: URI holds %d bytes, over the %d-byte limit: %w", len(b), maxBytes, ErrTooLarge)
	}
	return b, nil
}

// Origin is what a source is recorded as once a document is stored from it:
// the URL itself, or just the prefix of a data: URI.
func Origin(source string) string {
	for _, p := range []string{DataBase64Prefix, DataPercentPrefix} {
		if strings.HasPrefix(source, p) {
			return p
		}
	}
	return source
}

// Describe shortens a source for messages: data: URIs can be long.
func Describe(source string) string {
	const max = 96
	if len(source) <= max {
		return source
	}
	return source[:max] + "…(" + strconv.Itoa(len(source)) + " bytes)"
}

func (f *Fetcher) checkURL(u *url.URL) error {
	switch {
	case u.Scheme == "https":
	case u.Scheme == "http" && f.opts.AllowHTTP:
	case u.Scheme == "http":
		return fmt.Errorf("http sources are not allowed, only https: %w", ErrRefused)
	default:
		return fmt.Errorf("scheme %q is not allowed, only https and data: %w", u.Scheme, ErrMalformed)
	}
	if u.Host == "" || u.Hostname() == "" {
		return fmt.Errorf("URL has no host: %w", ErrMalformed)
	}
	if u.User != nil {
		return fmt.Errorf("URL must not carry credentials: %w", ErrRefused)
	}
	return nil
}

func (f *Fetcher) checkRedirect(req *http.Request, via []*http.Request) error {
	if len(via) > f.opts.MaxRedirects {
		return fmt.Errorf("more than %d redirects: %w", f.opts.MaxRedirects, ErrUnavailable)
	}
	if err := f.checkURL(req.URL); err != nil {
		return fmt.Errorf("redirect to %s: %w", req.URL.Redacted(), err)
	}
	return nil
}

// RefusedError is the dialer's refusal of an address; it wraps ErrRefused.
// Addr and Reason are for the log: Error does not reveal them, since the
// address is what the registry's DNS made of the caller's host name.
type RefusedError struct {
	Addr   string
	Reason string
}

// Error says only that the destination was refused.
func (e *RefusedError) Error() string { return ErrRefused.Error() }

// Unwrap makes errors.Is(err, ErrRefused) hold.
func (e *RefusedError) Unwrap() error { return ErrRefused }

// classify maps a transport error onto the error classes. The caller gets
// a fixed message; the raw error, which may name resolved addresses, the
// resolver or internal hosts, goes to the log.
func (f *Fetcher) classify(ctx context.Context, source string, err error) error {
	var refused *egress.RefusedError
	switch {
	case errors.As(err, &refused):
		f.opts.Logger.WarnContext(ctx, "protocol source destination refused", slog.String("source", Describe(source)), slog.String("addr", refused.Addr), slog.String("reason", refused.Reason))
		return &RefusedError{Addr: refused.Addr, Reason: refused.Reason}
	case errors.Is(err, ErrRefused), errors.Is(err, ErrUnavailable), errors.Is(err, ErrMalformed):
		// From checkRedirect, wrapped by url.Error; drop the wrapper's
		// repetition of the URL.
		var ue *url.Error
		if errors.As(err, &ue) {
			return ue.Err
		}
		return err
	case errors.Is(err, context.DeadlineExceeded), isTimeout(err):
		f.opts.Logger.DebugContext(ctx, "protocol source timed out", slog.String("source", Describe(source)), slog.Any("err", err))
		return fmt.Errorf("timed out: %w", ErrUnavailable)
	default:
		f.opts.Logger.DebugContext(ctx, "protocol source fetch failed", slog.String("source", Describe(source)), slog.Any("err", err))
		return fmt.Errorf("could not be reached or read: %w", ErrUnavailable)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
