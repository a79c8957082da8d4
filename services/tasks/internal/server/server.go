// Package server implements parley.tasks.v1.TasksService, plus the Go
// methods the hand-written Agent Protocol routes need beyond it (streaming
// uploads and downloads, event subscriptions), over the same store.
package server

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	tasksv1 "github.com/parleyhq/parley/gen/parley/tasks/v1"
	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/platform/jsondepth"
	"github.com/parleyhq/parley/platform/pagetoken"
	"github.com/parleyhq/parley/platform/resource"
	"github.com/parleyhq/parley/services/tasks/internal/artifactfs"
	"github.com/parleyhq/parley/services/tasks/internal/scheduler"
	"github.com/parleyhq/parley/services/tasks/internal/store"
)

// Domain is the ErrorInfo domain of the tasks's errors.
const Domain = "tasks.parley.dev"

// Options tune a Server. Every limit must be positive (StepWait may be 0):
// the tasks config owns their defaults and New substitutes none.
type Options struct {
	// StepWait is how long CreateStep waits for completion by default, and
	// the most a caller may ask for.
	StepWait time.Duration
	// StepTimeout bounds one ExecuteStep call.
	StepTimeout time.Duration
	// RetryMax caps the backoff between attempts at a parked step.
	RetryMax time.Duration
	// MaxPageSize caps page_size.
	MaxPageSize int
	// MaxUploadBytes caps an artifact's size.
	MaxUploadBytes int64
	// MaxWatchers caps concurrent WatchTask subscribers.
	MaxWatchers int
	// MaxInFlight caps concurrent ExecuteStep calls.
	MaxInFlight int
	// MaxWaitingSteps caps the steps of one agent not yet completed
	// (queued, running, or waiting for an executor); CreateStep refuses more
	// with RESOURCE_EXHAUSTED.
	MaxWaitingSteps int
	// MaxStepAttempts caps the attempts at a step failing for its own
	// reasons (not for want of an executor), after which it completes with
	// the failure as its output.
	MaxStepAttempts int
	// Clock is the step scheduler's time; nil is real time. Tests set it.
	Clock scheduler.Clock
}

// Server implements the tasks's gRPC API.
type Server struct {
	tasksv1.UnimplementedTasksServiceServer

	store  store.Store
	files  store.Blobs
	logger *slog.Logger
	opts   Options
	hub    *hub
	sched  *scheduler.Scheduler
	ids    *idGen
	now    func() time.Time
	// stopping is given to Start before serving; see Start.
	stopping <-chan struct{}

	// Background loops (the resume retry) run from Start until Start's
	// context ends, shutdown starts, or Close; stop ends them, and Close
	// also waits for them.
	stop    context.CancelFunc
	stopped context.Context
	loops   sync.WaitGroup
}

var _ tasksv1.TasksServiceServer = (*Server)(nil)

// New returns a Server over st and files that executes steps through
// dispatcher. Call Start to resume pending steps and Close to stop.
func New(st store.Store, files store.Blobs, dispatcher dispatcherv1.DispatcherServiceClient, logger *slog.Logger, opts Options) *Server {
	s := &Server{store: st, files: files, logger: logger, opts: opts, hub: newHub(opts.MaxWatchers), ids: &idGen{clock: time.Now}, now: time.Now}
	s.stopped, s.stop = context.WithCancel(context.Background())
	s.sched = scheduler.New(st, files, dispatcherRunner{client: dispatcher}, hubEvents{s.hub}, logger, scheduler.Options{
		StepTimeout:     opts.StepTimeout,
		RetryMax:        opts.RetryMax,
		MaxInFlight:     opts.MaxInFlight,
		MaxStepAttempts: opts.MaxStepAttempts,
		MaxUploadBytes:  opts.MaxUploadBytes,
		NewID:           s.ids.next,
		Now:             func() time.Time { return s.now() },
		Clock:           opts.Clock,
	})
	return s
}

