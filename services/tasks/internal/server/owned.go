package server

import (
	"context"
	"fmt"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	tasksv1 "github.com/parleyhq/parley/gen/parley/tasks/v1"
	"github.com/parleyhq/parley/platform/auth"
	"github.com/parleyhq/parley/platform/grpcerr"
)

// Owned is s as gRPC and v1 REST callers reach it: the calls on an
// existing task (tasks/{task}/...) are answered only for the task's agent,
// its client and the operator. The policy cannot check them, as a task's
// name does not carry its agent. Another caller gets NOT_FOUND, the same
// answer as for a task that does not exist, so it cannot learn whether one
// does. The Agent Protocol routes use s itself: their access is the
// agent's setting (package rest). Without access control (no principal)
// nothing is checked.
func (s *Server) Owned() tasksv1.TasksServiceServer { return owned{s} }

type owned struct{ *Server }

var _ tasksv1.TasksServiceServer = owned{}

// check answers whether the caller may act on the task that name (a task
// or one of its children) belongs to.
func (o owned) check(ctx context.Context, name string) error {
	p, on := auth.FromContext(ctx)
	if !on || p.Kind == auth.Operator {
		return nil
	}
	parts := strings.SplitN(name, "/", 3)
	if len(parts) < 2 {
		return nil // malformed: the handler reports it
	}
	task := parts[0] + "/" + parts[1]
	t, err := o.Server.GetTask(ctx, &tasksv1.GetTaskRequest{Name: task})
	if err != nil {
		return err
	}
	if (p.Kind != auth.Agent && p.Kind != auth.Client) || !p.Owns(t.GetAgent()) {
		return grpcerr.New(codes.NotFound, fmt.Sprintf("task %q: not found", task), "TASK_NOT_FOUND", Domain, map[string]string{"task": task})
	}
	return nil
}

func (o owned) GetTask(ctx context.Context, req *tasksv1.GetTaskRequest) (*tasksv1.Task, error) {
	if err := o.check(ctx, req.GetName()); err != nil {
		return nil, err
	}
	return o.Server.GetTask(ctx, req)
}

func (o owned) CancelTask(ctx context.Context, req *tasksv1.CancelTaskRequest) (*tasksv1.Task, error) {
	if err := o.check(ctx, req.GetName()); err != nil {
		return nil, err
	}
	return o.Server.CancelTask(ctx, req)
}

func (o owned) CreateStep(ctx context.Context, req *tasksv1.CreateStepRequest) (*tasksv1.Step, error) {
	if err := o.check(ctx, req.GetParent()); err != nil {
		return nil, err
	}
	return o.Server.CreateStep(ctx, req)
}

func (o owned) GetStep(ctx context.Context, req *tasksv1.GetStepRequest) (*tasksv1.Step, error) {
	if err := o.check(ctx, req.GetName()); err != nil {
		return nil, err
	}
	return o.Server.GetStep(ctx, req)
}

func (o owned) ListSteps(ctx context.Context, req *tasksv1.ListStepsRequest) (*tasksv1.ListStepsResponse, error) {
	if err := o.check(ctx, req.GetParent()); err != nil {
		return nil, err
	}
	return o.Server.ListSteps(ctx, req)
}

func (o owned) WatchTask(req *tasksv1.WatchTaskRequest, stream grpc.ServerStreamingServer[tasksv1.WatchTaskResponse]) error {
	if err := o.check(stream.Context(), req.GetName()); err != nil {
		return err
	}
	return o.Server.WatchTask(req, stream)
}

func (o owned) CreateArtifact(ctx context.Context, req *tasksv1.CreateArtifactRequest) (*tasksv1.Artifact, error) {
	if err := o.check(ctx, req.GetParent()); err != nil {
		return nil, err
	}
	return o.Server.CreateArtifact(ctx, req)
}

func (o owned) GetArtifact(ctx context.Context, req *tasksv1.GetArtifactRequest) (*tasksv1.Artifact, error) {
	if err := o.check(ctx, req.GetName()); err != nil {
		return nil, err
	}
	return o.Server.GetArtifact(ctx, req)
}

func (o owned) ListArtifacts(ctx context.Context, req *tasksv1.ListArtifactsRequest) (*tasksv1.ListArtifactsResponse, error) {
	if err := o.check(ctx, req.GetParent()); err != nil {
		return nil, err
	}
	return o.Server.ListArtifacts(ctx, req)
}

func (o owned) ReadArtifact(req *tasksv1.ReadArtifactRequest, stream grpc.ServerStreamingServer[tasksv1.ReadArtifactResponse]) error {
	if err := o.check(stream.Context(), req.GetName()); err != nil {
		return err
	}
	return o.Server.ReadArtifact(req, stream)
}
