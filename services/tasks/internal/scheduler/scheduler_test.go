package scheduler_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	tasksv1 "github.com/parleyhq/parley/gen/parley/tasks/v1"
	"github.com/parleyhq/parley/services/tasks/internal/artifactfs"
	"github.com/parleyhq/parley/services/tasks/internal/scheduler"
	"github.com/parleyhq/parley/services/tasks/internal/store"
	"github.com/parleyhq/parley/services/tasks/internal/store/boltstore"
)

// fakeClock only moves when Advance says so, so backoffs end exactly when
// a test wants and never on their own.
type fakeClock struct {
	mu     sync.Mutex // guards now and timers
	now    time.Time
	timers []fakeTimer
}

type fakeTimer struct {
	at time.Time
	ch chan time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Unix(1e9, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) At(deadline time.Time) (<-chan time.Time, func() bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	if !deadline.After(c.now) {
		ch <- c.now
		return ch, func() bool { return false }
	}
	c.timers = append(c.timers, fakeTimer{at: deadline, ch: ch})
	return ch, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		for i, t := range c.timers {
			if t.ch == ch {
				c.timers = append(c.timers[:i], c.timers[i+1:]...)
				return true
			}
		}
		return false
	}
}

// Advance moves the clock by d and fires the timers that fall due.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	kept := c.timers[:0]
	for _, t := range c.timers {
		if t.at.After(c.now) {
			kept = append(kept, t)
			continue
		}
		t.ch <- c.now
	}
	c.timers = kept
}

// fakeRunner answers with fn and counts calls per agent and step.
type fakeRunner struct {
	mu    sync.Mutex // guards the fields
	fn    func(context.Context, scheduler.Request) (*scheduler.Result, error)
	calls map[string]int // by agent
	steps map[string]int // by step id
}

func (f *fakeRunner) RunStep(ctx context.Context, req scheduler.Request) (*scheduler.Result, error) {
	f.mu.Lock()
	f.calls[req.Agent]++
	f.steps[req.StepID]++
	fn := f.fn
	f.mu.Unlock()
	return fn(ctx, req)
}

func (f *fakeRunner) set(fn func(context.Context, scheduler.Request) (*scheduler.Result, error)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fn = fn
}

func (f *fakeRunner) count(agent string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[agent]
}

func (f *fakeRunner) stepCalls(stepID string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.steps[stepID]
}

// countingStore counts UpdateStep calls (each an fsynced write).
type countingStore struct {
	*boltstore.Store
	mu      sync.Mutex // guards updates
	updates int
}

func (c *countingStore) UpdateStep(ctx context.Context, ref store.StepRef, mutate func(*tasksv1.Task, *tasksv1.Step) ([]*tasksv1.Artifact, error)) (*tasksv1.Step, error) {
	c.mu.Lock()
	c.updates++
	c.mu.Unlock()
	return c.Store.UpdateStep(ctx, ref, mutate)
}

func (c *countingStore) writes() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.updates
}

type noEvents struct{}

func (noEvents) Publish(string, *tasksv1.Step) {}
func (noEvents) Watched(string) bool           { return false }

type fixture struct {
	sched *scheduler.Scheduler
	store *countingStore
	run   *fakeRunner
	clock *fakeClock
	n     int
}

func ok(_ context.Context, req scheduler.Request) (*scheduler.Result, error) {
	return &scheduler.Result{Output: "ok: " + req.Input}, nil
}

