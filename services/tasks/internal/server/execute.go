package server

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	tasksv1 "github.com/parleyhq/parley/gen/parley/tasks/v1"
	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/services/tasks/internal/artifactfs"
	"github.com/parleyhq/parley/services/tasks/internal/store"
)

// retryMin is the first wait before another attempt at a parked step; it
// doubles per attempt up to Options.RetryMax.
const retryMin = 100 * time.Millisecond

// executor hands pending steps to the dispatcher. A step whose attempt fails
// (no executor for its agent yet, dispatcher down, ...) is parked: it stays
// CREATED in the store, with a status_message saying why, and is retried
// after a bounded, doubling backoff. Pending steps are in the store, so they
// survive restarts (Server.Start resubmits them).
//
// Execution is at least once: a crash between ExecuteStep and the commit of
// its result runs the step again after restart.
type executor struct {
	s      *Server
	client dispatcherv1.DispatcherServiceClient
	ctx    context.Context // ends on close
	cancel context.CancelFunc
	sem    chan struct{} // bounds concurrent ExecuteStep calls
	wg     sync.WaitGroup

	mu      sync.Mutex // guards the fields below
	closed  bool
	queued  map[store.StepRef]bool // submitted, running or parked
	running map[store.StepRef]bool
	timers  map[store.StepRef]*time.Timer
	waiters map[store.StepRef][]chan struct{}
}

func newExecutor(s *Server, client dispatcherv1.DispatcherServiceClient) *executor {
	ctx, cancel := context.WithCancel(context.Background())
	return &executor{
		s: s, client: client, ctx: ctx, cancel: cancel,
		sem:     make(chan struct{}, s.opts.MaxInFlight),
		queued:  map[store.StepRef]bool{},
		running: map[store.StepRef]bool{},
		timers:  map[store.StepRef]*time.Timer{},
		waiters: map[store.StepRef][]chan struct{}{},
	}
}

// submit starts an attempt at ref unless one is already queued.
func (e *executor) submit(ref store.StepRef, attempt int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed || e.queued[ref] {
		return
	}
	e.queued[ref] = true
	e.wg.Add(1)
	go e.run(ref, attempt)
}

// waiter returns a channel closed when ref's next attempt settles: the step
// completed, or it was parked.
func (e *executor) waiter(ref store.StepRef) <-chan struct{} {
	ch := make(chan struct{})
	e.mu.Lock()
	defer e.mu.Unlock()
	e.waiters[ref] = append(e.waiters[ref], ch)
	return ch
}

func (e *executor) settleLocked(ref store.StepRef) {
	for _, ch := range e.waiters[ref] {
		close(ch)
	}
	delete(e.waiters, ref)
}

// overlay shows a stored CREATED step as RUNNING while an attempt runs.
// Running is not persisted: after a crash the step is CREATED and pending.
func (e *executor) overlay(ref store.StepRef, st *tasksv1.Step) *tasksv1.Step {
	if st.GetStatus() != tasksv1.Step_STATUS_CREATED {
		return st
	}
	e.mu.Lock()
	running := e.running[ref]
	e.mu.Unlock()
	if running {
		st.Status = tasksv1.Step_STATUS_RUNNING
		st.StatusMessage = ""
	}
	return st
}

// dropTask forgets the parked steps of a cancelled task.
func (e *executor) dropTask(taskID string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for ref, t := range e.timers {
		if ref.TaskID == taskID && t.Stop() {
			delete(e.timers, ref)
			delete(e.queued, ref)
			e.settleLocked(ref)
		}
	}
}

func (e *executor) close() {
	e.mu.Lock()
	e.closed = true
	for ref, t := range e.timers {
		t.Stop()
		delete(e.timers, ref)
	}
	e.mu.Unlock()
	e.cancel()
	e.wg.Wait()
}

// finish ends an attempt that will not be retried.
func (e *executor) finish(ref store.StepRef) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.queued, ref)
	delete(e.running, ref)
	e.settleLocked(ref)
}

