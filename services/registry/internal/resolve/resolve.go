// Package resolve finds the bytes of a protocol document that is not stored
// yet: from peer registries first, then from the protocolSources a caller
// gave, in order. Only bytes whose SHA-1 matches are returned. Failed
// (hash, source) pairs are remembered for a short time so that a flood of
// envelopes naming a bad source does not refetch it.
//
// Sharing one fetch per hash among concurrent callers is the caller's job
// (the server wraps Find and the store write in one singleflight call).
package resolve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/parleyhq/parley/services/registry/internal/fetch"
	"github.com/parleyhq/parley/services/registry/internal/pd"
)

// ErrMismatch reports a source whose bytes do not hash to the wanted SHA-1.
var ErrMismatch = errors.New("content does not match the protocol hash")

// errBudgetSpent marks sources not tried because the resolution's deadline
// passed while earlier ones were tried.
var errBudgetSpent = fmt.Errorf("not tried, the time for resolving was spent: %w", fetch.ErrUnavailable)

// Fetcher fetches one source; *fetch.Fetcher is one.
type Fetcher interface {
	Fetch(ctx context.Context, source string) ([]byte, error)
}

// Peer is another registry that may hold a document.
type Peer interface {
	// Name identifies the peer in origins and logs.
	Name() string
	// Get returns the stored bytes for h, or an error (not found included).
	Get(ctx context.Context, h pd.Hash) ([]byte, error)
}

// Options configure a Resolver. New fills in no limit: MaxSources,
// NegativeEntries and PeerTimeout must be positive (config owns the
// defaults).
type Options struct {
	// MaxSources is how many sources of one request are tried.
	MaxSources int
	// NegativeTTL is how long a failed (hash, source) is not retried; zero
	// disables the cache (config owns the default).
	NegativeTTL time.Duration
	// NegativeEntries caps the negative cache.
	NegativeEntries int
	// PeerTimeout bounds each peer lookup.
	PeerTimeout time.Duration
}

// Resolver finds documents. It is safe for concurrent use.
type Resolver struct {
	fetcher Fetcher
	peers   []Peer
	opts    Options
	logger  *slog.Logger
	now     func() time.Time

	mu  sync.Mutex // guards neg
	neg map[negKey]negEntry
}

type negKey struct {
	hash   pd.Hash
	source string
}

type negEntry struct {
	err     error
	expires time.Time
}

// New returns a Resolver.
func New(f Fetcher, peers []Peer, opts Options, logger *slog.Logger) *Resolver {
	return &Resolver{fetcher: f, peers: peers, opts: opts, logger: logger, now: time.Now, neg: map[negKey]negEntry{}}
}

// Found is a verified document and where it came from.
type Found struct {
	Content []byte
	// Origin is "peer:<name>", the source URL, or a data: URI's prefix.
	Origin string
	// Source is the index of the source it came from, or -1 for a peer.
	Source int
}

// SourceError is why one source failed.
type SourceError struct {
	Index  int
	Source string
	Err    error
}

// Error names the source by index and text, and why it failed.
func (e *SourceError) Error() string {
	return fmt.Sprintf("sources[%d] %q: %v", e.Index, fetch.Describe(e.Source), e.Err)
}

// Unwrap returns the underlying failure.
func (e *SourceError) Unwrap() error { return e.Err }

// NotFoundError reports that no peer or source produced the document. It
// lists each tried source's failure; Sources is empty when none were given.
type NotFoundError struct {
	Hash    pd.Hash
	Sources []*SourceError
}

// Error names the hash and every tried source with its failure.
func (e *NotFoundError) Error() string {
	if len(e.Sources) == 0 {
		return "protocol " + e.Hash.Hex() + " is not stored and no source was given"
	}
	parts := make([]string, len(e.Sources))
	for i, s := range e.Sources {
		parts[i] = s.Error()
	}
	return "no source produced protocol " + e.Hash.Hex() + ": " + strings.Join(parts, "; ")
}

