// Package scheduler runs the Agent Protocol's pending steps on their
// agents: it queues attempts, bounds how many run at once, parks the steps
// of an agent that cannot run them yet, retries steps that failed on their
// own, and commits each result. It knows steps, tasks and agents, not gRPC:
// a Runner executes a step and reports agent-level outages through the
// sentinels in runner.go.
//
// Attempts start from one FIFO queue, at most Options.MaxInFlight at a
// time, each on its own goroutine; nothing else holds a goroutine or a
// timer per step.
//
// Failures are of two kinds. An agent-level failure (ErrNoExecutor,
// ErrAgentUnavailable, ErrDispatcherUnavailable, ErrLLMUnavailable,
// ErrNotSupported) says nothing about the step: the step waits, CREATED in
// the store with a status_message saying what is down, in its agent's
// waiting list. Any other failure is the step's own: the step alone backs
// off and is retried, at most Options.MaxStepAttempts attempts in all,
// then completes with an output explaining the failure; other steps of its
// agent run meanwhile.
//
// Waiting is per agent: one loop goroutine probes each waiting agent once
// per backoff interval (doubling from retryMin to Options.RetryMax; at
// once to RetryMax when the agent is unknown) by retrying its oldest
// waiting step. When the probe completes, the agent's other waiting steps
// are queued; until then new steps of that agent join the list without a
// Runner call. An agent not known to have an executor (no attempt of it
// reached one since it last waited) gets one probe at a time too: its first
// attempt is its probe, and steps that arrive meanwhile wait for its
// outcome. A waiting step's store record is written only when its
// status_message changes.
//
// A step whose task is no longer active (finished by another step, or
// cancelled) is not run: it completes with an output saying why. Pending
// steps are in the store, so they survive restarts (Submit them again on
// start). Execution is at least once: a crash between RunStep and the
// commit of its result runs the step again after restart.
package scheduler

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	tasksv1 "github.com/parleyhq/parley/gen/parley/tasks/v1"
	"github.com/parleyhq/parley/platform/jsondepth"
	"github.com/parleyhq/parley/services/tasks/internal/artifactfs"
	"github.com/parleyhq/parley/services/tasks/internal/store"
)

// retryMin is the first wait before another attempt at an agent's waiting
// steps or a failed step; it doubles per failure up to Options.RetryMax.
const retryMin = 100 * time.Millisecond

// Store is what the scheduler reads and writes; store.Store has it.
type Store interface {
	GetTask(ctx context.Context, taskID string) (*tasksv1.Task, error)
	GetStep(ctx context.Context, ref store.StepRef) (*tasksv1.Step, error)
	UpdateStep(ctx context.Context, ref store.StepRef, mutate func(*tasksv1.Task, *tasksv1.Step) ([]*tasksv1.Artifact, error)) (*tasksv1.Step, error)
}

// Files stores the bytes of the files agents produce.
type Files interface {
	Write(taskID, artifactID string, r io.Reader, maxBytes int64) (int64, error)
}

// Events receives every change of a step, for task subscribers.
type Events interface {
	Publish(taskID string, st *tasksv1.Step)
	// Watched reports whether the task has subscribers.
	Watched(taskID string) bool
}

// Options tune a Scheduler. The caller's config owns the defaults: every
// field must be set, except Clock.
type Options struct {
	StepTimeout     time.Duration // bounds one RunStep
	RetryMax        time.Duration // caps every backoff
	MaxInFlight     int           // concurrent RunStep calls
	MaxStepAttempts int           // attempts at a step failing on its own
	MaxUploadBytes  int64         // caps an agent's file
	NewID           func() string // artifact ids
	Now             func() time.Time
	Clock           Clock // nil: real time
}

