package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/services/registry/internal/fetch"
	"github.com/parleyhq/parley/services/registry/internal/pd"
	"github.com/parleyhq/parley/services/registry/internal/resolve"
	"github.com/parleyhq/parley/services/registry/internal/store"
	"github.com/parleyhq/parley/services/registry/internal/store/boltstore"
)

// fakeStore fails CreateProtocol as a SHA-1 collision would; other methods
// panic.
type fakeStore struct {
	store.Store
	createProtocol func(*registryv1.Protocol) (*registryv1.Protocol, bool, error)
}

func (f fakeStore) GetProtocol(_ context.Context, h pd.Hash) (*registryv1.Protocol, error) {
	return nil, fmt.Errorf("protocol %s: %w", h, store.ErrNotFound)
}

func (f fakeStore) CreateProtocol(_ context.Context, p *registryv1.Protocol) (*registryv1.Protocol, bool, error) {
	return f.createProtocol(p)
}

func TestCreateProtocol_collisionIsAlreadyExists(t *testing.T) {
	s := New(fakeStore{createProtocol: func(p *registryv1.Protocol) (*registryv1.Protocol, bool, error) {
		return nil, false, fmt.Errorf("protocol %s: %w", p.GetSha1Hex(), store.ErrConflict)
	}}, slog.New(slog.DiscardHandler), testOptions(Options{CacheBytes: 1 << 20}))
	_, err := s.CreateProtocol(t.Context(), &registryv1.CreateProtocolRequest{Protocol: &registryv1.Protocol{Content: []byte("x")}})
	if status.Code(err) != codes.AlreadyExists || grpcerr.Reason(err) != reasonCollision {
		t.Errorf("CreateProtocol(colliding) error = %v; want ALREADY_EXISTS %s", err, reasonCollision)
	}
}

func TestCreateProtocol_storeFailureIsInternal(t *testing.T) {
	s := New(fakeStore{createProtocol: func(*registryv1.Protocol) (*registryv1.Protocol, bool, error) {
		return nil, false, errors.New("disk on fire")
	}}, slog.New(slog.DiscardHandler), testOptions(Options{}))
	_, err := s.CreateProtocol(t.Context(), &registryv1.CreateProtocolRequest{Protocol: &registryv1.Protocol{Content: []byte("x")}})
	if st := status.Convert(err); st.Code() != codes.Internal || st.Message() != "internal error" {
		t.Errorf("CreateProtocol(store failure) error = %v; want a masked INTERNAL", err)
	}
}

// fakeFinder returns canned results per first source.
type fakeFinder struct {
	find func(h pd.Hash, sources []string) (*resolve.Found, error)
}

func (f fakeFinder) Find(_ context.Context, h pd.Hash, sources []string) (*resolve.Found, error) {
	return f.find(h, sources)
}

func TestResolveProtocol_statusPerFailure(t *testing.T) {
	h := pd.Sum([]byte("doc"))
	srcErr := func(errs ...error) error {
		nf := &resolve.NotFoundError{Hash: h}
		for i, e := range errs {
			nf.Sources = append(nf.Sources, &resolve.SourceError{Index: i, Source: fmt.Sprintf("https://s%d/", i), Err: e})
		}
		return nf
	}
	tests := []struct {
		name       string
		err        error
		wantCode   codes.Code
		wantReason string
	}{
		{"no sources", srcErr(), codes.NotFound, reasonProtocolNotFound},
		{"unreachable", srcErr(fetch.ErrUnavailable), codes.NotFound, reasonUnresolved},
		{"too large", srcErr(fetch.ErrUnavailable, fetch.ErrTooLarge), codes.ResourceExhausted, reasonTooLarge},
		{"refused wins", srcErr(fetch.ErrTooLarge, &fetch.RefusedError{Addr: "10.0.0.1", Reason: "private"}), codes.InvalidArgument, reasonSourceInvalid},
		{"mismatch", srcErr(resolve.ErrMismatch), codes.InvalidArgument, reasonSourceInvalid},
		{"malformed", srcErr(fetch.ErrMalformed), codes.InvalidArgument, reasonSourceInvalid},
		{"busy", srcErr(fetch.ErrUnavailable, fetch.ErrBusy), codes.ResourceExhausted, reasonFetchBusy},
		{"too large wins over busy", srcErr(fetch.ErrBusy, fetch.ErrTooLarge), codes.ResourceExhausted, reasonTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, err := boltstore.Open(t.TempDir(), time.Second)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			s := New(st, slog.New(slog.DiscardHandler), testOptions(Options{Finder: fakeFinder{func(pd.Hash, []string) (*resolve.Found, error) { return nil, tt.err }}}))
			_, err = s.ResolveProtocol(t.Context(), &registryv1.ResolveProtocolRequest{Hash: h.Hex(), Sources: []string{"https://s0/"}})
			if status.Code(err) != tt.wantCode || grpcerr.Reason(err) != tt.wantReason {
				t.Errorf("ResolveProtocol() error = %v; want %v %s", err, tt.wantCode, tt.wantReason)
			}
		})
	}
}

