package resolve

import (
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/parleyhq/parley/services/registry/internal/pd"
)

// testOptions returns o with every limit it leaves zero set to a test
// value: New substitutes no defaults (the registry's config owns them).
func testOptions(o Options) Options {
	if o.MaxSources == 0 {
		o.MaxSources = 3
	}
	if o.NegativeEntries == 0 {
		o.NegativeEntries = 10000
	}
	if o.PeerTimeout == 0 {
		o.PeerTimeout = 2 * time.Second
	}
	return o
}

func TestFind_peerHitHasNoSourceIndex(t *testing.T) {
	const doc = "the document"
	h := pd.Sum([]byte(doc))
	r := New(&fakeFetcher{calls: map[string]int{}}, []Peer{fakePeer{"p1", map[pd.Hash]string{h: doc}}}, testOptions(Options{}), slog.New(slog.DiscardHandler))
	got, err := r.Find(t.Context(), h, []string{"https://good/"})
	if err != nil || got.Source != -1 {
		t.Fatalf("Find() = %+v, %v; want a peer hit with Source -1", got, err)
	}
}

// With NegativeTTL zero, nothing is remembered and nothing remembered is
// used: every Find asks the source again.
func TestFind_zeroNegativeTTLNeverCaches(t *testing.T) {
	ff := &fakeFetcher{docs: map[string]string{}, calls: map[string]int{}}
	r := New(ff, nil, testOptions(Options{}), slog.New(slog.DiscardHandler))
	now := time.Unix(1000, 0)
	r.now = func() time.Time { return now }
	h := pd.Sum([]byte("x"))
	// An entry left from before (say, a TTL since turned off) is ignored.
	r.neg[negKey{hash: h, source: "https://down/"}] = negEntry{err: errors.New("old"), expires: now.Add(time.Hour)}
	for range 2 {
		if _, err := r.Find(t.Context(), h, []string{"https://down/"}); err == nil {
			t.Fatal("Find() succeeded; want failure")
		}
	}
	if got := ff.calls["https://down/"]; got != 2 {
		t.Errorf("fetches with NegativeTTL 0 = %d, want 2", got)
	}
	if _, err := r.Find(t.Context(), pd.Sum([]byte("y")), []string{"https://down/"}); err == nil {
		t.Fatal("Find() succeeded; want failure")
	}
	if len(r.neg) != 1 {
		t.Errorf("negative cache holds %d entries, want only the old one", len(r.neg))
	}
}

func TestFind_negativeCacheStaysWithinNegativeEntries(t *testing.T) {
	ff := &fakeFetcher{docs: map[string]string{}, calls: map[string]int{}}
	r := New(ff, nil, testOptions(Options{NegativeTTL: time.Minute, NegativeEntries: 2}), slog.New(slog.DiscardHandler))
	now := time.Unix(1000, 0)
	r.now = func() time.Time { return now }
	for i, doc := range []string{"a", "b", "c", "d"} {
		if _, err := r.Find(t.Context(), pd.Sum([]byte(doc)), []string{"https://down/"}); err == nil {
			t.Fatal("Find() succeeded; want failure")
		}
		if want := min(i+1, 2); len(r.neg) != want {
			t.Errorf("after %d failures the negative cache holds %d entries, want %d", i+1, len(r.neg), want)
		}
	}
}