// Scheduler runs pending steps; see the package comment.
type Scheduler struct {
	store   Store
	files   Files
	run     Runner
	events  Events
	logger  *slog.Logger
	opts    Options
	clock   Clock
	metrics *metrics

	ctx    context.Context // ends on Close
	cancel context.CancelFunc
	wake   chan struct{} // nudges the loop; capacity 1
	loopWG sync.WaitGroup
	wg     sync.WaitGroup // running attempts

	mu       sync.Mutex // guards the fields below
	closed   bool
	ready    []job                  // attempts to start, oldest first
	inFlight int                    // attempts running
	inRunner int                    // attempts inside RunStep
	queued   map[store.StepRef]bool // ready, running, waiting or backing off
	running  map[store.StepRef]bool // in RunStep
	agents   map[string]*agentWaits // by agent name
	waiters  map[store.StepRef][]chan *tasksv1.Step
	known    map[string]bool             // agents whose last attempt reached an executor
	backoff  map[store.StepRef]time.Time // steps retried after a step-level failure, when due
	tries    map[store.StepRef]int       // failed attempts of a step, step-level
	agentOf  map[store.StepRef]string    // agent of each queued step, once known
	count    map[string]int              // queued steps per agent, plus reservations
}

// job is one attempt at a step; probe names the agent when the attempt is
// that agent's probe. task and step, when set, are as the create
// transaction stored them, so the first attempt need not read them again.
type job struct {
	ref   store.StepRef
	probe string
	task  *tasksv1.Task
	step  *tasksv1.Step
}

// agentWaits are an agent's waiting steps and the backoff of its probes.
type agentWaits struct {
	steps   []store.StepRef // oldest first; steps[0] is the next probe
	behind  []store.StepRef // arrived while the first probe runs, before any failure
	failed  int             // failed probes in a row
	due     time.Time       // next probe
	probing bool            // a probe is running
	msg     string          // why the agent's steps wait; "" before any failure
}

// New returns a running Scheduler; Close stops it.
func New(st Store, files Files, run Runner, events Events, logger *slog.Logger, opts Options) *Scheduler {
	ctx, cancel := context.WithCancel(context.Background())
	clock := opts.Clock
	if clock == nil {
		clock = realClock{}
	}
	s := &Scheduler{
		store: st, files: files, run: run, events: events, logger: logger, opts: opts, clock: clock,
		metrics: newMetrics(),
		ctx:     ctx, cancel: cancel,
		wake:    make(chan struct{}, 1),
		queued:  map[store.StepRef]bool{},
		running: map[store.StepRef]bool{},
		agents:  map[string]*agentWaits{},
		waiters: map[store.StepRef][]chan *tasksv1.Step{},
		known:   map[string]bool{},
		backoff: map[store.StepRef]time.Time{},
		tries:   map[store.StepRef]int{},
		agentOf: map[store.StepRef]string{},
		count:   map[string]int{},
	}
	s.loopWG.Add(1)
	go s.loop()
	return s
}

func (s *Scheduler) nudge() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Reserve counts a step of agent about to be stored, unless agent already
// has limit steps queued, running or waiting; it reports whether it did.
// The reservation passes to Submit(ref, agent, ...), or Unreserve undoes it.
func (s *Scheduler) Reserve(agent string, limit int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.count[agent] >= limit {
		return false
	}
	s.count[agent]++
	return true
}

// Unreserve undoes a Reserve whose step was not submitted.
func (s *Scheduler) Unreserve(agent string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.uncountLocked(agent)
}

func (s *Scheduler) uncountLocked(agent string) {
	if s.count[agent]--; s.count[agent] <= 0 {
		delete(s.count, agent)
	}
}

// Pending returns how many steps of agent are queued, running or waiting.
func (s *Scheduler) Pending(agent string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.count[agent]
}

// Scheduled reports whether an attempt at ref is queued, running, waiting
// or backing off: false means no attempt at it will start.
func (s *Scheduler) Scheduled(ref store.StepRef) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.queued[ref]
}

// Idle reports whether no attempt is ready to start and every running one
// waits on its agent (inside RunStep): until a step is submitted, a backoff
// ends or an agent answers, nothing happens.
func (s *Scheduler) Idle() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inFlight == s.inRunner && len(s.ready) == 0
}

// forgetLocked drops every trace of ref once no attempt at it is queued.
func (s *Scheduler) forgetLocked(ref store.StepRef) {
	if !s.queued[ref] {
		return
	}
	delete(s.queued, ref)
	delete(s.running, ref)
	delete(s.tries, ref)
	delete(s.backoff, ref)
	if agent, ok := s.agentOf[ref]; ok {
		delete(s.agentOf, ref)
		s.uncountLocked(agent)
	}
}