// Start resumes every pending step (steps stored as created whose execution
// was not finished before the last shutdown or crash). When stopping closes
// (serve.Server.Stopping: a graceful stop began), WatchTask streams end
// with UNAVAILABLE so the drain need not wait for them; nil never closes.
// If the store cannot list the steps yet, a retry lists them later, until
// ctx ends, stopping closes or Close. Call it once, before serving.
func (s *Server) Start(ctx context.Context, stopping <-chan struct{}) error {
	s.stopping = stopping
	// A replica that is shutting down claims no more steps (on PostgreSQL,
	// listing claims them): the retry ends when shutdown starts, not only
	// at Close, so that a replica that keeps serving takes them.
	s.loops.Go(func() {
		select {
		case <-ctx.Done():
		case <-stopping:
		case <-s.stopped.Done():
		}
		s.stop()
	})
	refs, err := s.store.ListPending(ctx)
	if err != nil {
		// A database that does not answer yet: serve (not ready) and
		// resume the steps once it does.
		s.logger.WarnContext(ctx, "pending steps cannot be listed yet; retrying", slog.Any("err", err))
		s.loops.Go(func() { s.resumeLater(s.stopped) })
		return nil
	}
	s.Resume(ctx, refs)
	return nil
}

// resumeLater lists the pending steps every second once the store is
// ready, then resumes them; it gives up when ctx (s.stopped) ends.
func (s *Server) resumeLater(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if s.store.Ping(ctx) != nil {
			continue // not ready: listing now could claim steps too early
		}
		if refs, err := s.store.ListPending(ctx); err == nil {
			s.Resume(ctx, refs)
			return
		}
	}
}

// Resume runs pending steps that no one runs: those left by the last run
// (Start), or claimed from a replica that died (pgstore.ClaimOrphans).
func (s *Server) Resume(ctx context.Context, refs []store.StepRef) {
	for _, ref := range refs {
		s.sched.Submit(ref, "", nil, nil)
	}
	if len(refs) > 0 {
		s.logger.InfoContext(ctx, "resuming pending steps", slog.Int("steps", len(refs)))
	}
}

// Close stops the background loops and step execution, and waits for them
// and for running attempts to end, so the caller may close the store next.
// Steps cut short stay pending and resume on the next Start.
func (s *Server) Close() {
	s.stop()
	s.loops.Wait()
	s.sched.Close()
}

// idGen makes version 7 UUIDs: a millisecond timestamp, a 12-bit counter
// that keeps ids from one process strictly increasing, and 62 random bits.
// Time-ordered ids keep new keys together in bbolt's B+trees, so a group
// commit dirties a few pages instead of one random page per write.
type idGen struct {
	mu    sync.Mutex // guards ms and seq
	ms    int64
	seq   uint16
	clock func() time.Time
}

func (g *idGen) next() string {
	g.mu.Lock()
	ms := g.clock().UnixMilli()
	if ms <= g.ms {
		ms = g.ms
		g.seq++
		if g.seq > 0x0fff { // counter exhausted: borrow the next millisecond
			ms++
			g.seq = 0
		}
	} else {
		g.seq = 0
	}
	g.ms = ms
	seq := g.seq
	g.mu.Unlock()
	var b [16]byte
	_, _ = rand.Read(b[8:])
	binary.BigEndian.PutUint64(b[:8], uint64(ms)<<16|0x7000|uint64(seq))
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// validID reports whether id can be a task, step or artifact id.
func validID(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return true
}

// parseName splits name by the collections in pattern ("tasks", "steps")
// and returns the ids.
func parseName(field, name string, collections ...string) ([]string, error) {
	parts := strings.Split(name, "/")
	if len(parts) != 2*len(collections) {
		return nil, invalid(field, fmt.Sprintf("must have the form %s", namePattern(collections)))
	}
	ids := make([]string, len(collections))
	for i, c := range collections {
		if parts[2*i] != c || !validID(parts[2*i+1]) {
			return nil, invalid(field, fmt.Sprintf("must have the form %s", namePattern(collections)))
		}
		ids[i] = parts[2*i+1]
	}
	return ids, nil
}

func namePattern(collections []string) string {
	var b strings.Builder
	for i, c := range collections {
		if i > 0 {
			b.WriteByte('/')
		}
		fmt.Fprintf(&b, "%s/{%s_id}", c, strings.TrimSuffix(c, "s"))
	}
	return b.String()
}

func invalid(field, desc string) error {
	var v grpcerr.Violations
	v.Add(field, desc)
	return v.Err("INVALID_ARGUMENT", Domain)
}

func validAgent(agent string) bool { return resource.ValidAgentName(agent) }

// checkObject says what is wrong with raw, or "" when it is empty or a
// JSON object nested at most jsondepth.Max levels deep.
func checkObject(raw []byte) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return ""
	}
	if jsondepth.Check(raw, jsondepth.Max) != nil {
		return fmt.Sprintf("must be nested at most %d levels deep", jsondepth.Max)
	}
	var m map[string]json.RawMessage
	if raw[0] != '{' || json.Unmarshal(raw, &m) != nil {
		return "must be a JSON object"
	}
	return ""
}

