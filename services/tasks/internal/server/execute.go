package server

import (
	"bytes"
	"context"
	"encoding/json"
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

// retryMin is the first wait before another attempt at an agent's waiting
// steps; it doubles per failed attempt up to Options.RetryMax.
const retryMin = 100 * time.Millisecond

// executor hands pending steps to the dispatcher. Attempts start from one
// FIFO queue, at most Options.MaxInFlight at a time, each on its own
// goroutine; nothing else holds a goroutine or a timer per step.
//
// Failures are of two kinds. An agent-level failure (FAILED_PRECONDITION
// NO_EXECUTOR, UNAVAILABLE, UNIMPLEMENTED, NOT_FOUND: see agentLevel) says
// nothing about the step: the step waits, CREATED in the store with a
// status_message saying why, in its agent's waiting list. Any other failure
// (the handler failed or timed out, bad input, ...) is the step's own: the
// step alone backs off and is retried, at most Options.MaxStepAttempts
// attempts in all, then completes with an output explaining the failure
// (see failStep); other steps of its agent run meanwhile.
//
// Waiting is per agent: one loop goroutine
// probes each waiting agent once per backoff interval (doubling from
// retryMin to Options.RetryMax; at once to RetryMax when the dispatcher does
// not know the agent) by retrying its oldest waiting step. When the probe
// completes, the agent's other waiting steps are queued; until then new
// steps of that agent join the list without an ExecuteStep call. An agent
// not known to have an executor (no attempt of it reached one since it last
// waited) gets one probe at a time too: its first attempt is its probe. A waiting
// step's store record is written only when its status_message changes.
//
// Pending steps are in the store, so they survive restarts (Server.Start
// queues them). Execution is at least once: a crash between ExecuteStep and
// the commit of its result runs the step again after restart.
type executor struct {
	s      *Server
	client dispatcherv1.DispatcherServiceClient
	ctx    context.Context // ends on close
	cancel context.CancelFunc
	wake   chan struct{} // nudges the loop; capacity 1
	loopWG sync.WaitGroup
	wg     sync.WaitGroup // running attempts

	mu       sync.Mutex // guards the fields below
	closed   bool
	ready    []job                  // attempts to start, oldest first
	inFlight int                    // attempts running
	queued   map[store.StepRef]bool // ready, running or waiting
	running  map[store.StepRef]bool // calling ExecuteStep
	agents   map[string]*agentWaits // by agent name
	waiters  map[store.StepRef][]chan struct{}
	known    map[string]bool             // agents whose last attempt reached an executor
	backoff  map[store.StepRef]time.Time // steps retried after a step-level failure, when due
	tries    map[store.StepRef]int       // failed attempts of a step, step-level
	agentOf  map[store.StepRef]string    // agent of each queued step, once known
	count    map[string]int              // queued steps per agent, plus reservations
}

// job is one attempt at a step; probe names the agent when the attempt is
// that agent's probe.
type job struct {
	ref   store.StepRef
	probe string
}

// agentWaits are an agent's waiting steps and the backoff of its probes.
type agentWaits struct {
	steps   []store.StepRef // oldest first; steps[0] is the next probe
	failed  int             // failed probes in a row
	due     time.Time       // next probe
	probing bool            // a probe is running
	msg     string          // why the agent's steps wait
}

func newExecutor(s *Server, client dispatcherv1.DispatcherServiceClient) *executor {
	ctx, cancel := context.WithCancel(context.Background())
	e := &executor{
		s: s, client: client, ctx: ctx, cancel: cancel,
		wake:    make(chan struct{}, 1),
		queued:  map[store.StepRef]bool{},
		running: map[store.StepRef]bool{},
		agents:  map[string]*agentWaits{},
		waiters: map[store.StepRef][]chan struct{}{},
		known:   map[string]bool{},
		backoff: map[store.StepRef]time.Time{},
		tries:   map[store.StepRef]int{},
		agentOf: map[store.StepRef]string{},
		count:   map[string]int{},
	}
	e.loopWG.Add(1)
	go e.loop()
	return e
}

func (e *executor) nudge() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// reserve counts a step of agent about to be submitted, unless agent
// already has max steps queued, running or waiting; it reports whether it
// did. The reservation passes to submit(ref, agent), or unreserve undoes it.
func (e *executor) reserve(agent string, limit int) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.count[agent] >= limit {
		return false
	}
	e.count[agent]++
	return true
}

