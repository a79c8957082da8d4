// Package store defines the tasks's storage contract for task, step and
// artifact metadata. Artifact bytes live in files (package artifactfs);
// backends live in sub-packages (boltstore); handlers see only this
// interface.
//
// Every mutating call returns only after its write is durable.
package store

import (
	"context"

	tasksv1 "github.com/parleyhq/parley/gen/parley/tasks/v1"
	"github.com/parleyhq/parley/platform/resource"
)

// Sentinel errors. Backends return *resource.Error values that match them
// and carry the resource's kind ("task", "step", "artifact") and name.
var (
	ErrNotFound      = resource.ErrNotFound
	ErrAlreadyExists = resource.ErrAlreadyExists
)

// StepRef names a step by its task and step ids.
type StepRef struct {
	TaskID, StepID string
}

// Store is the tasks's persistent state. Ids are the last segment of the
// resource names (tasks/{task_id}/steps/{step_id}). Tasks and artifacts are
// listed in creation order, steps in step id order (the server's ids are
// time-ordered, so that is creation order too); offset and limit select a
// window and total counts every item.
type Store interface {
	// CreateTask stores a new task; its name must be unused (else
	// ErrAlreadyExists). artifact_count is set to zero.
	CreateTask(ctx context.Context, t *tasksv1.Task) error
	// GetTask returns a task or ErrNotFound.
	GetTask(ctx context.Context, taskID string) (*tasksv1.Task, error)
	// ListTasks returns the agent's tasks in [offset, offset+limit) and how
	// many the agent has.
	ListTasks(ctx context.Context, agent string, offset, limit int) ([]*tasksv1.Task, int, error)
	// UpdateTask runs mutate on the stored task inside one transaction and
	// stores the result. If mutate fails nothing is written and its error is
	// returned as is.
	UpdateTask(ctx context.Context, taskID string, mutate func(*tasksv1.Task) error) (*tasksv1.Task, error)

	// CreateStep stores a new step s of the task. decide runs inside the
	// transaction with the stored task and s, and may change both (for
	// example to complete s at once because the task is finished); if it
	// fails nothing is written. The task is written only if decide changed it. A step left with status CREATED is recorded
	// as pending (see ListPending).
	CreateStep(ctx context.Context, taskID string, s *tasksv1.Step, decide func(*tasksv1.Task, *tasksv1.Step) error) (*tasksv1.Step, error)
	// GetStep returns a step or ErrNotFound.
	GetStep(ctx context.Context, ref StepRef) (*tasksv1.Step, error)
	// ListSteps returns the task's steps in [offset, offset+limit) and how
	// many it has; ErrNotFound when the task is unknown.
	ListSteps(ctx context.Context, taskID string, offset, limit int) ([]*tasksv1.Step, int, error)
	// UpdateStep runs mutate on the stored task and step inside one
	// transaction. The artifacts mutate returns are stored with the step, as
	// the task's next artifacts (their bytes must already be durable). The
	// step stays pending while its status is CREATED. The task is written
	// only if mutate or the artifacts changed it.
	UpdateStep(ctx context.Context, ref StepRef, mutate func(*tasksv1.Task, *tasksv1.Step) ([]*tasksv1.Artifact, error)) (*tasksv1.Step, error)
	// ListPending returns every pending step, oldest task first.
	ListPending(ctx context.Context) ([]StepRef, error)

	// CreateArtifact stores an artifact's metadata as the task's next
	// artifact; its bytes must already be durable. ErrNotFound when the task
	// is unknown.
	CreateArtifact(ctx context.Context, taskID string, a *tasksv1.Artifact) error
	// GetArtifact returns an artifact or ErrNotFound.
	GetArtifact(ctx context.Context, taskID, artifactID string) (*tasksv1.Artifact, error)
	// ListArtifacts returns the task's artifacts in [offset, offset+limit)
	// and how many it has; ErrNotFound when the task is unknown.
	ListArtifacts(ctx context.Context, taskID string, offset, limit int) ([]*tasksv1.Artifact, int, error)

	// Ping reports whether the store is open and usable.
	Ping(ctx context.Context) error
	// Close releases the store. Calls after Close fail.
	Close() error
}