// Submit queues an attempt at ref unless one is already queued. agent is
// ref's agent with a reservation made by Reserve, or "" (resumed steps:
// counted once an attempt loads the task). t and st are the task and step
// as just stored, or nil to load them.
func (s *Scheduler) Submit(ref store.StepRef, agent string, t *tasksv1.Task, st *tasksv1.Step) {
	s.mu.Lock()
	if s.closed || s.queued[ref] {
		if agent != "" {
			s.uncountLocked(agent)
		}
		s.mu.Unlock()
		return
	}
	s.queued[ref] = true
	if agent != "" {
		s.agentOf[ref] = agent
	}
	s.ready = append(s.ready, job{ref: ref, task: t, step: st})
	s.mu.Unlock()
	s.nudge()
}

// loop starts due probes and ready attempts, then sleeps until the next
// probe or backoff is due or something changes.
func (s *Scheduler) loop() {
	defer s.loopWG.Done()
	for {
		s.mu.Lock()
		now := s.clock.Now()
		var next time.Time
		for agent, w := range s.agents {
			switch {
			case w.probing:
			case len(w.steps) == 0 && len(w.behind) == 0:
				delete(s.agents, agent)
			case len(w.steps) == 0:
			case !w.due.After(now):
				w.probing = true
				s.ready = append(s.ready, job{ref: w.steps[0], probe: agent})
			case next.IsZero() || w.due.Before(next):
				next = w.due
			}
		}
		for ref, due := range s.backoff {
			if !due.After(now) {
				delete(s.backoff, ref)
				s.ready = append(s.ready, job{ref: ref})
			} else if next.IsZero() || due.Before(next) {
				next = due
			}
		}
		for s.inFlight < s.opts.MaxInFlight && len(s.ready) > 0 && !s.closed {
			j := s.ready[0]
			s.ready[0] = job{}
			s.ready = s.ready[1:]
			s.inFlight++
			s.wg.Add(1)
			go s.attempt(j)
		}
		if len(s.ready) == 0 {
			s.ready = nil // let the backing array go
		}
		s.mu.Unlock()
		var due <-chan time.Time
		stop := func() bool { return false }
		if !next.IsZero() {
			due, stop = s.clock.At(next)
		}
		select {
		case <-s.wake:
		case <-due:
		case <-s.ctx.Done():
			stop()
			return
		}
		stop()
	}
}

// Wait returns a channel that receives ref's step as stored when its next
// attempt settles (the step completed, or it waits), or nil when the
// attempt ended without a step to show.
func (s *Scheduler) Wait(ref store.StepRef) <-chan *tasksv1.Step {
	ch := make(chan *tasksv1.Step, 1)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.waiters[ref] = append(s.waiters[ref], ch)
	return ch
}

func (s *Scheduler) settle(ref store.StepRef, st *tasksv1.Step) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.settleLocked(ref, st)
}

func (s *Scheduler) settleLocked(ref store.StepRef, st *tasksv1.Step) {
	for _, ch := range s.waiters[ref] {
		ch <- st // capacity 1, sent once
	}
	delete(s.waiters, ref)
}

// Overlay shows a stored CREATED step as RUNNING while an attempt runs.
// Running is not persisted: after a crash the step is CREATED and pending.
func (s *Scheduler) Overlay(ref store.StepRef, st *tasksv1.Step) *tasksv1.Step {
	if st.GetStatus() != tasksv1.Step_STATUS_CREATED {
		return st
	}
	s.mu.Lock()
	running := s.running[ref]
	s.mu.Unlock()
	if running {
		st.Status = tasksv1.Step_STATUS_RUNNING
		st.StatusMessage = ""
	}
	return st
}

// DropTask queues the waiting and backing-off steps of a cancelled task
// at once: their attempts find the task cancelled and end them with an
// output saying so, without running them.
func (s *Scheduler) DropTask(taskID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	of := func(ref store.StepRef) bool { return ref.TaskID == taskID }
	for _, w := range s.agents {
		kept := w.steps[:0]
		for i, ref := range w.steps {
			if of(ref) && !(i == 0 && w.probing) {
				s.ready = append(s.ready, job{ref: ref})
				continue
			}
			kept = append(kept, ref)
		}
		clear(w.steps[len(kept):])
		w.steps = kept
	}
	for ref := range s.backoff {
		if of(ref) {
			delete(s.backoff, ref)
			s.ready = append(s.ready, job{ref: ref})
		}
	}
	for i := range s.ready { // preloaded copies say the task is active
		if of(s.ready[i].ref) {
			s.ready[i].task, s.ready[i].step = nil, nil
		}
	}
	s.nudge()
}

