package resolve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/parleyhq/parley/services/registry/internal/fetch"
	"github.com/parleyhq/parley/services/registry/internal/pd"
)

// fakeFetcher serves fixed bytes per source and counts fetches.
type fakeFetcher struct {
	mu    sync.Mutex
	docs  map[string]string
	calls map[string]int
}

func (f *fakeFetcher) Fetch(_ context.Context, src string) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[src]++
	d, ok := f.docs[src]
	if !ok {
		return nil, errors.New("answered 404 Not Found: " + fetch.ErrUnavailable.Error())
	}
	return []byte(d), nil
}

type fakePeer struct {
	name string
	docs map[pd.Hash]string
}

func (p fakePeer) Name() string { return p.name }

func (p fakePeer) Get(_ context.Context, h pd.Hash) ([]byte, error) {
	if d, ok := p.docs[h]; ok {
		return []byte(d), nil
	}
	return nil, errors.New("not found")
}

func TestFind(t *testing.T) {
	const doc = "the document"
	h := pd.Sum([]byte(doc))
	tests := []struct {
		name       string
		peers      []Peer
		sources    []string
		wantOrigin string
		wantErr    bool
	}{
		{"first good source wins", nil, []string{"https://bad/", "https://wrong/", "https://good/"}, "https://good/", false},
		{"peer before sources", []Peer{fakePeer{"p1", map[pd.Hash]string{h: doc}}}, []string{"https://good/"}, "peer:p1", false},
		{"lying peer ignored", []Peer{fakePeer{"liar", map[pd.Hash]string{h: "other"}}}, []string{"https://good/"}, "https://good/", false},
		{"at most three sources", nil, []string{"https://bad/", "https://bad2/", "https://wrong/", "https://good/"}, "", true},
		{"no sources", nil, nil, "", true},
		{"data uri origin is its prefix", nil, []string{fetch.DataBase64Prefix + "dGhlIGRvY3VtZW50"}, fetch.DataBase64Prefix, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ff := &fakeFetcher{docs: map[string]string{"https://good/": doc, "https://wrong/": "not it"}, calls: map[string]int{}}
			ff.docs[fetch.DataBase64Prefix+"dGhlIGRvY3VtZW50"] = doc
			r := New(ff, tt.peers, testOptions(Options{}), slog.New(slog.DiscardHandler))
			got, err := r.Find(t.Context(), h, tt.sources)
			if tt.wantErr {
				var nf *NotFoundError
				if !errors.As(err, &nf) {
					t.Fatalf("Find() = %v, %v; want NotFoundError", got, err)
				}
				if ff.calls["https://good/"] != 0 {
					t.Errorf("Find() fetched the fourth source")
				}
				return
			}
			if err != nil || string(got.Content) != doc || got.Origin != tt.wantOrigin {
				t.Errorf("Find() = %+v, %v; want %q from %q", got, err, doc, tt.wantOrigin)
			}
		})
	}
}

func TestFind_mismatchNamesSource(t *testing.T) {
	ff := &fakeFetcher{docs: map[string]string{"https://wrong/": "not it"}, calls: map[string]int{}}
	r := New(ff, nil, testOptions(Options{}), slog.New(slog.DiscardHandler))
	_, err := r.Find(t.Context(), pd.Sum([]byte("x")), []string{"https://wrong/"})
	var se *SourceError
	if !errors.Is(err, ErrMismatch) || !errors.As(err, &se) || se.Index != 0 {
		t.Errorf("Find() error = %v; want ErrMismatch for sources[0]", err)
	}
}

func TestFind_negativeCache(t *testing.T) {
	ff := &fakeFetcher{docs: map[string]string{}, calls: map[string]int{}}
	r := New(ff, nil, testOptions(Options{NegativeTTL: time.Minute}), slog.New(slog.DiscardHandler))
	now := time.Unix(1000, 0)
	r.now = func() time.Time { return now }
	h := pd.Sum([]byte("x"))
	for range 3 {
		if _, err := r.Find(t.Context(), h, []string{"https://down/"}); err == nil {
			t.Fatal("Find() succeeded; want failure")
		}
	}
	if got := ff.calls["https://down/"]; got != 1 {
		t.Errorf("fetches within the TTL = %d, want 1", got)
	}
	// Another hash at the same source is a different entry.
	if _, err := r.Find(t.Context(), pd.Sum([]byte("y")), []string{"https://down/"}); err == nil {
		t.Fatal("Find() succeeded; want failure")
	}
	now = now.Add(2 * time.Minute)
	if _, err := r.Find(t.Context(), h, []string{"https://down/"}); err == nil {
		t.Fatal("Find() succeeded; want failure")
	}
	if got := ff.calls["https://down/"]; got != 3 {
		t.Errorf("fetches after the TTL = %d, want 3", got)
	}
}

// waitFetcher blocks every fetch until its context ends.
type waitFetcher struct{ calls int }

func (f *waitFetcher) Fetch(ctx context.Context, _ string) ([]byte, error) {
	f.calls++
	<-ctx.Done()
	return nil, fmt.Errorf("timed out: %w", fetch.ErrUnavailable)
}

// TestFind_oneBudgetForAllSources: when ctx's deadline passes during the
// first source, the rest are reported as not tried, not fetched; a
// cancelled ctx is returned as such.
func TestFind_oneBudgetForAllSources(t *testing.T) {
	f := &waitFetcher{}
	r := New(f, nil, testOptions(Options{}), slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	_, err := r.Find(ctx, pd.Sum([]byte("x")), []string{"https://a/", "https://b/", "https://c/"})
	var nf *NotFoundError
	if !errors.As(err, &nf) || len(nf.Sources) != 3 || !errors.Is(nf.Sources[2].Err, errBudgetSpent) || f.calls != 1 {
		t.Fatalf("Find(deadline passes during the first source) = %v after %d fetches; want all three listed, the last not tried, one fetch", err, f.calls)
	}
	cctx, ccancel := context.WithCancel(t.Context())
	ccancel()
	if _, err := r.Find(cctx, pd.Sum([]byte("y")), []string{"https://a/"}); !errors.Is(err, context.Canceled) {
		t.Errorf("Find(cancelled) error = %v, want context.Canceled", err)
	}
}
