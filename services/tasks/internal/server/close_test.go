package server

import (
	"context"
	"errors"
	"log/slog"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/parleyhq/parley/services/tasks/internal/artifactfs"
	"github.com/parleyhq/parley/services/tasks/internal/store"
	"github.com/parleyhq/parley/services/tasks/internal/store/boltstore"
)

// notReadyStore cannot list its pending steps yet, as a PostgreSQL
// database that does not answer: Start leaves a retry running.
type notReadyStore struct{ store.Store }

var errNotReady = errors.New("the database does not answer yet")

func (notReadyStore) ListPending(context.Context) ([]store.StepRef, error) { return nil, errNotReady }
func (notReadyStore) Ping(context.Context) error                           { return errNotReady }

// Close stops the retry Start left for a store not ready yet and waits for
// it, even while Start's context lives: the caller closes the store next,
// and nothing may touch it after that.
func TestClose_stopsAndWaitsForTheResumeRetry(t *testing.T) {
	s := newNotReadyServer(t)
	const retry = "server.(*Server).resumeLater("
	before := goroutinesIn(retry)
	if err := s.Start(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	poll(t, "the resume retry runs", func() bool { return goroutinesIn(retry) == before+1 })
	s.Close()
	if n := goroutinesIn(retry) - before; n != 0 {
		t.Errorf("%d resume retries still run after Close returned; want 0", n)
	}
}

// goroutinesIn counts the goroutines with fn on their stack.
func goroutinesIn(fn string) int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Count(string(buf[:n]), fn)
		}
		buf = make([]byte, 2*len(buf))
	}
}

// The resume retry ends as soon as shutdown starts (stopping closes) or
// Start's context ends, without waiting for Close: a draining replica
// claims no steps, so that they are left to one that keeps serving.
func TestStart_resumeRetryEndsWhenShutdownStarts(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(cancel context.CancelFunc, stopping chan struct{})
	}{
		{"shutdown starts", func(_ context.CancelFunc, stopping chan struct{}) { close(stopping) }},
		{"Start's context ends", func(cancel context.CancelFunc, _ chan struct{}) { cancel() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newNotReadyServer(t)
			t.Cleanup(s.Close)
			const retry = "server.(*Server).resumeLater("
			before := goroutinesIn(retry)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			stopping := make(chan struct{})
			if err := s.Start(ctx, stopping); err != nil {
				t.Fatal(err)
			}
			poll(t, "the resume retry runs", func() bool { return goroutinesIn(retry) == before+1 })
			tc.end(cancel, stopping)
			// No Close yet: the retry must end on its own.
			poll(t, "the resume retry ends before Close", func() bool { return goroutinesIn(retry) == before })
		})
	}
}

// newNotReadyServer returns a server over a new bbolt store that answers
// not ready (notReadyStore), so that Start leaves a resume retry running.
func newNotReadyServer(t *testing.T) *Server {
	t.Helper()
	dir := t.TempDir()
	bs, err := boltstore.Open(dir, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bs.Close() })
	files, err := artifactfs.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	fd := &fakeDispatcher{fn: fakeAgents, calls: map[string]int{}, steps: map[string]map[string]bool{}}
	return New(notReadyStore{bs}, files, fd, slog.New(slog.DiscardHandler), Options{
		StepWait: time.Second, StepTimeout: time.Second, RetryMax: time.Second,
		MaxPageSize: 10, MaxWatchers: 10, MaxInFlight: 10, MaxWaitingSteps: 10, MaxStepAttempts: 10, MaxUploadBytes: 1 << 20,
	})
}
