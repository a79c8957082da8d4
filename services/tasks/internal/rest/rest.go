// Package rest serves the Agent Protocol v1 REST surface
// (https://github.com/AI-Engineer-Foundation/agent-protocol, schemas/openapi.yml) by hand: its snake_case shapes, int32
// pagination numbers and status codes are not what the grpc-gateway emits.
// Handlers call a Backend: the in-process gRPC server in `parley serve`, or
// a thin adapter over the generated client in `parley gateway`.
//
// Routes, for the default agent and under /agents/{client}/{agent}:
//
//	POST /ap/v1/agent/tasks                          create a task (200)
//	GET  /ap/v1/agent/tasks                          list tasks
//	GET  /ap/v1/agent/tasks/{task_id}                get a task
//	POST /ap/v1/agent/tasks/{task_id}:cancel         cancel a task (Parley)
//	GET  /ap/v1/agent/tasks/{task_id}/events         step updates as SSE (Parley)
//	POST /ap/v1/agent/tasks/{task_id}/steps          create and run a step
//	GET  /ap/v1/agent/tasks/{task_id}/steps          list steps
//	GET  /ap/v1/agent/tasks/{task_id}/steps/{step_id}
//	POST /ap/v1/agent/tasks/{task_id}/artifacts      upload (multipart: file, relative_path)
//	GET  /ap/v1/agent/tasks/{task_id}/artifacts      list artifacts
//	GET  /ap/v1/agent/tasks/{task_id}/artifacts/{artifact_id}  download
//
// Errors are JSON {"message": "..."}: 404 for unknown ids, 422 for a body
// that is not a JSON object of the right types, 400 for bad paging,
// names and uploads, 413 for oversized uploads.
package rest

import (
	"context"
	"io"
	"net/http"
	"time"

	tasksv1 "github.com/parleyhq/parley/gen/parley/tasks/v1"
	"github.com/parleyhq/parley/platform/serve"
)

// uploadTimeout bounds reading an artifact upload and answering it: a
// 32 MiB file at about 150 KB/s.
const uploadTimeout = 4 * time.Minute

// Backend is what the handlers need of the tasks service. Errors are gRPC
// statuses.
type Backend interface {
	CreateTask(ctx context.Context, req *tasksv1.CreateTaskRequest) (*tasksv1.Task, error)
	GetTask(ctx context.Context, req *tasksv1.GetTaskRequest) (*tasksv1.Task, error)
	ListTasks(ctx context.Context, req *tasksv1.ListTasksRequest) (*tasksv1.ListTasksResponse, error)
	CancelTask(ctx context.Context, req *tasksv1.CancelTaskRequest) (*tasksv1.Task, error)
	CreateStep(ctx context.Context, req *tasksv1.CreateStepRequest) (*tasksv1.Step, error)
	GetStep(ctx context.Context, req *tasksv1.GetStepRequest) (*tasksv1.Step, error)
	ListSteps(ctx context.Context, req *tasksv1.ListStepsRequest) (*tasksv1.ListStepsResponse, error)
	ListArtifacts(ctx context.Context, req *tasksv1.ListArtifactsRequest) (*tasksv1.ListArtifactsResponse, error)
	// UploadArtifact stores r's bytes as an artifact of the task parent.
	UploadArtifact(ctx context.Context, parent string, a *tasksv1.Artifact, r io.Reader) (*tasksv1.Artifact, error)
	// OpenArtifact returns an artifact and its bytes; the caller closes them.
	OpenArtifact(ctx context.Context, name string) (*tasksv1.Artifact, io.ReadSeekCloser, error)
	// Subscribe streams the task's step updates until ctx ends; the channel
	// is closed then, or when the subscriber falls behind.
	Subscribe(ctx context.Context, name string) (<-chan *tasksv1.Step, error)
}

// Options configure the handlers.
type Options struct {
	// DefaultAgent is the agent served at /ap/v1/agent, as a resource name
	// (clients/{client}/agents/{agent}).
	DefaultAgent string
	// MaxPageSize is the largest page_size accepted; larger gets 400.
	MaxPageSize int
	// MaxUploadBytes caps an artifact; larger gets 413.
	MaxUploadBytes int64
	// Stopping ends open event streams when it closes (graceful shutdown:
	// clients reconnect elsewhere); never closes when nil.
	Stopping <-chan struct{}
	// TokenRequired says whether an agent (a resource name) serves its
	// routes only to its own key, its client's key or the operator (the
	// agent's `token` access) rather than to anyone; errors are gRPC
	// statuses. Nil: every agent is public.
	TokenRequired func(ctx context.Context, agent string) (bool, error)
}

// Handlers are the Agent Protocol routes.
type Handlers struct {
	b    Backend
	opts Options
}

// New returns the handlers over b. MaxPageSize and MaxUploadBytes must be
// positive: the tasks config owns their defaults and New substitutes none.
func New(b Backend, opts Options) *Handlers {
	return &Handlers{b: b, opts: opts}
}

// Register adds every route through handle (serve.Server.Handle).
func (h *Handlers) Register(handle func(pattern string, handler http.Handler)) {
	for _, prefix := range []string{"", "/agents/{client}/{agent}"} {
		base := prefix + "/ap/v1/agent/tasks"
		g := h.guard
		handle("POST "+base, g(h.createTask))
		handle("GET "+base, g(h.listTasks))
		handle("GET "+base+"/{task_id}", g(h.getTask))
		handle("POST "+base+"/{task_id}", g(h.taskAction))
		// The event stream lives as long as the client; an upload may take
		// longer to read than the server's default.
		handle("GET "+base+"/{task_id}/events", serve.Stream(g(h.events)))
		handle("POST "+base+"/{task_id}/steps", g(h.createStep))
		handle("GET "+base+"/{task_id}/steps", g(h.listSteps))
		handle("GET "+base+"/{task_id}/steps/{step_id}", g(h.getStep))
		handle("POST "+base+"/{task_id}/artifacts", serve.Timeouts(g(h.uploadArtifact), uploadTimeout, uploadTimeout))
		handle("GET "+base+"/{task_id}/artifacts", g(h.listArtifacts))
		handle("GET "+base+"/{task_id}/artifacts/{artifact_id}", g(h.downloadArtifact))
	}
}