func (e *executor) unreserve(agent string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.uncountLocked(agent)
}

func (e *executor) uncountLocked(agent string) {
	if e.count[agent]--; e.count[agent] <= 0 {
		delete(e.count, agent)
	}
}

// forgetLocked drops every trace of ref once no attempt at it is queued.
func (e *executor) forgetLocked(ref store.StepRef) {
	if !e.queued[ref] {
		return
	}
	delete(e.queued, ref)
	delete(e.running, ref)
	delete(e.tries, ref)
	delete(e.backoff, ref)
	if agent, ok := e.agentOf[ref]; ok {
		delete(e.agentOf, ref)
		e.uncountLocked(agent)
	}
}

// submit queues an attempt at ref unless one is already queued. agent is
// ref's agent with a reservation made by reserve, or "" (resumed steps:
// counted once an attempt loads the task).
func (e *executor) submit(ref store.StepRef, agent string) {
	e.mu.Lock()
	if e.closed || e.queued[ref] {
		if agent != "" {
			e.uncountLocked(agent)
		}
		e.mu.Unlock()
		return
	}
	e.queued[ref] = true
	if agent != "" {
		e.agentOf[ref] = agent
	}
	e.ready = append(e.ready, job{ref: ref})
	e.mu.Unlock()
	e.nudge()
}

// pending returns how many steps of agent are queued, running or waiting.
func (e *executor) pending(agent string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.count[agent]
}

// loop starts due probes and ready attempts, then sleeps until the next
// probe is due or something changes.
func (e *executor) loop() {
	defer e.loopWG.Done()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		e.mu.Lock()
		now := time.Now()
		var next time.Time
		for agent, w := range e.agents {
			switch {
			case w.probing:
			case len(w.steps) == 0:
				delete(e.agents, agent)
			case !w.due.After(now):
				w.probing = true
				e.ready = append(e.ready, job{ref: w.steps[0], probe: agent})
			case next.IsZero() || w.due.Before(next):
				next = w.due
			}
		}
		for ref, due := range e.backoff {
			if !due.After(now) {
				delete(e.backoff, ref)
				e.ready = append(e.ready, job{ref: ref})
			} else if next.IsZero() || due.Before(next) {
				next = due
			}
		}
		for e.inFlight < e.s.opts.MaxInFlight && len(e.ready) > 0 && !e.closed {
			j := e.ready[0]
			e.ready[0] = job{}
			e.ready = e.ready[1:]
			e.inFlight++
			e.wg.Add(1)
			go e.attempt(j)
		}
		if len(e.ready) == 0 {
			e.ready = nil // let the backing array go
		}
		e.mu.Unlock()
		var due <-chan time.Time
		if !next.IsZero() {
			timer.Reset(time.Until(next))
			due = timer.C
		}
		select {
		case <-e.wake:
		case <-due:
		case <-e.ctx.Done():
			return
		}
		timer.Stop()
	}
}

// waiter returns a channel closed when ref's next attempt settles: the step
// completed, or it waits.
func (e *executor) waiter(ref store.StepRef) <-chan struct{} {
	ch := make(chan struct{})
	e.mu.Lock()
	defer e.mu.Unlock()
	e.waiters[ref] = append(e.waiters[ref], ch)
	return ch
}

// settle wakes ref's waiters.
func (e *executor) settle(ref store.StepRef) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.settleLocked(ref)
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