// CreateTask implements tasksv1.TasksServiceServer.
func (s *Server) CreateTask(ctx context.Context, req *tasksv1.CreateTaskRequest) (*tasksv1.Task, error) {
	var v grpcerr.Violations
	in := req.GetTask()
	if in == nil {
		v.Add("task", "is required")
	}
	if !validAgent(in.GetAgent()) {
		v.Add("task.agent", "must have the form clients/{client}/agents/{agent}")
	}
	if bad := checkObject(in.GetAdditionalInputJson()); bad != "" {
		v.Add("task.additional_input_json", bad)
	}
	if err := v.Err("INVALID_ARGUMENT", Domain); err != nil {
		return nil, err
	}
	now := timestamppb.New(s.now())
	t := &tasksv1.Task{
		Name:                "tasks/" + s.ids.next(),
		Agent:               in.GetAgent(),
		Input:               in.GetInput(),
		HasInput:            in.GetHasInput() || in.GetInput() != "",
		AdditionalInputJson: bytes.TrimSpace(in.GetAdditionalInputJson()),
		State:               tasksv1.Task_STATE_ACTIVE,
		CreateTime:          now,
		UpdateTime:          now,
	}
	if err := s.store.CreateTask(ctx, t); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return t, nil
}

// GetTask implements tasksv1.TasksServiceServer.
func (s *Server) GetTask(ctx context.Context, req *tasksv1.GetTaskRequest) (*tasksv1.Task, error) {
	ids, err := parseName("name", req.GetName(), "tasks")
	if err != nil {
		return nil, err
	}
	t, err := s.store.GetTask(ctx, ids[0])
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return t, nil
}

// page turns AIP-158 paging fields into an offset and limit.
func (s *Server) page(pageSize, skip int32, token string, params ...string) (offset, limit int, err error) {
	limit, ok := sizeOf(pageSize, s.opts.MaxPageSize)
	if !ok {
		return 0, 0, invalid("page_size", "must not be negative")
	}
	if skip < 0 {
		return 0, 0, invalid("skip", "must not be negative")
	}
	offset = int(skip)
	if token != "" {
		k, err := pagetoken.Decode(token, params...)
		if err != nil {
			return 0, 0, invalid("page_token", "is not a token from a previous call with these parameters")
		}
		n, err := strconv.Atoi(k)
		if err != nil || n < 0 {
			return 0, 0, invalid("page_token", "is malformed")
		}
		offset += n
	}
	return offset, limit, nil
}

func sizeOf(pageSize int32, maxSize int) (int, bool) {
	switch {
	case pageSize < 0:
		return 0, false
	case pageSize == 0:
		return min(10, maxSize), true
	default:
		return min(int(pageSize), maxSize), true
	}
}

func nextToken(offset, n, total int, params ...string) string {
	if offset+n >= total || n == 0 {
		return ""
	}
	return pagetoken.Encode(strconv.Itoa(offset+n), params...)
}

// ListTasks implements tasksv1.TasksServiceServer.
func (s *Server) ListTasks(ctx context.Context, req *tasksv1.ListTasksRequest) (*tasksv1.ListTasksResponse, error) {
	if !validAgent(req.GetAgent()) {
		return nil, invalid("agent", "must have the form clients/{client}/agents/{agent}")
	}
	offset, limit, err := s.page(req.GetPageSize(), req.GetSkip(), req.GetPageToken(), req.GetAgent())
	if err != nil {
		return nil, err
	}
	tasks, total, err := s.store.ListTasks(ctx, req.GetAgent(), offset, limit)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return &tasksv1.ListTasksResponse{Tasks: tasks, TotalSize: clamp32(total), NextPageToken: nextToken(offset, len(tasks), total, req.GetAgent())}, nil
}

