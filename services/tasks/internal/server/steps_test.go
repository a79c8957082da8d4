package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	tasksv1 "github.com/parleyhq/parley/gen/parley/tasks/v1"
	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/services/tasks/internal/artifactfs"
	"github.com/parleyhq/parley/services/tasks/internal/scheduler"
	"github.com/parleyhq/parley/services/tasks/internal/store/boltstore"
)

// fakeDispatcher is an in-process DispatcherServiceClient running fn and
// counting calls per agent and step: its failures (no executor, unknown
// agent) are hard to cause with the real dispatcher.
type fakeDispatcher struct {
	dispatcherv1.DispatcherServiceClient // nil: only ExecuteStep is called

	fn    func(context.Context, *dispatcherv1.ExecuteStepRequest) (*dispatcherv1.ExecuteStepResponse, error)
	mu    sync.Mutex // guards the maps
	calls map[string]int
	steps map[string]map[string]bool
}

func (f *fakeDispatcher) ExecuteStep(ctx context.Context, req *dispatcherv1.ExecuteStepRequest, _ ...grpc.CallOption) (*dispatcherv1.ExecuteStepResponse, error) {
	f.mu.Lock()
	f.calls[req.GetAgent()]++
	if f.steps[req.GetAgent()] == nil {
		f.steps[req.GetAgent()] = map[string]bool{}
	}
	f.steps[req.GetAgent()][req.GetStepId()] = true
	fn := f.fn
	f.mu.Unlock()
	return fn(ctx, req)
}

// total returns the calls for every agent.
func (f *fakeDispatcher) total() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.calls {
		n += c
	}
	return n
}

// count returns the calls for agent and how many distinct steps they ran.
func (f *fakeDispatcher) count(agent string) (calls, steps int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[agent], len(f.steps[agent])
}

const (
	agentNone    = "clients/c/agents/none"    // no executor yet
	agentUnknown = "clients/c/agents/unknown" // the dispatcher does not know it
	agentOK      = "clients/c/agents/ok"      // runs steps
)