// Close stops starting attempts and waits for running ones; steps cut
// short stay pending in the store.
func (s *Scheduler) Close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	s.loopWG.Wait()
	s.wg.Wait()
}

// done ends attempt j at a step that needs no more attempts (completed,
// gone, or shutting down); st is the step as stored, if known.
func (s *Scheduler) done(j job, st *tasksv1.Step) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.forgetLocked(j.ref)
	s.settleLocked(j.ref, st)
	if w := s.agents[j.probe]; isProbe(w, j) {
		w.probing = false // the next probe is due at once: w.due has passed
		w.steps[0] = store.StepRef{}
		w.steps = w.steps[1:]
		for _, b := range w.behind { // no verdict: one of them probes next
			s.ready = append(s.ready, job{ref: b})
		}
		w.behind = nil
	}
}

// load returns j's task and step, as preloaded or from the store.
func (s *Scheduler) load(ctx context.Context, j job) (*tasksv1.Task, *tasksv1.Step, error) {
	if j.task != nil && j.step != nil {
		return j.task, j.step, nil
	}
	t, err := s.store.GetTask(ctx, j.ref.TaskID)
	if err != nil {
		return nil, nil, err
	}
	st, err := s.store.GetStep(ctx, j.ref)
	return t, st, err
}

func (s *Scheduler) attempt(j job) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		s.inFlight--
		s.mu.Unlock()
		s.nudge()
	}()
	ctx, ref := s.ctx, j.ref
	t, st, err := s.load(ctx, j)
	if err != nil {
		if ctx.Err() == nil {
			s.logger.ErrorContext(ctx, "load pending step", slog.String("task", ref.TaskID), slog.String("step", ref.StepID), slog.Any("err", err))
		}
		s.done(j, nil)
		return
	}
	if st.GetStatus() != tasksv1.Step_STATUS_CREATED {
		s.done(j, st)
		return
	}
	if t.GetState() != tasksv1.Task_STATE_ACTIVE {
		s.done(j, s.endInactive(ctx, ref))
		return
	}
	agent := t.GetAgent()
	s.mu.Lock()
	if _, ok := s.agentOf[ref]; !ok && s.queued[ref] { // resumed: count it now
		s.agentOf[ref] = agent
		s.count[agent]++
	}
	w := s.agents[agent]
	switch {
	case j.probe == "" && !s.known[agent] && (w == nil || !w.probing && w.msg == ""):
		// Nothing says the agent has an executor: this attempt is its
		// probe, and its other steps wait for the outcome.
		if w == nil {
			w = &agentWaits{}
			s.agents[agent] = w
		}
		w.steps = append(w.steps, ref) // empty before: no probe failed yet
		w.probing = true
		j.probe = agent
	case w != nil && j.probe == "" && w.msg == "":
		// The agent's first probe runs and nothing failed yet: wait for
		// it without saying anything.
		w.behind = append(w.behind, ref)
		s.mu.Unlock()
		return
	case w != nil && j.probe == "":
		// The agent waits for an executor: join its list; its probe
		// decides for every step.
		w.steps = append(w.steps, ref)
		msg := w.msg
		s.mu.Unlock()
		s.settle(ref, s.note(ctx, ref, st, msg))
		return
	}
	s.running[ref] = true
	s.mu.Unlock()
	if s.events.Watched(ref.TaskID) {
		running := proto.CloneOf(st)
		running.Status, running.StatusMessage = tasksv1.Step_STATUS_RUNNING, ""
		s.events.Publish(ref.TaskID, running)
	}

	cctx, cancel := context.WithTimeout(ctx, s.opts.StepTimeout)
	s.mu.Lock()
	s.inRunner++
	s.mu.Unlock()
	res, err := s.run.RunStep(cctx, Request{
		Agent:           agent,
		TaskID:          ref.TaskID,
		StepID:          ref.StepID,
		TaskInput:       t.GetInput(),
		Input:           st.GetInput(),
		AdditionalInput: st.GetAdditionalInputJson(),
	})
	cancel()
	s.mu.Lock()
	s.inRunner--
	s.mu.Unlock()
	var cur *tasksv1.Step
	if err == nil {
		cur, err = s.complete(ctx, ref, t, res)
	}
	switch {
	case err == nil:
		s.done(j, cur)
		s.release(agent)
	case ctx.Err() != nil: // shutting down: the step stays pending
		s.done(j, nil)
	case agentLevel(err):
		s.park(ctx, j, agent, st, err)
	default:
		s.stepFailed(ctx, j, agent, st, err)
	}
}