// Unwrap returns the per-source errors, so errors.Is and errors.As see them.
func (e *NotFoundError) Unwrap() []error {
	errs := make([]error, len(e.Sources))
	for i, s := range e.Sources {
		errs[i] = s
	}
	return errs
}

// Find returns the first verified copy of h: from a peer, else from the
// first MaxSources sources in order. ctx's deadline is the budget for all
// of them: each gets what the ones before it left. When it passes, the
// NotFoundError says which source timed out and which were not tried;
// when ctx is cancelled, Find returns ctx.Err().
func (r *Resolver) Find(ctx context.Context, h pd.Hash, sources []string) (*Found, error) {
	for _, p := range r.peers {
		if b, ok := r.fromPeer(ctx, p, h); ok {
			return &Found{Content: b, Origin: "peer:" + p.Name(), Source: -1}, nil
		}
	}
	nf := &NotFoundError{Hash: h}
	for i, src := range sources {
		if i >= r.opts.MaxSources {
			break
		}
		if errors.Is(ctx.Err(), context.Canceled) {
			return nil, ctx.Err() // the caller gave up; not the sources' fault
		}
		if ctx.Err() != nil {
			nf.Sources = append(nf.Sources, &SourceError{Index: i, Source: src, Err: errBudgetSpent})
			continue
		}
		b, err := r.fromSource(ctx, h, src)
		if err == nil {
			return &Found{Content: b, Origin: fetch.Origin(src), Source: i}, nil
		}
		if errors.Is(ctx.Err(), context.Canceled) {
			return nil, ctx.Err()
		}
		nf.Sources = append(nf.Sources, &SourceError{Index: i, Source: src, Err: err})
	}
	return nil, nf
}

func (r *Resolver) fromPeer(ctx context.Context, p Peer, h pd.Hash) ([]byte, bool) {
	ctx, cancel := context.WithTimeout(ctx, r.opts.PeerTimeout)
	defer cancel()
	b, err := p.Get(ctx, h)
	if err != nil {
		return nil, false
	}
	if pd.Sum(b) != h {
		r.logger.WarnContext(ctx, "peer registry served a document that fails its hash check; ignored", slog.String("peer", p.Name()), slog.String("protocol", h.Hex()))
		return nil, false
	}
	return b, true
}

func (r *Resolver) fromSource(ctx context.Context, h pd.Hash, src string) ([]byte, error) {
	key := negKey{hash: h, source: src}
	if err := r.negative(key); err != nil {
		return nil, err
	}
	b, err := r.fetcher.Fetch(ctx, src)
	if err == nil {
		if got := pd.Sum(b); got != h {
			err = fmt.Errorf("content has SHA-1 %s: %w", got.Hex(), ErrMismatch)
		}
	}
	if err != nil {
		// A busy fetcher or a caller giving up says nothing about the source.
		if ctx.Err() == nil && !errors.Is(err, fetch.ErrBusy) {
			r.remember(key, err)
		}
		return nil, err
	}
	return b, nil
}

func (r *Resolver) negative(k negKey) error {
	if r.opts.NegativeTTL <= 0 {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.neg[k]
	if !ok {
		return nil
	}
	if r.now().After(e.expires) {
		delete(r.neg, k)
		return nil
	}
	return e.err
}

func (r *Resolver) remember(k negKey, err error) {
	if r.opts.NegativeTTL <= 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	if len(r.neg) >= r.opts.NegativeEntries {
		for key, e := range r.neg {
			if now.After(e.expires) {
				delete(r.neg, key)
			}
		}
		// Still full of live entries: drop arbitrary ones (map order).
		for key := range r.neg {
			if len(r.neg) < r.opts.NegativeEntries {
				break
			}
			delete(r.neg, key)
		}
	}
	r.neg[k] = negEntry{err: err, expires: now.Add(r.opts.NegativeTTL)}
}