func newFixture(t *testing.T, opts scheduler.Options) *fixture {
	t.Helper()
	dir := t.TempDir()
	bs, err := boltstore.Open(dir, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	files, err := artifactfs.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{
		store: &countingStore{Store: bs},
		run:   &fakeRunner{fn: ok, calls: map[string]int{}, steps: map[string]int{}},
		clock: newFakeClock(),
	}
	if opts.RetryMax == 0 {
		opts.RetryMax = time.Second
	}
	opts.StepTimeout, opts.MaxUploadBytes = time.Minute, 1<<20
	if opts.MaxInFlight == 0 {
		opts.MaxInFlight = 64
	}
	if opts.MaxStepAttempts == 0 {
		opts.MaxStepAttempts = 5
	}
	ids := 0
	opts.NewID = func() string { ids++; return fmt.Sprintf("a%04d", ids) }
	opts.Now, opts.Clock = time.Now, f.clock
	f.sched = scheduler.New(f.store, files, f.run, noEvents{}, slog.New(slog.DiscardHandler), opts)
	t.Cleanup(func() {
		f.sched.Close()
		bs.Close()
	})
	return f
}

// task stores a task of agent in state.
func (f *fixture) task(t *testing.T, agent string, state tasksv1.Task_State) string {
	t.Helper()
	f.n++
	id := fmt.Sprintf("t%04d", f.n)
	if err := f.store.CreateTask(t.Context(), &tasksv1.Task{Name: "tasks/" + id, Agent: agent, State: state}); err != nil {
		t.Fatal(err)
	}
	return id
}

// post stores a created step of the task and submits it as CreateStep
// does, returning its ref and a channel for its settled state.
func (f *fixture) post(t *testing.T, taskID, input string) (store.StepRef, <-chan *tasksv1.Step) {
	t.Helper()
	f.n++
	ref := store.StepRef{TaskID: taskID, StepID: fmt.Sprintf("s%04d", f.n)}
	var task *tasksv1.Task
	st, err := f.store.CreateStep(t.Context(), taskID, &tasksv1.Step{Name: "tasks/" + taskID + "/steps/" + ref.StepID, Input: &input, Status: tasksv1.Step_STATUS_CREATED},
		func(t *tasksv1.Task, _ *tasksv1.Step) error { task = t; return nil })
	if err != nil {
		t.Fatal(err)
	}
	if !f.sched.Reserve(task.GetAgent(), 1<<30) {
		t.Fatal("Reserve refused")
	}
	settled := f.sched.Wait(ref)
	f.sched.Submit(ref, task.GetAgent(), task, st)
	return ref, settled
}

func (f *fixture) step(t *testing.T, ref store.StepRef) *tasksv1.Step {
	t.Helper()
	st, err := f.store.GetStep(t.Context(), ref)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// until polls cond, failing after 10s with what.
func until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: gave up after 10s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func receive(t *testing.T, ch <-chan *tasksv1.Step) *tasksv1.Step {
	t.Helper()
	select {
	case st := <-ch:
		return st
	case <-time.After(10 * time.Second):
		t.Fatal("the attempt never settled")
		return nil
	}
}

const (
	agentNone    = "clients/c/agents/none"
	agentUnknown = "clients/c/agents/unknown"
	agentOK      = "clients/c/agents/ok"
)

func byAgent(_ context.Context, req scheduler.Request) (*scheduler.Result, error) {
	switch req.Agent {
	case agentNone:
		return nil, fmt.Errorf("nothing connected: %w", scheduler.ErrNoExecutor)
	case agentUnknown:
		return nil, fmt.Errorf("not registered: %w", scheduler.ErrAgentUnavailable)
	}
	return ok(context.Background(), req)
}

// Many steps of an agent without an executor cost one RunStep per probe
// interval, not one per step, and one store write per step; when time
// does not move, nothing more happens.
func TestWaiting_oneProbePerIntervalAndNoRepeatWrites(t *testing.T) {
	f := newFixture(t, scheduler.Options{})
	f.run.set(byAgent)
	task := f.task(t, agentNone, tasksv1.Task_STATE_ACTIVE)
	const steps = 50
	var refs []store.StepRef
	for range steps {
		ref, settled := f.post(t, task, "x")
		if st := receive(t, settled); !strings.Contains(st.GetStatusMessage(), "no executor") {
			t.Fatalf("waiting step = %v; want a status_message about no executor", st)
		}
		refs = append(refs, ref)
	}
	until(t, "idle", f.sched.Idle)
	if n := f.run.count(agentNone); n != 1 {
		t.Errorf("RunStep calls = %d with the clock stopped; want 1 (the first probe)", n)
	}
	if n := f.store.writes(); n != steps {
		t.Errorf("UpdateStep writes = %d; want one per step (%d)", n, steps)
	}
	// The probe is the oldest step. Wait for it to settle, not for RunStep
	// to be called: its next backoff counts from when it fails, so the
	// clock must not move before then.
	probe := f.sched.Wait(refs[0])
	f.clock.Advance(100 * time.Millisecond) // the first backoff
	receive(t, probe)
	until(t, "idle", f.sched.Idle)
	if n := f.run.count(agentNone); n != 2 {
		t.Fatalf("RunStep calls = %d after the first backoff; want 2 (a second probe)", n)
	}
	if n := f.store.writes(); n != steps {
		t.Errorf("UpdateStep writes after a probe = %d; want still %d (the message did not change)", n, steps)
	}
	// An executor connects: the next probe completes and every step runs.
	f.run.set(ok)
	f.clock.Advance(200 * time.Millisecond)
	until(t, "every step completes", func() bool {
		for _, ref := range refs {
			if f.step(t, ref).GetStatus() != tasksv1.Step_STATUS_COMPLETED {
				return false
			}
		}
		return true
	})
	if n := f.run.count(agentNone); n != 2+steps {
		t.Errorf("RunStep calls = %d; want %d (2 failed probes, then each step once)", n, 2+steps)
	}
}

// An agent the dispatcher does not know is probed only every RetryMax,
// while an agent with no executor backs off from 100ms.
func TestWaiting_unknownAgentBacksOffToTheMaximum(t *testing.T) {
	f := newFixture(t, scheduler.Options{RetryMax: time.Second})
	f.run.set(byAgent)
	var none store.StepRef
	for _, agent := range []string{agentUnknown, agentNone} {
		ref, settled := f.post(t, f.task(t, agent, tasksv1.Task_STATE_ACTIVE), "x")
		receive(t, settled)
		none = ref
	}
	until(t, "idle", f.sched.Idle)
	for i, want := range []int{2, 3, 4} { // due after 100ms, 200ms, 400ms
		// Wait for the probe to settle, not for RunStep to be called: the
		// next probe is due a backoff after this one fails, so the clock
		// must not move before then.
		probe := f.sched.Wait(none)
		f.clock.Advance(100 * time.Millisecond << i)
		receive(t, probe)
		if n := f.run.count(agentNone); n != want {
			t.Fatalf("agent without executor probed %d times after %v; want %d", n, f.clock.Now().Sub(time.Unix(1e9, 0)), want)
		}
		if n := f.run.count(agentUnknown); n != 1 {
			t.Fatalf("unknown agent probed %d times after %v; want 1 until RetryMax", n, f.clock.Now().Sub(time.Unix(1e9, 0)))
		}
	}
	f.clock.Advance(300 * time.Millisecond) // 1s since its first attempt
	until(t, "the unknown agent's second probe", func() bool { return f.run.count(agentUnknown) == 2 })
}

// A step failing on its own backs off alone, is tried MaxStepAttempts
// times, then completes with the failure as its output; the agent's other
// steps run meanwhile.
func TestStepError_retriesTheStepAloneThenCompletesIt(t *testing.T) {
	f := newFixture(t, scheduler.Options{MaxStepAttempts: 3})
	f.run.set(func(ctx context.Context, req scheduler.Request) (*scheduler.Result, error) {
		if req.Input == "bad" {
			return nil, &scheduler.StepError{Code: "Aborted", Reason: "HANDLER_FAILED", Message: "the handler crashed"}
		}
		return ok(ctx, req)
	})
	bad, settled := f.post(t, f.task(t, agentOK, tasksv1.Task_STATE_ACTIVE), "bad")
	if st := receive(t, settled); !strings.HasPrefix(st.GetStatusMessage(), "retrying: attempt 1 of 3") {
		t.Fatalf("failing step after one attempt = %v; want a retry message", st)
	}
	_, other := f.post(t, f.task(t, agentOK, tasksv1.Task_STATE_ACTIVE), "fine")
	if st := receive(t, other); st.GetStatus() != tasksv1.Step_STATUS_COMPLETED {
		t.Errorf("healthy step of the same agent = %v; want completed", st)
	}
	for attempt := 2; attempt <= 3; attempt++ {
		// Wait for the attempt to settle, not for RunStep to be called: its
		// backoff counts from when it fails, so the clock must not move
		// before then.
		settled := f.sched.Wait(bad)
		f.clock.Advance(time.Second)
		receive(t, settled)
		if n := f.run.stepCalls(bad.StepID); n != attempt {
			t.Fatalf("failing step tried %d times after %d backoffs; want %d", n, attempt-1, attempt)
		}
	}
	until(t, "the failed step leaves the scheduler", func() bool { return !f.sched.Scheduled(bad) })
	got := f.step(t, bad)
	if got.GetStatus() != tasksv1.Step_STATUS_COMPLETED || !strings.Contains(got.GetOutput(), "failed after 3 attempts") || got.GetIsLast() {
		t.Errorf("failed step = %v; want completed, the failure explained, not last", got)
	}
	var extra struct {
		Error struct {
			Code, Reason string
			Attempts     int
		}
	}
	if err := json.Unmarshal(got.GetAdditionalOutputJson(), &extra); err != nil || extra.Error.Reason != "HANDLER_FAILED" || extra.Error.Code != "Aborted" || extra.Error.Attempts != 3 {
		t.Errorf("additional_output = %s (%v); want the error with reason HANDLER_FAILED and 3 attempts", got.GetAdditionalOutputJson(), err)
	}
	f.clock.Advance(time.Hour) // no attempt is left to fall due
	until(t, "idle", f.sched.Idle)
	if n := f.run.stepCalls(bad.StepID); n != 3 {
		t.Errorf("failing step tried %d times; want MaxStepAttempts (3)", n)
	}
	if n := f.sched.Pending(agentOK); n != 0 {
		t.Errorf("Pending(%s) = %d; want 0", agentOK, n)
	}
}

// A pending step of a finished or cancelled task is not run: it completes
// with an output saying why.
func TestInactiveTask_stepEndsWithAnOutputAndDoesNotRun(t *testing.T) {
	for _, tc := range []struct {
		state tasksv1.Task_State
		want  string
	}{
		{tasksv1.Task_STATE_FINISHED, "finished"},
		{tasksv1.Task_STATE_CANCELLED, "cancelled"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			f := newFixture(t, scheduler.Options{})
			// A step stored as created whose task has since become inactive,
			// as after a restart.
			task := f.task(t, agentOK, tasksv1.Task_STATE_ACTIVE)
			in := "late"
			ref := store.StepRef{TaskID: task, StepID: "late"}
			if _, err := f.store.CreateStep(t.Context(), task, &tasksv1.Step{Name: "tasks/" + task + "/steps/late", Input: &in, Status: tasksv1.Step_STATUS_CREATED},
				func(t *tasksv1.Task, _ *tasksv1.Step) error { t.State = tc.state; return nil }); err != nil {
				t.Fatal(err)
			}
			settled := f.sched.Wait(ref)
			f.sched.Submit(ref, "", nil, nil)
			st := receive(t, settled)
			if st.GetStatus() != tasksv1.Step_STATUS_COMPLETED || !st.GetIsLast() || !strings.Contains(st.GetOutput(), tc.want) {
				t.Errorf("step of a %s task = %v; want completed, last, saying %s", tc.want, st, tc.want)
			}
			if n := f.run.count(agentOK); n != 0 {
				t.Errorf("RunStep ran the step of a %s task", tc.want)
			}
		})
	}
}

// Steps that arrive while an agent's first attempt runs wait for its
// outcome: when it succeeds they run and settle completed; when it fails
// they settle waiting, with its message.
func TestFirstProbe_followersWaitForItsOutcome(t *testing.T) {
	for _, tc := range []struct {
		name    string
		outcome error
		want    tasksv1.Step_Status
	}{
		{"probe completes", nil, tasksv1.Step_STATUS_COMPLETED},
		{"probe fails", scheduler.ErrNoExecutor, tasksv1.Step_STATUS_CREATED},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, scheduler.Options{})
			release := make(chan struct{})
			f.run.set(func(ctx context.Context, req scheduler.Request) (*scheduler.Result, error) {
				if req.Input == "first" {
					select { // Close cancels ctx: a failing test cannot hang here
					case <-release:
					case <-ctx.Done():
						return nil, ctx.Err()
					}
					if tc.outcome != nil {
						return nil, tc.outcome
					}
				}
				return ok(ctx, req)
			})
			_, first := f.post(t, f.task(t, agentOK, tasksv1.Task_STATE_ACTIVE), "first")
			until(t, "the first attempt runs", func() bool { return f.run.count(agentOK) == 1 })
			var followers []<-chan *tasksv1.Step
			for range 5 {
				_, settled := f.post(t, f.task(t, agentOK, tasksv1.Task_STATE_ACTIVE), "next")
				followers = append(followers, settled)
			}
			until(t, "the followers wait", f.sched.Idle)
			for _, ch := range followers {
				select {
				case st := <-ch:
					t.Fatalf("a follower settled before the first attempt ended: %v", st)
				default:
				}
			}
			close(release)
			receive(t, first)
			for _, ch := range followers {
				st := receive(t, ch)
				if st.GetStatus() != tc.want || tc.outcome != nil && !strings.Contains(st.GetStatusMessage(), "no executor") {
					t.Errorf("follower = %v; want status %v (and the probe's message when waiting)", st, tc.want)
				}
			}
		})
	}
}