// FinishedOutput is the output of a step of a task that takes no more
// steps: finished by an is_last step, or cancelled.
func FinishedOutput(t *tasksv1.Task) string {
	if t.GetState() == tasksv1.Task_STATE_CANCELLED {
		return "This task was cancelled; the step was not run. Create a new task to continue."
	}
	return "This task is finished: an earlier step was its last (is_last), so the step was not run. Create a new task to continue."
}

// endInactive completes a pending step of a task that is no longer active
// with an output saying why, and returns it as stored.
func (s *Scheduler) endInactive(ctx context.Context, ref store.StepRef) *tasksv1.Step {
	now := timestamppb.New(s.opts.Now())
	cur, err := s.store.UpdateStep(ctx, ref, func(t *tasksv1.Task, st *tasksv1.Step) ([]*tasksv1.Artifact, error) {
		if st.GetStatus() != tasksv1.Step_STATUS_CREATED || t.GetState() == tasksv1.Task_STATE_ACTIVE {
			return nil, nil
		}
		st.Status = tasksv1.Step_STATUS_COMPLETED
		st.Output = proto.String(FinishedOutput(t))
		st.IsLast = true
		st.StatusMessage = ""
		st.UpdateTime = now
		return nil, nil
	})
	if err != nil {
		if ctx.Err() == nil {
			s.logger.ErrorContext(ctx, "end step of an inactive task", slog.String("task", ref.TaskID), slog.String("step", ref.StepID), slog.Any("err", err))
		}
		return nil
	}
	s.events.Publish(ref.TaskID, cur)
	return cur
}

// stepFailed handles a step-level failure of attempt j: an executor
// exists, so the agent's waiting steps go ahead, and the step alone backs
// off or, after MaxStepAttempts attempts, completes with the failure as
// its output.
func (s *Scheduler) stepFailed(ctx context.Context, j job, agent string, st *tasksv1.Step, cause error) {
	ref := j.ref
	s.mu.Lock()
	delete(s.running, ref)
	if w := s.agents[agent]; isProbe(w, j) {
		w.probing = false
		w.steps[0] = store.StepRef{}
		w.steps = w.steps[1:]
	}
	if s.closed { // shutting down: the step stays pending
		s.mu.Unlock()
		s.done(j, nil)
		return
	}
	s.tries[ref]++
	n := s.tries[ref]
	last := n >= s.opts.MaxStepAttempts
	if !last {
		s.backoff[ref] = s.clock.Now().Add(s.delay(n - 1))
	}
	s.mu.Unlock()
	s.release(agent)
	se := asStepError(cause)
	if last {
		s.logger.WarnContext(ctx, "step failed; giving up", slog.String("agent", agent), slog.String("task", ref.TaskID), slog.String("step", ref.StepID), slog.Int("attempts", n), slog.Any("err", cause))
		cur, err := s.failStep(ctx, ref, se, n)
		if err != nil && ctx.Err() == nil {
			s.logger.ErrorContext(ctx, "store failed step", slog.String("task", ref.TaskID), slog.String("step", ref.StepID), slog.Any("err", err))
		}
		s.done(j, cur)
		return
	}
	s.metrics.attempts.WithLabelValues("retrying").Inc()
	s.logger.InfoContext(ctx, "step attempt failed; will retry", slog.String("agent", agent), slog.String("task", ref.TaskID), slog.String("step", ref.StepID), slog.Int("attempts", n), slog.Any("err", cause))
	s.settle(ref, s.note(ctx, ref, st, fmt.Sprintf("retrying: attempt %d of %d failed (%s: %s); the step stays created and is retried automatically", n, s.opts.MaxStepAttempts, se.Code, se.Message)))
	s.nudge()
}

// delay is the backoff after failures+1 failures in a row.
func (s *Scheduler) delay(failures int) time.Duration {
	return min(retryMin<<min(failures, 20), s.opts.RetryMax)
}

