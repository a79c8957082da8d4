package hosted_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/services/dispatcher/internal/hosted"
	"github.com/parleyhq/parley/services/dispatcher/internal/routine"
	"github.com/parleyhq/parley/services/dispatcher/internal/routine/routinetest"
	"github.com/parleyhq/parley/services/dispatcher/internal/store/boltstore"
)

const agent = "clients/acme/agents/weather"

// fakeAgents knows the agents in its set.
type fakeAgents map[string]bool

var errUnknownAgent = errors.New("unknown agent")

func (f fakeAgents) Exists(_ context.Context, name string) error {
	if !f[name] {
		return fmt.Errorf("agent %s: %w", name, errUnknownAgent)
	}
	return nil
}

func newSet(t *testing.T, quarantineAfter int) *hosted.Set {
	t.Helper()
	st, err := boltstore.Open(t.TempDir(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return hosted.New(st, fakeAgents{agent: true}, hosted.Options{QuarantineAfter: quarantineAfter, Limits: routinetest.Limits(routine.Limits{MaxSteps: 100_000, Pool: routine.InProcessForTests()})})
}

func TestInstall(t *testing.T) {
	s := newSet(t, 3)
	ctx := t.Context()
	if _, err := s.Install(ctx, hosted.Name("clients/acme/agents/ghost", "steps"), "def step(a, b, c):\n    return 'x'\n"); !errors.Is(err, errUnknownAgent) {
		t.Errorf("Install(unknown agent) = %v, want the agent check's error", err)
	}
	if _, err := s.Install(ctx, "not/a/routine", "def step(a, b, c):\n    return 'x'\n"); !errors.Is(err, hosted.ErrInvalid) {
		t.Errorf("Install(bad name) = %v, want ErrInvalid", err)
	}
	if _, err := s.Install(ctx, hosted.Name(agent, "steps"), "def step(a, b, c:"); !errors.Is(err, hosted.ErrInvalid) {
		t.Errorf("Install(syntax error) = %v, want ErrInvalid", err)
	}
	r, err := s.Install(ctx, hosted.Name(agent, "steps"), "def step(a, b, c):\n    return 'x'\n")
	if err != nil || r.GetVersion() != 1 || r.GetState() != dispatcherv1.Routine_STATE_ACTIVE {
		t.Fatalf("Install = %v, %v; want version 1, active", r, err)
	}
	got, err := s.Get(ctx, agent, "steps")
	if err != nil || !got.Ready() || !got.Has("step") {
		t.Errorf("Get after Install = %v, %v; want a ready routine with step", got, err)
	}
}

const picky = `
def reply(q, m):
    if q["n"] == 0:
        while True:
            pass
    return {"n": q["n"]}
`

func TestRun_faultsCountBadInputDoesNot(t *testing.T) {
	s := newSet(t, 2)
	ctx := t.Context()
	if _, err := s.Install(ctx, hosted.Name(agent, "h"), picky); err != nil {
		t.Fatal(err)
	}
	r, err := s.Get(ctx, agent, "h")
	if err != nil {
		t.Fatal(err)
	}
	call := func(q string, checked bool) error {
		_, _, err := s.Run(ctx, r, hosted.Call{Fn: "reply", Args: []json.RawMessage{json.RawMessage(q)}, Memory: json.RawMessage("{}"), InputChecked: checked})
		return err
	}
	// Unchecked input the routine cannot use (a list, no "n"): the
	// sender's fault, any number of times.
	for range 5 {
		if err := call(`[1]`, false); !errors.Is(err, hosted.ErrBadInput) || errors.Is(err, hosted.ErrRoutineFault) {
			t.Fatalf("Run([1]) = %v, want ErrBadInput only", err)
		}
	}
	if r.Quarantined() {
		t.Fatal("quarantined by bad input")
	}
	// The same crash on schema-checked input is the routine's.
	if err := call(`{"m": 1}`, true); !errors.Is(err, hosted.ErrRoutineFault) {
		t.Fatalf("Run(checked input, crash) = %v, want ErrRoutineFault", err)
	}
	// A budget kill is the routine's, checked or not.
	if err := call(`{"n": 0}`, false); !errors.Is(err, hosted.ErrRoutineFault) || !errors.Is(err, routine.ErrBudget) {
		t.Fatalf("Run(loop) = %v, want ErrRoutineFault wrapping ErrBudget", err)
	}
	if !r.Quarantined() {
		t.Error("two routine faults in a row did not quarantine (QuarantineAfter 2)")
	}
}

func TestRun_badOutputIsAFault(t *testing.T) {
	s := newSet(t, 3)
	ctx := t.Context()
	if _, err := s.Install(ctx, hosted.Name(agent, "h"), picky); err != nil {
		t.Fatal(err)
	}
	r, _ := s.Get(ctx, agent, "h")
	reject := func(json.RawMessage) (json.RawMessage, error) { return nil, errors.New("not an integer") }
	_, _, err := s.Run(ctx, r, hosted.Call{Fn: "reply", Args: []json.RawMessage{json.RawMessage(`{"n": 2}`)}, Memory: json.RawMessage("{}"), Check: reject})
	if !errors.Is(err, hosted.ErrBadOutput) || !errors.Is(err, hosted.ErrRoutineFault) {
		t.Errorf("Run(output rejected) = %v, want ErrBadOutput and ErrRoutineFault", err)
	}
}

func TestDryRun(t *testing.T) {
	s := newSet(t, 3)
	echo := routine.FuncTool(func(_ context.Context, arg json.RawMessage) (json.RawMessage, error) { return arg, nil })
	src := "def f(x):\n    return echo(x)\n\ndef loop(x):\n    while True:\n        pass\n"
	fns, res, err := s.DryRun(t.Context(), src, map[string]routine.Tool{"echo": echo}, []hosted.Case{
		{Fn: "f", Args: []json.RawMessage{json.RawMessage(`{"a":1}`)}},
		{Fn: "g"},
		{Fn: "loop", Args: []json.RawMessage{json.RawMessage(`1`)}},
	})
	if err != nil {
		t.Fatalf("DryRun = %v", err)
	}
	if len(fns) != 2 || string(res[0].Output) != `{"a":1}` || res[1].Err == "" || !res[2].Budget {
		t.Errorf("DryRun = %v, %+v; want f and loop, f's output, g missing, loop over budget", fns, res)
	}
	if _, _, err := s.DryRun(t.Context(), "def f(:", nil, nil); !errors.Is(err, hosted.ErrInvalid) {
		t.Errorf("DryRun(syntax error) = %v, want ErrInvalid", err)
	}
}

// Another replica's install reaches a Set that cached the routine once it
// is told (Changed), without waiting for the cache to expire.
func TestChanged_dropsTheCachedRoutine(t *testing.T) {
	st, err := boltstore.Open(t.TempDir(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	opts := hosted.Options{CacheTTL: time.Hour, Limits: routinetest.Limits(routine.Limits{MaxSteps: 100_000, Pool: routine.InProcessForTests()})}
	a := hosted.New(st, fakeAgents{agent: true}, opts) // two replicas on one store
	b := hosted.New(st, fakeAgents{agent: true}, opts)
	ctx := t.Context()
	name := hosted.Name(agent, "steps")
	if _, err := a.Install(ctx, name, "def step(a, b, c):\n    return 'x'\n"); err != nil {
		t.Fatal(err)
	}
	if r, err := b.Get(ctx, agent, "steps"); err != nil || !r.Has("step") {
		t.Fatalf("B.Get = %v, %v; want v1", r, err)
	}
	if _, err := a.Install(ctx, name, "def other(a, b, c):\n    return 'y'\n"); err != nil {
		t.Fatal(err)
	}
	if r, _ := b.Get(ctx, agent, "steps"); !r.Has("step") {
		t.Fatal("B read the store again unprompted; this test needs its cache")
	}
	b.Changed(name)
	if r, err := b.Get(ctx, agent, "steps"); err != nil || !r.Has("other") {
		t.Errorf("B.Get after Changed = %v, %v; want version 2, defining other", r, err)
	}
	// A tool change recompiles the agent's routines.
	b.Changed(agent + "/tools/lookup")
	if r, err := b.Get(ctx, agent, "steps"); err != nil || !r.Has("other") {
		t.Errorf("B.Get after a tool change = %v, %v; want version 2 again", r, err)
	}
}