func TestProtocolCache_staysWithinBudget(t *testing.T) {
	c := newProtocolCache(4 * (512 + 100))
	for i := range 20 {
		content := []byte(fmt.Sprintf("%0100d", i))
		c.put(pd.Sum(content), &registryv1.Protocol{Content: content})
		if c.bytes > c.max {
			t.Fatalf("after %d puts the cache holds %d bytes, over its %d budget", i+1, c.bytes, c.max)
		}
	}
	if n := len(c.m); n == 0 || n > 4 {
		t.Errorf("cache holds %d entries, want 1 to 4", n)
	}
	big := make([]byte, 10_000)
	c.put(pd.Sum(big), &registryv1.Protocol{Content: big})
	if c.get(pd.Sum(big)) != nil {
		t.Error("an entry larger than the whole budget was cached")
	}
}

// TestResolveProtocol_sharesOneFetchPerHash holds the source's answer
// until all callers wait on a resolution, so that none can find the
// document already stored: without sharing, each would fetch.
func TestResolveProtocol_sharesOneFetchPerHash(t *testing.T) {
	const callers = 8
	doc := "---\nname: Shared\n---\nOne fetch for all."
	var s *Server
	var hits atomic.Int32
	src := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hits.Add(1)
		deadline := time.Now().Add(10 * time.Second)
		for s.resolves.Load() < callers && time.Now().Before(deadline) {
			runtime.Gosched()
		}
		_, _ = io.WriteString(w, doc)
	}))
	t.Cleanup(src.Close)
	f, err := fetch.New(fetch.Options{AllowHTTP: true, Allow: []string{src.Listener.Addr().String()}, MaxBytes: 256 << 10, ConnectTimeout: 2 * time.Second, Timeout: 20 * time.Second, MaxConcurrent: 64, MaxPerHost: callers})
	if err != nil {
		t.Fatal(err)
	}
	st, err := boltstore.Open(t.TempDir(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	logger := slog.New(slog.DiscardHandler)
	s = New(st, logger, testOptions(Options{Finder: resolve.New(f, nil, resolve.Options{MaxSources: 3, NegativeEntries: 100, PeerTimeout: 2 * time.Second}, logger), ResolveTimeout: 20 * time.Second}))
	h := pd.Sum([]byte(doc))
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for range callers {
		wg.Go(func() {
			p, err := s.ResolveProtocol(t.Context(), &registryv1.ResolveProtocolRequest{Hash: h.Hex(), Sources: []string{src.URL + "/pd"}})
			if err == nil && string(p.GetContent()) != doc {
				err = fmt.Errorf("content %q", p.GetContent())
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("ResolveProtocol() error = %v", err)
		}
	}
	if got := hits.Load(); got != 1 {
		t.Errorf("source fetched %d times for %d concurrent resolves, want 1", got, callers)
	}
}

// TestNotFound_reasonNamesTheResource proves the NOT_FOUND reason comes from
// the store's error, which names the missing resource's kind.
func TestNotFound_reasonNamesTheResource(t *testing.T) {
	st, err := boltstore.Open(t.TempDir(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	s := New(st, slog.New(slog.DiscardHandler), testOptions(Options{CacheBytes: 1 << 20}))
	h := pd.Sum([]byte("absent"))
	tests := []struct {
		name       string
		call       func() error
		wantReason string
		wantKey    string
		wantValue  string
	}{
		{"get agent", func() error {
			_, err := s.GetAgent(t.Context(), &registryv1.GetAgentRequest{Name: "clients/a/agents/b"})
			return err
		}, "AGENT_NOT_FOUND", "agent", "clients/a/agents/b"},
		{"delete agent", func() error {
			_, err := s.DeleteAgent(t.Context(), &registryv1.DeleteAgentRequest{Name: "clients/a/agents/b"})
			return err
		}, "AGENT_NOT_FOUND", "agent", "clients/a/agents/b"},
		{"get protocol", func() error {
			_, err := s.GetProtocol(t.Context(), &registryv1.GetProtocolRequest{Name: "protocols/" + h.Hex()})
			return err
		}, "PROTOCOL_NOT_FOUND", "protocol", h.Hex()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			if status.Code(err) != codes.NotFound || grpcerr.Reason(err) != tt.wantReason {
				t.Fatalf("error = %v; want NOT_FOUND %s", err, tt.wantReason)
			}
			for _, d := range status.Convert(err).Details() {
				if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetMetadata()[tt.wantKey] != tt.wantValue {
					t.Errorf("ErrorInfo metadata = %v, want %s=%s", info.GetMetadata(), tt.wantKey, tt.wantValue)
				}
			}
		})
	}
}