// Each sentinel gets a message that names what is down.
func TestWaiting_messageNamesWhatIsDown(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{scheduler.ErrNoExecutor, "no executor is connected"},
		{scheduler.ErrAgentUnavailable, "does not know agent"},
		{scheduler.ErrLLMUnavailable, "language model provider"},
		{scheduler.ErrDispatcherUnavailable, "the dispatcher is unavailable"},
		{scheduler.ErrNotSupported, "cannot execute steps"},
	} {
		t.Run(tc.err.Error(), func(t *testing.T) {
			f := newFixture(t, scheduler.Options{})
			f.run.set(func(context.Context, scheduler.Request) (*scheduler.Result, error) {
				return nil, fmt.Errorf("down: %w", tc.err)
			})
			_, settled := f.post(t, f.task(t, agentOK, tasksv1.Task_STATE_ACTIVE), "x")
			if st := receive(t, settled); !strings.Contains(st.GetStatusMessage(), tc.want) {
				t.Errorf("status_message = %q; want it to say %q", st.GetStatusMessage(), tc.want)
			}
		})
	}
	if !errors.Is(fmt.Errorf("x: %w", scheduler.ErrLLMUnavailable), scheduler.ErrLLMUnavailable) {
		t.Fatal("sentinels must match through wrapping")
	}
}