func fakeAgents(ctx context.Context, req *dispatcherv1.ExecuteStepRequest) (*dispatcherv1.ExecuteStepResponse, error) {
	switch req.GetAgent() {
	case agentNone:
		return nil, grpcerr.New(codes.FailedPrecondition, "no executor", "NO_EXECUTOR", "dispatcher.parley.dev", nil)
	case agentUnknown:
		return nil, status.Error(codes.NotFound, "no such agent")
	case "clients/c/agents/block0", "clients/c/agents/block1", "clients/c/agents/block2", "clients/c/agents/block3":
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return &dispatcherv1.ExecuteStepResponse{Output: "ok"}, nil
}

// stoppedClock is a scheduler clock that never moves: no backoff ends.
type stoppedClock struct{}

func (stoppedClock) Now() time.Time { return time.Unix(1e9, 0) }
func (stoppedClock) At(time.Time) (<-chan time.Time, func() bool) {
	return nil, func() bool { return true }
}

func newTestServer(t *testing.T, dir string, opts Options) (*Server, *fakeDispatcher) {
	t.Helper()
	bs, err := boltstore.Open(dir, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	files, err := artifactfs.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	fd := &fakeDispatcher{fn: fakeAgents, calls: map[string]int{}, steps: map[string]map[string]bool{}}
	// The limits a test leaves zero get test values: New fills in none.
	if opts.StepWait == 0 {
		opts.StepWait = 5 * time.Second
	}
	for _, d := range []*time.Duration{&opts.StepTimeout, &opts.RetryMax} {
		if *d == 0 {
			*d = 5 * time.Second
		}
	}
	for _, n := range []*int{&opts.MaxPageSize, &opts.MaxWatchers, &opts.MaxInFlight, &opts.MaxWaitingSteps, &opts.MaxStepAttempts} {
		if *n == 0 {
			*n = 100
		}
	}
	if opts.MaxUploadBytes == 0 {
		opts.MaxUploadBytes = 1 << 20
	}
	s := New(bs, files, fd, slog.New(slog.DiscardHandler), opts)
	t.Cleanup(func() {
		s.Close()
		bs.Close()
	})
	return s, fd
}

func createTask(t *testing.T, s *Server, agent string) string {
	t.Helper()
	tk, err := s.CreateTask(t.Context(), &tasksv1.CreateTaskRequest{Task: &tasksv1.Task{Agent: agent}})
	if err != nil {
		t.Fatal(err)
	}
	return tk.GetName()
}

// createStep posts a step and waits up to wait for it to complete or wait.
func createStep(t *testing.T, s *Server, task string, wait time.Duration) (*tasksv1.Step, error) {
	t.Helper()
	return s.CreateStep(t.Context(), &tasksv1.CreateStepRequest{Parent: task, Step: &tasksv1.Step{Input: new("x")}, Wait: durationpb.New(wait)})
}

func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: gave up after 10s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// Start queues pending steps instead of starting a goroutine for each.
func TestStart_boundsGoroutinesByMaxInFlight(t *testing.T) {
	dir := t.TempDir()
	bs, err := boltstore.Open(dir, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	// Four agents, as an agent not known to have an executor gets one
	// attempt at a time.
	for a := range 4 {
		task := fmt.Sprintf("t%d", a)
		if err := bs.CreateTask(ctx, &tasksv1.Task{Name: "tasks/" + task, Agent: fmt.Sprintf("clients/c/agents/block%d", a), State: tasksv1.Task_STATE_ACTIVE}); err != nil {
			t.Fatal(err)
		}
		for i := range 75 {
			st := &tasksv1.Step{Name: fmt.Sprintf("tasks/%s/steps/s%03d", task, i), Status: tasksv1.Step_STATUS_CREATED}
			if _, err := bs.CreateStep(ctx, task, st, func(*tasksv1.Task, *tasksv1.Step) error { return nil }); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := bs.Close(); err != nil {
		t.Fatal(err)
	}
	base := runtime.NumGoroutine()
	const inFlight = 4
	s, fd := newTestServer(t, dir, Options{MaxInFlight: inFlight})
	if err := s.Start(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	poll(t, "attempts in flight", func() bool { return fd.total() >= inFlight })
	if n := runtime.NumGoroutine() - base; n > inFlight+8 {
		t.Errorf("%d goroutines after Start with 300 pending steps and %d in flight; want about %d", n, inFlight, inFlight)
	}
}

func TestCreateStep_capsWaitingStepsPerAgent(t *testing.T) {
	s, _ := newTestServer(t, t.TempDir(), Options{RetryMax: 5 * time.Millisecond, MaxWaitingSteps: 3})
	task := createTask(t, s, agentNone)
	for i := range 3 {
		if st, err := createStep(t, s, task, 5*time.Second); err != nil || st.GetStatusMessage() == "" {
			t.Fatalf("step %d = %v, %v; want it waiting", i, st, err)
		}
	}
	_, err := createStep(t, s, task, 0)
	if status.Code(err) != codes.ResourceExhausted || grpcerr.Reason(err) != "TOO_MANY_WAITING_STEPS" {
		t.Fatalf("fourth waiting step = %v; want RESOURCE_EXHAUSTED TOO_MANY_WAITING_STEPS", err)
	}
	if resp, err := s.ListSteps(t.Context(), &tasksv1.ListStepsRequest{Parent: task}); err != nil || resp.GetTotalSize() != 3 {
		t.Errorf("steps after refusal = %d, %v; want 3", resp.GetTotalSize(), err)
	}
	if st, err := createStep(t, s, createTask(t, s, agentOK), 5*time.Second); err != nil || st.GetStatus() != tasksv1.Step_STATUS_COMPLETED {
		t.Errorf("step of another agent = %v, %v; want completed", st, err)
	}
}

// The adapter says what is down: each dispatcher status maps to one
// scheduler sentinel, or to a step-level failure.
func TestFromDispatcher(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want error // nil: a *scheduler.StepError
	}{
		{grpcerr.New(codes.FailedPrecondition, "x", "NO_EXECUTOR", "d", nil), scheduler.ErrNoExecutor},
		{grpcerr.New(codes.Unavailable, "x", "LLM_FAILED", "d", nil), scheduler.ErrLLMUnavailable},
		{status.Error(codes.Unavailable, "x"), scheduler.ErrDispatcherUnavailable},
		{status.Error(codes.Unimplemented, "x"), scheduler.ErrNotSupported},
		{status.Error(codes.NotFound, "x"), scheduler.ErrAgentUnavailable},
		{grpcerr.New(codes.FailedPrecondition, "x", "OTHER", "d", nil), nil},
		{grpcerr.New(codes.Aborted, "x", "HANDLER_FAILED", "d", nil), nil},
		{grpcerr.New(codes.DeadlineExceeded, "x", "HANDLER_TIMEOUT", "d", nil), nil},
		{status.Error(codes.DeadlineExceeded, "x"), nil},
		{status.Error(codes.InvalidArgument, "x"), nil},
	} {
		got := fromDispatcher(tc.err)
		var se *scheduler.StepError
		switch {
		case tc.want != nil && !errors.Is(got, tc.want):
			t.Errorf("fromDispatcher(%v) = %v; want %v", tc.err, got, tc.want)
		case tc.want == nil && (!errors.As(got, &se) || se.Code != status.Code(tc.err).String() || se.Reason != grpcerr.Reason(tc.err)):
			t.Errorf("fromDispatcher(%v) = %v; want a StepError with its code and reason", tc.err, got)
		}
	}
}

// The cap counts an agent's queued and running steps, not only waiting
// ones, so concurrent creates while the first attempt is in flight cannot
// overshoot it; and the agent, not known to have an executor, gets one
// attempt at a time.
func TestCreateStep_capHoldsUnderConcurrentCreates(t *testing.T) {
	// The clock never moves, so no probe falls due again: once the
	// scheduler is idle, nothing more can happen.
	s, fd := newTestServer(t, t.TempDir(), Options{RetryMax: time.Hour, MaxWaitingSteps: 3, Clock: stoppedClock{}})
	release := make(chan struct{})
	fd.fn = func(context.Context, *dispatcherv1.ExecuteStepRequest) (*dispatcherv1.ExecuteStepResponse, error) {
		<-release // a slow dispatcher: every create arrives during the first attempt
		return nil, grpcerr.New(codes.FailedPrecondition, "no executor", "NO_EXECUTOR", "d", nil)
	}
	task := createTask(t, s, agentNone)
	var wg sync.WaitGroup
	var mu sync.Mutex
	accepted, refused := 0, 0
	for range 200 {
		wg.Go(func() {
			_, err := createStep(t, s, task, 0)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				accepted++
			case status.Code(err) == codes.ResourceExhausted:
				refused++
			default:
				t.Errorf("CreateStep: %v", err)
			}
		})
	}
	wg.Wait()
	if accepted != 3 || refused != 197 {
		t.Errorf("accepted %d, refused %d of 200 concurrent creates with cap 3; want 3 and 197", accepted, refused)
	}
	close(release)
	poll(t, "the scheduler goes idle", s.sched.Idle)
	if calls, distinct := fd.count(agentNone); distinct != 1 || calls > 3 {
		t.Errorf("ExecuteStep ran %d distinct steps in %d calls; want 1 step (the probe), at most 3 calls", distinct, calls)
	}
	if n := s.sched.Pending(agentNone); n != 3 {
		t.Errorf("pending = %d; want 3", n)
	}
}

// Completed steps leave the count: a cap of 1 still takes one step after
// another.
func TestCreateStep_capReleasesCompletedSteps(t *testing.T) {
	s, _ := newTestServer(t, t.TempDir(), Options{MaxWaitingSteps: 1})
	task := createTask(t, s, agentOK)
	for i := range 3 {
		if st, err := createStep(t, s, task, 5*time.Second); err != nil || st.GetStatus() != tasksv1.Step_STATUS_COMPLETED {
			t.Fatalf("step %d = %v, %v; want completed", i, st, err)
		}
	}
	if n := s.sched.Pending(agentOK); n != 0 {
		t.Errorf("pending = %d after the steps completed; want 0", n)
	}
}

// A request without a step (gRPC callers may omit it) is an empty step, not
// a panic: the permission matrix in cmd/parley found the nil dereference.
func TestCreateStep_withoutStep(t *testing.T) {
	s, _ := newTestServer(t, t.TempDir(), Options{RetryMax: 5 * time.Millisecond})
	if _, err := s.CreateStep(t.Context(), &tasksv1.CreateStepRequest{Parent: "tasks/none"}); status.Code(err) != codes.NotFound {
		t.Errorf("CreateStep(tasks/none, no step) error = %v, want NOT_FOUND", err)
	}
	task := createTask(t, s, agentOK)
	if st, err := s.CreateStep(t.Context(), &tasksv1.CreateStepRequest{Parent: task}); err != nil || st.GetName() == "" {
		t.Errorf("CreateStep(%s, no step) = %v, %v; want a step", task, st, err)
	}
}