func clamp32(n int) int32 { return int32(min(n, 1<<31-1)) }

// CancelTask implements tasksv1.TasksServiceServer.
func (s *Server) CancelTask(ctx context.Context, req *tasksv1.CancelTaskRequest) (*tasksv1.Task, error) {
	ids, err := parseName("name", req.GetName(), "tasks")
	if err != nil {
		return nil, err
	}
	t, err := s.store.UpdateTask(ctx, ids[0], func(t *tasksv1.Task) error {
		switch t.GetState() {
		case tasksv1.Task_STATE_FINISHED:
			return errTaskFinished
		case tasksv1.Task_STATE_ACTIVE:
			t.State = tasksv1.Task_STATE_CANCELLED
			t.UpdateTime = timestamppb.New(s.now())
		}
		return nil
	})
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	s.sched.DropTask(ids[0])
	return t, nil
}

// CreateStep implements tasksv1.TasksServiceServer. The task is read once,
// in the transaction that stores the step, and the first attempt gets both
// from there; the step as the attempt left it comes back on Wait's channel.
func (s *Server) CreateStep(ctx context.Context, req *tasksv1.CreateStepRequest) (*tasksv1.Step, error) {
	ids, err := parseName("parent", req.GetParent(), "tasks")
	if err != nil {
		return nil, err
	}
	if bad := checkObject(req.GetStep().GetAdditionalInputJson()); bad != "" {
		return nil, invalid("step.additional_input_json", bad)
	}
	wait := s.opts.StepWait
	if req.Wait != nil {
		if err := req.GetWait().CheckValid(); err != nil || req.GetWait().AsDuration() < 0 {
			return nil, invalid("wait", "must be a non-negative duration")
		}
		wait = min(wait, req.GetWait().AsDuration())
	}
	taskID := ids[0]
	now := timestamppb.New(s.now())
	var input *string // unset (not "") when the request has no step
	if req.GetStep() != nil {
		input = req.GetStep().Input
	}
	in := &tasksv1.Step{
		Name:                req.GetParent() + "/steps/" + s.ids.next(),
		Input:               input,
		AdditionalInputJson: bytes.TrimSpace(req.GetStep().GetAdditionalInputJson()),
		Status:              tasksv1.Step_STATUS_CREATED,
		CreateTime:          now,
		UpdateTime:          now,
	}
	// The step counts against its agent's cap from inside the transaction
	// that stores it, so concurrent creates cannot all pass the check. A
	// group commit may run decide more than once: reserve only once.
	var (
		task     *tasksv1.Task
		reserved string // the agent reserved for, if any
	)
	st, err := s.store.CreateStep(ctx, taskID, in, func(t *tasksv1.Task, st *tasksv1.Step) error {
		task = t
		if t.GetState() != tasksv1.Task_STATE_ACTIVE {
			st.Status = tasksv1.Step_STATUS_COMPLETED
			st.Output = proto.String(scheduler.FinishedOutput(t))
			st.IsLast = true
			return nil
		}
		if reserved == "" {
			if !s.sched.Reserve(t.GetAgent(), s.opts.MaxWaitingSteps) {
				return fmt.Errorf("agent %s: %w", t.GetAgent(), errTooManyWaiting)
			}
			reserved = t.GetAgent()
		}
		return nil
	})
	if reserved != "" && (err != nil || st.GetStatus() != tasksv1.Step_STATUS_CREATED) {
		s.sched.Unreserve(reserved)
	}
	if errors.Is(err, errTooManyWaiting) {
		return nil, grpcerr.New(codes.ResourceExhausted, fmt.Sprintf("agent %s already has %d steps queued, running or waiting for an executor (the most allowed); retry later", task.GetAgent(), s.opts.MaxWaitingSteps), "TOO_MANY_WAITING_STEPS", Domain, nil)
	}
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	s.hub.publish(taskID, st)
	if st.GetStatus() != tasksv1.Step_STATUS_CREATED {
		return st, nil
	}
	ref := store.StepRef{TaskID: taskID, StepID: resource.ID(st.GetName())}
	var settled <-chan *tasksv1.Step
	if wait > 0 {
		settled = s.sched.Wait(ref)
	}
	s.sched.Submit(ref, reserved, task, proto.CloneOf(st))
	if wait <= 0 {
		return st, nil
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case cur := <-settled:
		if cur != nil {
			return s.sched.Overlay(ref, proto.CloneOf(cur)), nil
		}
	case <-timer.C:
	case <-ctx.Done():
		return nil, s.toStatus(ctx, ctx.Err())
	}
	cur, err := s.store.GetStep(ctx, ref)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return s.sched.Overlay(ref, cur), nil
}