func (e *executor) run(ref store.StepRef, attempt int) {
	defer e.wg.Done()
	select {
	case e.sem <- struct{}{}:
	case <-e.ctx.Done():
		e.finish(ref)
		return
	}
	defer func() { <-e.sem }()
	ctx := e.ctx
	t, err := e.s.store.GetTask(ctx, ref.TaskID)
	var st *tasksv1.Step
	if err == nil {
		st, err = e.s.store.GetStep(ctx, ref)
	}
	if err != nil {
		if ctx.Err() == nil {
			e.s.logger.ErrorContext(ctx, "load pending step", slog.String("task", ref.TaskID), slog.String("step", ref.StepID), slog.Any("err", err))
		}
		e.finish(ref)
		return
	}
	if st.GetStatus() != tasksv1.Step_STATUS_CREATED || t.GetState() != tasksv1.Task_STATE_ACTIVE {
		e.finish(ref)
		return
	}
	e.mu.Lock()
	e.running[ref] = true
	e.mu.Unlock()
	if e.s.hub.watched(ref.TaskID) {
		running := proto.CloneOf(st)
		running.Status, running.StatusMessage = tasksv1.Step_STATUS_RUNNING, ""
		e.s.hub.publish(ref.TaskID, running)
	}

	cctx, cancel := context.WithTimeout(ctx, e.s.opts.StepTimeout)
	resp, err := e.client.ExecuteStep(cctx, &dispatcherv1.ExecuteStepRequest{
		Agent:               t.GetAgent(),
		TaskId:              ref.TaskID,
		StepId:              ref.StepID,
		TaskInput:           t.GetInput(),
		Input:               st.GetInput(),
		AdditionalInputJson: st.GetAdditionalInputJson(),
	})
	cancel()
	if err == nil {
		err = e.complete(ctx, ref, t, resp)
	}
	if err != nil {
		if ctx.Err() != nil { // shutting down: the step stays pending
			e.finish(ref)
			return
		}
		e.park(ctx, ref, t, attempt, err)
	}
}

// complete stores the agent's files durably, then the step's result, in
// that order, so the step never points at missing bytes.
func (e *executor) complete(ctx context.Context, ref store.StepRef, t *tasksv1.Task, resp *dispatcherv1.ExecuteStepResponse) error {
	now := timestamppb.New(e.s.now())
	var arts []*tasksv1.Artifact
	for _, a := range resp.GetArtifacts() {
		rel, err := artifactfs.CleanRelativePath(a.GetRelativePath())
		if err == nil {
			_, err = artifactfs.CleanFileName(a.GetFileName())
		}
		if err != nil {
			e.s.logger.WarnContext(ctx, "dropped an agent artifact with a bad name", slog.String("task", ref.TaskID), slog.String("step", ref.StepID), slog.Any("err", err))
			continue
		}
		id := e.s.ids.next()
		size, err := e.s.files.Write(ref.TaskID, id, bytes.NewReader(a.GetContent()), e.s.opts.MaxUploadBytes)
		if err != nil {
			return fmt.Errorf("store agent artifact: %w", err)
		}
		arts = append(arts, &tasksv1.Artifact{
			Name:         t.GetName() + "/artifacts/" + id,
			FileName:     a.GetFileName(),
			RelativePath: rel,
			AgentCreated: true,
			SizeBytes:    size,
			CreateTime:   now,
		})
	}
	out := resp.GetAdditionalOutputJson()
	if !checkObject(out) {
		e.s.logger.WarnContext(ctx, "dropped additional_output that is not a JSON object", slog.String("task", ref.TaskID), slog.String("step", ref.StepID))
		out = nil
	}
	st, err := e.s.store.UpdateStep(ctx, ref, func(t *tasksv1.Task, st *tasksv1.Step) ([]*tasksv1.Artifact, error) {
		if st.GetStatus() != tasksv1.Step_STATUS_CREATED {
			return nil, nil // completed by an earlier attempt
		}
		st.Status = tasksv1.Step_STATUS_COMPLETED
		st.Output = proto.String(resp.GetOutput())
		st.AdditionalOutputJson = bytes.TrimSpace(out)
		st.IsLast = resp.GetIsLast()
		st.StepName = resp.GetStepName()
		st.StatusMessage = ""
		st.Artifacts = arts
		st.UpdateTime = now
		if st.IsLast && t.State == tasksv1.Task_STATE_ACTIVE {
			t.State = tasksv1.Task_STATE_FINISHED
			t.UpdateTime = now
		}
		if len(arts) > 0 {
			t.UpdateTime = now
		}
		return arts, nil
	})
	if err != nil {
		return fmt.Errorf("store step result: %w", err)
	}
	e.finish(ref)
	e.s.metrics.attempts.WithLabelValues("completed").Inc()
	e.s.hub.publish(ref.TaskID, st)
	return nil
}