// removeLocked drops refs matching drop from w, except a running probe.
func (e *executor) removeLocked(w *agentWaits, drop func(store.StepRef) bool) {
	kept := w.steps[:0]
	for i, ref := range w.steps {
		if drop(ref) && !(i == 0 && w.probing) {
			e.forgetLocked(ref)
			e.settleLocked(ref)
			continue
		}
		kept = append(kept, ref)
	}
	clear(w.steps[len(kept):])
	w.steps = kept
}

// dropTask forgets the waiting steps of a cancelled task.
func (e *executor) dropTask(taskID string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, w := range e.agents {
		e.removeLocked(w, func(ref store.StepRef) bool { return ref.TaskID == taskID })
	}
	for ref := range e.backoff {
		if ref.TaskID == taskID {
			e.forgetLocked(ref)
			e.settleLocked(ref)
		}
	}
}

func (e *executor) close() {
	e.mu.Lock()
	e.closed = true
	e.mu.Unlock()
	e.cancel()
	e.loopWG.Wait()
	e.wg.Wait()
}

// done ends attempt j at a step that needs no more attempts (completed,
// gone, cancelled, or shutting down).
func (e *executor) done(j job) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.forgetLocked(j.ref)
	e.settleLocked(j.ref)
	if w := e.agents[j.probe]; isProbe(w, j) {
		w.probing = false // the next probe is due at once: w.due has passed
		w.steps[0] = store.StepRef{}
		w.steps = w.steps[1:]
	}
}