// GetStep implements tasksv1.TasksServiceServer.
func (s *Server) GetStep(ctx context.Context, req *tasksv1.GetStepRequest) (*tasksv1.Step, error) {
	ids, err := parseName("name", req.GetName(), "tasks", "steps")
	if err != nil {
		return nil, err
	}
	ref := store.StepRef{TaskID: ids[0], StepID: ids[1]}
	st, err := s.store.GetStep(ctx, ref)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return s.sched.Overlay(ref, st), nil
}

// ListSteps implements tasksv1.TasksServiceServer.
func (s *Server) ListSteps(ctx context.Context, req *tasksv1.ListStepsRequest) (*tasksv1.ListStepsResponse, error) {
	ids, err := parseName("parent", req.GetParent(), "tasks")
	if err != nil {
		return nil, err
	}
	offset, limit, err := s.page(req.GetPageSize(), req.GetSkip(), req.GetPageToken(), req.GetParent())
	if err != nil {
		return nil, err
	}
	steps, total, err := s.store.ListSteps(ctx, ids[0], offset, limit)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	for i, st := range steps {
		steps[i] = s.sched.Overlay(store.StepRef{TaskID: ids[0], StepID: resource.ID(st.GetName())}, st)
	}
	return &tasksv1.ListStepsResponse{Steps: steps, TotalSize: clamp32(total), NextPageToken: nextToken(offset, len(steps), total, req.GetParent())}, nil
}

// Subscribe returns a channel of the task's step updates, closed when ctx
// ends or the subscriber falls too far behind. Errors are gRPC statuses:
// NOT_FOUND, RESOURCE_EXHAUSTED (too many subscribers).
func (s *Server) Subscribe(ctx context.Context, name string) (<-chan *tasksv1.Step, error) {
	ids, err := parseName("name", name, "tasks")
	if err != nil {
		return nil, err
	}
	if _, err := s.store.GetTask(ctx, ids[0]); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	sub, err := s.hub.subscribe(ids[0])
	if err != nil {
		return nil, grpcerr.New(codes.ResourceExhausted, fmt.Sprintf("too many event streams are open (at most %d); retry later", s.opts.MaxWatchers), "TOO_MANY_WATCHERS", Domain, nil)
	}
	context.AfterFunc(ctx, func() { s.hub.unsubscribe(ids[0], sub) })
	return sub.ch, nil
}

// WatchTask implements tasksv1.TasksServiceServer.
func (s *Server) WatchTask(req *tasksv1.WatchTaskRequest, stream grpc.ServerStreamingServer[tasksv1.WatchTaskResponse]) error {
	ch, err := s.Subscribe(stream.Context(), req.GetName())
	if err != nil {
		return err
	}
	for {
		select {
		case st, ok := <-ch:
			if !ok {
				return s.watchEnded(stream.Context())
			}
			if err := stream.Send(&tasksv1.WatchTaskResponse{Step: st}); err != nil {
				return err
			}
		case <-s.stopping: // nil unless set: never ready
			return grpcerr.New(codes.Unavailable, "the server is shutting down; reconnect", "SHUTTING_DOWN", Domain, nil)
		}
	}
}

// watchEnded says why a WatchTask subscription closed.
func (s *Server) watchEnded(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return s.toStatus(ctx, err)
	}
	return grpcerr.New(codes.ResourceExhausted, "the watcher fell too far behind; reconnect", "WATCHER_TOO_SLOW", Domain, nil)
}