// parkMessage explains to the step's reader why it is still created.
func parkMessage(agent string, err error) string {
	code := status.Code(err)
	switch {
	case code == codes.FailedPrecondition && grpcerr.Reason(err) == "NO_EXECUTOR":
		return fmt.Sprintf("waiting: no executor is connected for agent %s yet; the step stays created and runs when one connects", agent)
	case code == codes.Unimplemented:
		return "waiting: the dispatcher cannot execute steps yet; the step stays created and is retried automatically"
	case code == codes.NotFound:
		return fmt.Sprintf("waiting: the dispatcher does not know agent %s; the step stays created and is retried automatically", agent)
	case code == codes.Unavailable, code == codes.DeadlineExceeded:
		return "waiting: the dispatcher is unavailable or timed out; the step stays created and is retried automatically"
	default:
		return fmt.Sprintf("waiting: the last attempt failed (%s); the step stays created and is retried automatically", code)
	}
}

// park records why the step waits, wakes its waiters and schedules another
// attempt.
func (e *executor) park(ctx context.Context, ref store.StepRef, t *tasksv1.Task, attempt int, cause error) {
	e.s.metrics.attempts.WithLabelValues("waiting").Inc()
	msg := parkMessage(t.GetAgent(), cause)
	// Say it once per step; retries of a step still waiting are debug noise.
	level := slog.LevelDebug
	if attempt == 0 {
		level = slog.LevelInfo
		if c := status.Code(cause); c != codes.FailedPrecondition && c != codes.Unimplemented {
			level = slog.LevelWarn
		}
	}
	e.s.logger.Log(ctx, level, "step parked; will retry", slog.String("task", ref.TaskID), slog.String("step", ref.StepID), slog.Int("attempt", attempt), slog.Any("err", cause))
	st, err := e.s.store.UpdateStep(ctx, ref, func(_ *tasksv1.Task, st *tasksv1.Step) ([]*tasksv1.Artifact, error) {
		if st.GetStatus() == tasksv1.Step_STATUS_CREATED && st.StatusMessage != msg {
			st.StatusMessage = msg
			st.UpdateTime = timestamppb.New(e.s.now())
		}
		return nil, nil
	})
	if err == nil {
		e.s.hub.publish(ref.TaskID, st)
	}
	delay := min(retryMin<<min(attempt, 20), e.s.opts.RetryMax)
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.running, ref)
	e.settleLocked(ref)
	if e.closed {
		delete(e.queued, ref)
		return
	}
	e.timers[ref] = time.AfterFunc(delay, func() {
		e.mu.Lock()
		if _, ok := e.timers[ref]; !ok { // stopped by dropTask or close
			e.mu.Unlock()
			return
		}
		delete(e.timers, ref)
		delete(e.queued, ref)
		e.mu.Unlock()
		e.submit(ref, attempt+1)
	})
}