func asStepError(err error) *StepError {
	var se *StepError
	if errors.As(err, &se) {
		return se
	}
	return &StepError{Code: "Unknown", Message: err.Error()}
}

// failStep completes a step that failed MaxStepAttempts times. The Agent
// Protocol has no failed status, so the step is completed (not last: the
// task stays open for another step) with the failure in output and, as
// {"error": {...}}, in additional_output.
func (s *Scheduler) failStep(ctx context.Context, ref store.StepRef, se *StepError, attempts int) (*tasksv1.Step, error) {
	out := fmt.Sprintf("The step failed after %d attempts and was not completed: %s (%s). Post a new step to try again.", attempts, se.Message, se.Code)
	extra, err := json.Marshal(map[string]any{"error": map[string]any{
		"code": se.Code, "reason": se.Reason, "message": se.Message, "attempts": attempts,
	}})
	if err != nil {
		return nil, err
	}
	now := timestamppb.New(s.opts.Now())
	cur, err := s.store.UpdateStep(ctx, ref, func(_ *tasksv1.Task, st *tasksv1.Step) ([]*tasksv1.Artifact, error) {
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
		return nil, err
	}
	s.metrics.attempts.WithLabelValues("failed").Inc()
	s.events.Publish(ref.TaskID, cur)
	return cur, nil
}

// isProbe reports whether j is the running probe of w (the list may have
// been released and started afresh while j ran).
func isProbe(w *agentWaits, j job) bool {
	return w != nil && j.probe != "" && w.probing && len(w.steps) > 0 && w.steps[0] == j.ref
}

// release queues every waiting step of agent: a step of it just ran.
func (s *Scheduler) release(agent string) {
	s.mu.Lock()
	s.known[agent] = true
	w := s.agents[agent]
	if w == nil {
		s.mu.Unlock()
		return
	}
	delete(s.agents, agent)
	for i, ref := range w.steps {
		if i == 0 && w.probing {
			continue // still running; its attempt ends by itself
		}
		s.ready = append(s.ready, job{ref: ref})
	}
	for _, ref := range w.behind {
		s.ready = append(s.ready, job{ref: ref})
	}
	s.mu.Unlock()
	s.nudge()
}

// complete stores the agent's files durably, then the step's result, in
// that order, so the step never points at missing bytes.
func (s *Scheduler) complete(ctx context.Context, ref store.StepRef, t *tasksv1.Task, res *Result) (*tasksv1.Step, error) {
	now := timestamppb.New(s.opts.Now())
	var arts []*tasksv1.Artifact
	for _, f := range res.Files {
		rel, err := artifactfs.CleanRelativePath(f.RelativePath)
		if err == nil {
			_, err = artifactfs.CleanFileName(f.FileName)
		}
		if err != nil {
			s.logger.WarnContext(ctx, "dropped an agent artifact with a bad name", slog.String("task", ref.TaskID), slog.String("step", ref.StepID), slog.Any("err", err))
			continue
		}
		id := s.opts.NewID()
		size, err := s.files.Write(ref.TaskID, id, bytes.NewReader(f.Content), s.opts.MaxUploadBytes)
		if err != nil {
			return nil, fmt.Errorf("store agent artifact: %w", err)
		}
		arts = append(arts, &tasksv1.Artifact{
			Name:         t.GetName() + "/artifacts/" + id,
			FileName:     f.FileName,
			RelativePath: rel,
			AgentCreated: true,
			SizeBytes:    size,
			CreateTime:   now,
		})
	}
	out := bytes.TrimSpace(res.AdditionalOutput)
	if !jsonObject(out) {
		s.logger.WarnContext(ctx, "dropped additional_output that is not a JSON object nested at most 64 levels deep", slog.String("task", ref.TaskID), slog.String("step", ref.StepID))
		out = nil
	}
	st, err := s.store.UpdateStep(ctx, ref, func(t *tasksv1.Task, st *tasksv1.Step) ([]*tasksv1.Artifact, error) {
		if st.GetStatus() != tasksv1.Step_STATUS_CREATED {
			return nil, nil // completed by an earlier attempt
		}
		st.Status = tasksv1.Step_STATUS_COMPLETED
		st.Output = proto.String(res.Output)
		st.AdditionalOutputJson = out
		st.IsLast = res.IsLast
		st.StepName = res.StepName
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
		return nil, fmt.Errorf("store step result: %w", err)
	}
	s.metrics.attempts.WithLabelValues("completed").Inc()
	s.events.Publish(ref.TaskID, st)
	return st, nil
}

// jsonObject reports whether raw is empty or a JSON object nested at most
// jsondepth.Max levels deep.
func jsonObject(raw []byte) bool {
	if len(raw) == 0 {
		return true
	}
	if jsondepth.Check(raw, jsondepth.Max) != nil {
		return false
	}
	var m map[string]json.RawMessage
	return raw[0] == '{' && json.Unmarshal(raw, &m) == nil
}

// parkMessage explains to the step's reader what is down.
func parkMessage(agent string, err error) string {
	switch {
	case errors.Is(err, ErrNoExecutor):
		return fmt.Sprintf("waiting: no executor is connected for agent %s yet; the step stays created and runs when one connects", agent)
	case errors.Is(err, ErrAgentUnavailable):
		return fmt.Sprintf("waiting: the dispatcher does not know agent %s; the step stays created and is retried automatically", agent)
	case errors.Is(err, ErrLLMUnavailable):
		return fmt.Sprintf("waiting: the language model provider of agent %s could not execute the step (it is down or unreachable); the step stays created and is retried automatically", agent)
	case errors.Is(err, ErrNotSupported):
		return "waiting: the dispatcher cannot execute steps yet; the step stays created and is retried automatically"
	default: // ErrDispatcherUnavailable
		return "waiting: the dispatcher is unavailable; the step stays created and is retried automatically"
	}
}

// park puts the step of failed attempt j on its agent's waiting list. A
// probe, or the attempt that starts the list, sets the agent's next probe;
// steps that waited silently behind a first probe are queued again to
// join the list with its message.
func (s *Scheduler) park(ctx context.Context, j job, agent string, st *tasksv1.Step, cause error) {
	ref := j.ref
	s.metrics.attempts.WithLabelValues("waiting").Inc()
	msg := parkMessage(agent, cause)
	// Store the message before the next probe can fall due, so that probe
	// reads it and writes nothing.
	cur := s.note(ctx, ref, st, msg)
	s.mu.Lock()
	delete(s.running, ref)
	delete(s.known, agent)
	w := s.agents[agent]
	fresh := w == nil
	if fresh {
		w = &agentWaits{}
		s.agents[agent] = w
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
		delay := s.delay(w.failed)
		if errors.Is(cause, ErrAgentUnavailable) { // an agent nobody registered: back off fully
			delay = s.opts.RetryMax
		}
		w.due = s.clock.Now().Add(delay)
		w.msg = msg
	}
	for _, b := range w.behind {
		s.ready = append(s.ready, job{ref: b})
	}
	w.behind = nil
	if s.closed {
		s.forgetLocked(ref)
	}
	failed := w.failed
	s.mu.Unlock()
	s.nudge()
	// Say it once per agent; probes of an agent still waiting are debug noise.
	level := slog.LevelDebug
	if failed == 0 {
		level = slog.LevelInfo
		if !errors.Is(cause, ErrNoExecutor) && !errors.Is(cause, ErrNotSupported) {
			level = slog.LevelWarn
		}
	}
	s.logger.Log(ctx, level, "step waits; will retry", slog.String("agent", agent), slog.String("task", ref.TaskID), slog.String("step", ref.StepID), slog.Int("failed_probes", failed), slog.Any("err", cause))
	s.settle(ref, cur)
}

// note stores msg as the waiting step's status_message, unless st (as
// loaded by this attempt) already says it: an unchanged step costs no
// write. It returns the step as it now reads.
func (s *Scheduler) note(ctx context.Context, ref store.StepRef, st *tasksv1.Step, msg string) *tasksv1.Step {
	if st.GetStatusMessage() == msg {
		return st
	}
	cur, err := s.store.UpdateStep(ctx, ref, func(_ *tasksv1.Task, st *tasksv1.Step) ([]*tasksv1.Artifact, error) {
		if st.GetStatus() == tasksv1.Step_STATUS_CREATED && st.StatusMessage != msg {
			st.StatusMessage = msg
			st.UpdateTime = timestamppb.New(s.opts.Now())
		}
		return nil, nil
	})
	if err != nil {
		return nil
	}
	s.events.Publish(ref.TaskID, cur)
	return cur
}