func (e *executor) attempt(j job) {
	defer e.wg.Done()
	defer func() {
		e.mu.Lock()
		e.inFlight--
		e.mu.Unlock()
		e.nudge()
	}()
	ctx, ref := e.ctx, j.ref
	t, err := e.s.store.GetTask(ctx, ref.TaskID)
	var st *tasksv1.Step
	if err == nil {
		st, err = e.s.store.GetStep(ctx, ref)
	}
	if err != nil {
		if ctx.Err() == nil {
			e.s.logger.ErrorContext(ctx, "load pending step", slog.String("task", ref.TaskID), slog.String("step", ref.StepID), slog.Any("err", err))
		}
		e.done(j)
		return
	}
	if st.GetStatus() != tasksv1.Step_STATUS_CREATED || t.GetState() != tasksv1.Task_STATE_ACTIVE {
		e.done(j)
		return
	}
	agent := t.GetAgent()
	e.mu.Lock()
	if _, ok := e.agentOf[ref]; !ok && e.queued[ref] { // resumed: count it now
		e.agentOf[ref] = agent
		e.count[agent]++
	}
	w := e.agents[agent]
	if w == nil && j.probe == "" && !e.known[agent] {
		// Nothing says the agent has an executor: this attempt is its
		// probe, and its other steps join the list until it ends.
		w = &agentWaits{steps: []store.StepRef{ref}, probing: true}
		e.agents[agent] = w
		j.probe = agent
	} else if w != nil && j.probe == "" {
		// The agent is waiting for an executor: join its list; its probe
		// decides for every step.
		w.steps = append(w.steps, ref)
		msg := w.msg
		e.mu.Unlock()
		e.note(ctx, ref, st, msg)
		e.settle(ref)
		return
	}
	e.running[ref] = true
	e.mu.Unlock()
	if e.s.hub.watched(ref.TaskID) {
		running := proto.CloneOf(st)
		running.Status, running.StatusMessage = tasksv1.Step_STATUS_RUNNING, ""
		e.s.hub.publish(ref.TaskID, running)
	}

	cctx, cancel := context.WithTimeout(ctx, e.s.opts.StepTimeout)
	resp, err := e.client.ExecuteStep(cctx, &dispatcherv1.ExecuteStepRequest{
		Agent:               agent,
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
	switch {
	case err == nil:
		e.done(j)
		e.release(agent)
	case ctx.Err() != nil: // shutting down: the step stays pending
		e.done(j)
	case agentLevel(err):
		e.park(ctx, j, t, st, err)
	default:
		e.stepFailed(ctx, j, t, st, err)
	}
}

// agentLevel reports whether err from ExecuteStep is about the agent (no
// executor, dispatcher down or not yet able to execute, agent unknown)
// rather than about the step: only such errors put the agent's steps on
// its waiting list.
func agentLevel(err error) bool {
	switch status.Code(err) {
	case codes.FailedPrecondition:
		return grpcerr.Reason(err) == "NO_EXECUTOR"
	case codes.Unavailable, codes.Unimplemented, codes.NotFound:
		return true
	}
	return false
}

// stepFailed handles a step-level failure of attempt j: an executor exists,
// so the agent's waiting steps go ahead, and the step alone backs off
// (doubling from retryMin to RetryMax) or, after MaxStepAttempts attempts,
// completes with the failure as its output.
func (e *executor) stepFailed(ctx context.Context, j job, t *tasksv1.Task, st *tasksv1.Step, cause error) {
	ref, agent := j.ref, t.GetAgent()
	e.mu.Lock()
	delete(e.running, ref)
	if w := e.agents[agent]; isProbe(w, j) {
		w.probing = false
		w.steps[0] = store.StepRef{}
		w.steps = w.steps[1:]
	}
	if e.closed { // shutting down: the step stays pending
		e.mu.Unlock()
		e.done(j)
		return
	}
	e.tries[ref]++
	n := e.tries[ref]
	last := n >= e.s.opts.MaxStepAttempts
	if !last {
		e.backoff[ref] = time.Now().Add(min(retryMin<<min(n-1, 20), e.s.opts.RetryMax))
	}
	e.mu.Unlock()
	e.release(agent)
	if last {
		e.s.logger.WarnContext(ctx, "step failed; giving up", slog.String("agent", agent), slog.String("task", ref.TaskID), slog.String("step", ref.StepID), slog.Int("attempts", n), slog.Any("err", cause))
		if err := e.failStep(ctx, ref, cause, n); err != nil && ctx.Err() == nil {
			e.s.logger.ErrorContext(ctx, "store failed step", slog.String("task", ref.TaskID), slog.String("step", ref.StepID), slog.Any("err", err))
		}
		e.done(j)
		return
	}
	e.s.metrics.attempts.WithLabelValues("retrying").Inc()
	e.s.logger.InfoContext(ctx, "step attempt failed; will retry", slog.String("agent", agent), slog.String("task", ref.TaskID), slog.String("step", ref.StepID), slog.Int("attempts", n), slog.Any("err", cause))
	e.note(ctx, ref, st, fmt.Sprintf("retrying: attempt %d of %d failed (%s: %s); the step stays created and is retried automatically", n, e.s.opts.MaxStepAttempts, status.Code(cause), status.Convert(cause).Message()))
	e.settle(ref)
	e.nudge()
}

// failStep completes a step that failed MaxStepAttempts times. The Agent
// Protocol has no failed status, so the step is completed (not last: the
// task stays open for another step) with the failure in output and, as
// {"error": {...}}, in additional_output.
func (e *executor) failStep(ctx context.Context, ref store.StepRef, cause error, attempts int) error {
	s := status.Convert(cause)
	out := fmt.Sprintf("The step failed after %d attempts and was not completed: %s (%s). Post a new step to try again.", attempts, s.Message(), s.Code())
	extra, err := json.Marshal(map[string]any{"error": map[string]any{
		"code": s.Code().String(), "reason": grpcerr.Reason(cause), "message": s.Message(), "attempts": attempts,
	}})
	if err != nil {
		return err
	}
	now := timestamppb.New(e.s.now())
	cur, err := e.s.store.UpdateStep(ctx, ref, func(_ *tasksv1.Task, st *tasksv1.Step) ([]*tasksv1.Artifact, error) {
		if st.GetStatus() != tasksv1.Step_STATUS_CREATED {
			return nil, nil
		}
		st.Status = tasksv1.Step_STATUS_COMPLETED
		st.Output = proto.String(out)
		st.AdditionalOutputJson = extra
		st.StatusMessage = ""
		st.UpdateTime = now
		return nil, nil
	})
	if err != nil {
		return err
	}
	e.s.metrics.attempts.WithLabelValues("failed").Inc()
	e.s.hub.publish(ref.TaskID, cur)
	return nil
}

// isProbe reports whether j is the running probe of w (the list may have
// been released and started afresh while j ran).
func isProbe(w *agentWaits, j job) bool {
	return w != nil && j.probe != "" && w.probing && len(w.steps) > 0 && w.steps[0] == j.ref
}

// release queues every waiting step of agent: a step of it just ran.
func (e *executor) release(agent string) {
	e.mu.Lock()
	e.known[agent] = true
	w := e.agents[agent]
	if w == nil {
		e.mu.Unlock()
		return
	}
	delete(e.agents, agent)
	for i, ref := range w.steps {
		if i == 0 && w.probing {
			continue // still running; its attempt ends by itself
		}
		e.ready = append(e.ready, job{ref: ref})
	}
	e.mu.Unlock()
	e.nudge()
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
	case code == codes.Unavailable:
		return "waiting: the dispatcher is unavailable; the step stays created and is retried automatically"
	default:
		return fmt.Sprintf("waiting: the last attempt failed (%s); the step stays created and is retried automatically", code)
	}
}

// park puts the step of failed attempt j on its agent's waiting list. A
// probe, or the attempt that starts the list, sets the agent's next probe.
func (e *executor) park(ctx context.Context, j job, t *tasksv1.Task, st *tasksv1.Step, cause error) {
	ref, agent := j.ref, t.GetAgent()
	e.s.metrics.attempts.WithLabelValues("waiting").Inc()
	msg := parkMessage(agent, cause)
	code := status.Code(cause)
	e.mu.Lock()
	delete(e.running, ref)
	delete(e.known, agent)
	w := e.agents[agent]
	fresh := w == nil
	if fresh {
		w = &agentWaits{}
		e.agents[agent] = w
	}
	probe := isProbe(w, j)
	if probe {
		w.probing = false
		if !w.due.IsZero() { // not an unknown agent's first attempt
			w.failed++
		}
	} else {
		w.steps = append(w.steps, ref)
	}
	if probe || fresh {
		delay := min(retryMin<<min(w.failed, 20), e.s.opts.RetryMax)
		if code == codes.NotFound { // an agent nobody registered: back off fully
			delay = e.s.opts.RetryMax
		}
		w.due = time.Now().Add(delay)
		w.msg = msg
	}
	if e.closed {
		e.forgetLocked(ref)
	}
	failed := w.failed
	e.mu.Unlock()
	e.nudge()
	// Say it once per agent; probes of an agent still waiting are debug noise.
	level := slog.LevelDebug
	if failed == 0 {
		level = slog.LevelInfo
		if code != codes.FailedPrecondition && code != codes.Unimplemented {
			level = slog.LevelWarn
		}
	}
	e.s.logger.Log(ctx, level, "step waits; will retry", slog.String("agent", agent), slog.String("task", ref.TaskID), slog.String("step", ref.StepID), slog.Int("failed_probes", failed), slog.Any("err", cause))
	e.note(ctx, ref, st, msg)
	e.settle(ref)
}

// note stores msg as the waiting step's status_message, unless st (as
// loaded by this attempt) already says it: an unchanged step costs no
// write.
func (e *executor) note(ctx context.Context, ref store.StepRef, st *tasksv1.Step, msg string) {
	if st.GetStatusMessage() == msg {
		return
	}
	cur, err := e.s.store.UpdateStep(ctx, ref, func(_ *tasksv1.Task, st *tasksv1.Step) ([]*tasksv1.Artifact, error) {
		if st.GetStatus() == tasksv1.Step_STATUS_CREATED && st.StatusMessage != msg {
			st.StatusMessage = msg
			st.UpdateTime = timestamppb.New(e.s.now())
		}
		return nil, nil
	})
	if err == nil {
		e.s.hub.publish(ref.TaskID, cur)
	}
}
