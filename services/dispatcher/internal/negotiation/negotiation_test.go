package negotiation_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/parleyhq/parley/services/dispatcher/internal/hosted"
	"github.com/parleyhq/parley/services/dispatcher/internal/llm"
	"github.com/parleyhq/parley/services/dispatcher/internal/negotiation"
	"github.com/parleyhq/parley/services/dispatcher/internal/routine"
	"github.com/parleyhq/parley/services/dispatcher/internal/routine/routinetest"
	"github.com/parleyhq/parley/services/dispatcher/internal/store/boltstore"
)

const (
	agent = "clients/acme/agents/weather"
	hash  = "00112233445566778899aabbccddeeff00112233"
)

type fakeRegistry struct {
	registered [][]byte
	supported  []string
}

func (f *fakeRegistry) Register(_ context.Context, content []byte) error {
	f.registered = append(f.registered, content)
	return nil
}

func (f *fakeRegistry) AddSupported(_ context.Context, a, h string) error {
	f.supported = append(f.supported, a+" "+h)
	return nil
}

type agents struct{}

func (agents) Exists(context.Context, string) error { return nil }

func newRoutines(t *testing.T) *hosted.Set {
	t.Helper()
	st, err := boltstore.Open(t.TempDir(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return hosted.New(st, agents{}, hosted.Options{Limits: routinetest.Limits(routine.Limits{Pool: routine.InProcessForTests()})})
}

func TestInstall(t *testing.T) {
	routines := newRoutines(t)
	reg := &fakeRegistry{}
	n := negotiation.Negotiation{Name: "negotiations/1", State: negotiation.StateAccepted, Protocol: []byte("pd"), ProtocolHash: hash,
		Routine: "def reply(q, m):\n    return q\n"}
	if err := negotiation.Install(t.Context(), reg, routines, slog.New(slog.DiscardHandler), agent, n, true); err != nil {
		t.Fatalf("Install = %v", err)
	}
	if len(reg.registered) != 1 || len(reg.supported) != 1 || reg.supported[0] != agent+" "+hash {
		t.Errorf("registry saw %q registered and %v supported; want the PD and %s", reg.registered, reg.supported, hash)
	}
	if r, err := routines.Get(t.Context(), agent, hash); err != nil || !r.Has("reply") {
		t.Errorf("routine after Install = %v, %v; want reply installed", r, err)
	}
	// The sending side installs its routine but does not change what the
	// agent supports.
	n.Routine = "def reply(q, m:"
	err := negotiation.Install(t.Context(), reg, routines, slog.New(slog.DiscardHandler), agent, n, false)
	if !errors.Is(err, hosted.ErrInvalid) || len(reg.supported) != 1 {
		t.Errorf("Install(bad routine, sender) = %v with %v supported; want ErrInvalid and nothing added", err, reg.supported)
	}
}

// TestInstall_routineThatFailsItsCheckIsLeftOut: the negotiator runs no
// routine; the dispatcher checks it and installs the PD without it (the
// LLM answers) when it fails.
func TestInstall_routineThatFailsItsCheckIsLeftOut(t *testing.T) {
	routines := newRoutines(t)
	reg := &fakeRegistry{}
	check := hosted.Check{Functions: []string{"reply"}, Calls: []hosted.CheckCall{{
		Fn: "reply", Examples: [][]json.RawMessage{{json.RawMessage(`"{\"n\":1}"`), json.RawMessage(`{}`)}}, OutputSchema: `{"required":["n"]}`,
	}}}
	n := negotiation.Negotiation{Name: "negotiations/1", State: negotiation.StateAccepted, Protocol: []byte("pd"), ProtocolHash: hash,
		Routine: "def reply(q, m):\n    return json.encode({'m': 1})\n", Check: check}
	if err := negotiation.Install(t.Context(), reg, routines, slog.New(slog.DiscardHandler), agent, n, true); err != nil {
		t.Fatalf("Install = %v", err)
	}
	if len(reg.registered) != 1 || len(reg.supported) != 1 {
		t.Errorf("registry saw %q registered and %v supported; want the PD", reg.registered, reg.supported)
	}
	if r, err := routines.Get(t.Context(), agent, hash); err != nil || r.Exists() {
		t.Errorf("routine after Install = %v, %v; want none: it failed its check", r, err)
	}
	n.Routine = "def reply(q, m):\n    return q\n"
	if err := negotiation.Install(t.Context(), reg, routines, slog.New(slog.DiscardHandler), agent, n, true); err != nil {
		t.Fatalf("Install = %v", err)
	}
	if r, err := routines.Get(t.Context(), agent, hash); err != nil || !r.Has("reply") {
		t.Errorf("routine after Install = %v, %v; want the routine that passes its check", r, err)
	}
}

func TestFailure(t *testing.T) {
	if got := negotiation.Failure(llm.ErrNoLLM); got != "it needs a language model and none is configured" {
		t.Errorf("Failure(ErrNoLLM) = %q", got)
	}
	if got := negotiation.Failure(errors.New("the peer left")); got != "the peer left" {
		t.Errorf("Failure(other) = %q, want the error's text", got)
	}
}

// TestInstall_checkTakesTheAgentsShare: the check of a negotiated routine
// runs in the share of the agent it is for, not in the anonymous share
// of dry runs: runaway dry runs holding that share (peers negotiating with
// any agent, the operator's tests) do not make the check wait, fail busy,
// and leave the routine out.
func TestInstall_checkTakesTheAgentsShare(t *testing.T) {
	pool := routine.NewPoolWith(routine.PoolOptions{Workers: 2, MemoryBytes: 256 << 20, KillMargin: 250 * time.Millisecond, WorkerCPU: 10 * time.Minute})
	t.Cleanup(func() { _ = pool.Close() })
	st, err := boltstore.Open(t.TempDir(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	// Each share is one of the two workers. The runaway holds the
	// anonymous one for 5 s; the check may wait 1 s.
	routines := hosted.New(st, agents{}, hosted.Options{Limits: routinetest.Limits(routine.Limits{Pool: pool})})
	slow := hosted.New(st, agents{}, hosted.Options{Limits: routinetest.Limits(routine.Limits{Pool: pool, Timeout: 5 * time.Second})})
	runaway := make(chan error, 1)
	go func() {
		_, _, err := slow.DryRun(context.WithoutCancel(t.Context()), "def reply(q, m):\n    return all(range(1, 1 << 62))\n", nil, []hosted.Case{{Fn: "reply", Args: []json.RawMessage{json.RawMessage(`1`), json.RawMessage(`{}`)}}})
		runaway <- err
	}()
	waitRunning(t, pool)
	check := hosted.Check{Functions: []string{"reply"}, Calls: []hosted.CheckCall{{
		Fn: "reply", Examples: [][]json.RawMessage{{json.RawMessage(`"{\"n\":1}"`), json.RawMessage(`{}`)}},
	}}}
	n := negotiation.Negotiation{Name: "negotiations/1", State: negotiation.StateAccepted, Protocol: []byte("pd"), ProtocolHash: hash,
		Routine: "def reply(q, m):\n    return q\n", Check: check}
	if err := negotiation.Install(t.Context(), &fakeRegistry{}, routines, slog.New(slog.DiscardHandler), agent, n, true); err != nil {
		t.Fatalf("Install while runaway dry runs hold the anonymous share = %v", err)
	}
	if r, err := routines.Get(t.Context(), agent, hash); err != nil || !r.Has("reply") {
		t.Errorf("routine after Install = %v, %v; want it checked and installed", r, err)
	}
	if err := <-runaway; err != nil {
		t.Errorf("the runaway dry run = %v, want its result (a time failure)", err)
	}
}

// waitRunning waits until one of the pool's workers is running (the
// runaway in its builtin), failing after a minute.
func waitRunning(t *testing.T, pool *routine.Pool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		for _, pid := range pool.Stats().Workers {
			stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
			if err == nil {
				if f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:])); len(f) > 0 && f[0] == "R" {
					return
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no routine worker started running the runaway")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