// An agent's additional_output nested past the limit is dropped (the
// step completes without it); one at the limit is kept.
func TestAdditionalOutput_nestedTooDeepIsDropped(t *testing.T) {
	f := newFixture(t, scheduler.Options{})
	nest := func(n int) string { return strings.Repeat(`{"a":`, n-1) + `{}` + strings.Repeat(`}`, n-1) }
	f.run.set(func(_ context.Context, req scheduler.Request) (*scheduler.Result, error) {
		n := 64
		if req.Input == "deep" {
			n = 65
		}
		return &scheduler.Result{Output: "ok", AdditionalOutput: []byte(nest(n))}, nil
	})
	task := f.task(t, agentOK, tasksv1.Task_STATE_ACTIVE)
	_, deep := f.post(t, task, "deep")
	if st := receive(t, deep); st.GetStatus() != tasksv1.Step_STATUS_COMPLETED || len(st.GetAdditionalOutputJson()) != 0 {
		t.Errorf("step with additional_output 65 deep = %v; want completed without it", st)
	}
	_, fine := f.post(t, task, "fine")
	if st := receive(t, fine); string(st.GetAdditionalOutputJson()) != nest(64) {
		t.Errorf("step with additional_output 64 deep has %.80s…; want it kept", st.GetAdditionalOutputJson())
	}
}