// UploadArtifact stores r's bytes as an artifact of the task parent. Errors
// are gRPC statuses: INVALID_ARGUMENT, NOT_FOUND, RESOURCE_EXHAUSTED with
// reason ARTIFACT_TOO_LARGE.
func (s *Server) UploadArtifact(ctx context.Context, parent string, a *tasksv1.Artifact, r io.Reader) (*tasksv1.Artifact, error) {
	ids, err := parseName("parent", parent, "tasks")
	if err != nil {
		return nil, err
	}
	var v grpcerr.Violations
	if _, err := artifactfs.CleanFileName(a.GetFileName()); err != nil {
		v.Add("artifact.file_name", err.Error())
	}
	rel, err := artifactfs.CleanRelativePath(a.GetRelativePath())
	if err != nil {
		v.Add("artifact.relative_path", err.Error())
	}
	if err := v.Err("INVALID_ARTIFACT_NAME", Domain); err != nil {
		return nil, err
	}
	// Refuse before writing bytes for an unknown task.
	if _, err := s.store.GetTask(ctx, ids[0]); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	id := s.ids.next()
	size, err := s.files.Write(ids[0], id, r, s.opts.MaxUploadBytes)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	out := &tasksv1.Artifact{
		Name:         parent + "/artifacts/" + id,
		FileName:     a.GetFileName(),
		RelativePath: rel,
		SizeBytes:    size,
		CreateTime:   timestamppb.New(s.now()),
	}
	if err := s.store.CreateArtifact(ctx, ids[0], out); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return out, nil
}

// CreateArtifact implements tasksv1.TasksServiceServer.
func (s *Server) CreateArtifact(ctx context.Context, req *tasksv1.CreateArtifactRequest) (*tasksv1.Artifact, error) {
	return s.UploadArtifact(ctx, req.GetParent(), req.GetArtifact(), bytes.NewReader(req.GetContent()))
}

// GetArtifact implements tasksv1.TasksServiceServer.
func (s *Server) GetArtifact(ctx context.Context, req *tasksv1.GetArtifactRequest) (*tasksv1.Artifact, error) {
	a, _, err := s.artifact(ctx, req.GetName())
	return a, err
}

// artifact returns the artifact called name and the ids in its name (task,
// artifact). Errors are gRPC statuses.
func (s *Server) artifact(ctx context.Context, name string) (*tasksv1.Artifact, []string, error) {
	ids, err := parseName("name", name, "tasks", "artifacts")
	if err != nil {
		return nil, nil, err
	}
	a, err := s.store.GetArtifact(ctx, ids[0], ids[1])
	if err != nil {
		return nil, nil, s.toStatus(ctx, err)
	}
	return a, ids, nil
}

// ListArtifacts implements tasksv1.TasksServiceServer.
func (s *Server) ListArtifacts(ctx context.Context, req *tasksv1.ListArtifactsRequest) (*tasksv1.ListArtifactsResponse, error) {
	ids, err := parseName("parent", req.GetParent(), "tasks")
	if err != nil {
		return nil, err
	}
	offset, limit, err := s.page(req.GetPageSize(), req.GetSkip(), req.GetPageToken(), req.GetParent())
	if err != nil {
		return nil, err
	}
	arts, total, err := s.store.ListArtifacts(ctx, ids[0], offset, limit)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return &tasksv1.ListArtifactsResponse{Artifacts: arts, TotalSize: clamp32(total), NextPageToken: nextToken(offset, len(arts), total, req.GetParent())}, nil
}

// OpenArtifact returns an artifact's metadata and its open file; the
// caller closes it. Errors are gRPC statuses: INVALID_ARGUMENT, NOT_FOUND.
func (s *Server) OpenArtifact(ctx context.Context, name string) (*tasksv1.Artifact, io.ReadSeekCloser, error) {
	a, ids, err := s.artifact(ctx, name)
	if err != nil {
		return nil, nil, err
	}
	f, err := s.files.Open(ids[0], ids[1])
	if err != nil {
		if os.IsNotExist(err) {
			err = resource.NotFound("artifact", name)
		}
		return nil, nil, s.toStatus(ctx, err)
	}
	return a, f, nil
}

// ReadArtifact implements tasksv1.TasksServiceServer.
func (s *Server) ReadArtifact(req *tasksv1.ReadArtifactRequest, stream grpc.ServerStreamingServer[tasksv1.ReadArtifactResponse]) error {
	_, f, err := s.OpenArtifact(stream.Context(), req.GetName())
	if err != nil {
		return err
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			if err := stream.Send(&tasksv1.ReadArtifactResponse{Data: buf[:n]}); err != nil {
				return err
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return s.toStatus(stream.Context(), err)
		}
	}
}
