package server

import (
	"context"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	tasksv1 "github.com/parleyhq/parley/gen/parley/tasks/v1"
	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/services/tasks/internal/scheduler"
)

// dispatcherRunner runs steps through the dispatcher's ExecuteStep and
// translates its codes into the scheduler's sentinels: this is the one
// place that knows what a dispatcher status means for a step.
type dispatcherRunner struct {
	client dispatcherv1.DispatcherServiceClient
}

func (r dispatcherRunner) RunStep(ctx context.Context, req scheduler.Request) (*scheduler.Result, error) {
	resp, err := r.client.ExecuteStep(ctx, &dispatcherv1.ExecuteStepRequest{
		Agent:               req.Agent,
		TaskId:              req.TaskID,
		StepId:              req.StepID,
		TaskInput:           req.TaskInput,
		Input:               req.Input,
		AdditionalInputJson: req.AdditionalInput,
	})
	if err != nil {
		return nil, fromDispatcher(err)
	}
	res := &scheduler.Result{
		Output:           resp.GetOutput(),
		AdditionalOutput: resp.GetAdditionalOutputJson(),
		IsLast:           resp.GetIsLast(),
		StepName:         resp.GetStepName(),
	}
	for _, a := range resp.GetArtifacts() {
		res.Files = append(res.Files, scheduler.File{FileName: a.GetFileName(), RelativePath: a.GetRelativePath(), Content: a.GetContent()})
	}
	return res, nil
}

// fromDispatcher maps an ExecuteStep error: what is down (the agent's
// executor, the agent, its LLM provider, the dispatcher) to a sentinel;
// anything else is the step's own failure.
func fromDispatcher(err error) error {
	s := status.Convert(err)
	reason := grpcerr.Reason(err)
	var down error
	switch s.Code() {
	case codes.FailedPrecondition:
		if reason == "NO_EXECUTOR" {
			down = scheduler.ErrNoExecutor
		}
	case codes.Unavailable:
		down = scheduler.ErrDispatcherUnavailable
		if reason == "LLM_FAILED" {
			down = scheduler.ErrLLMUnavailable
		}
	case codes.Unimplemented:
		down = scheduler.ErrNotSupported
	case codes.NotFound:
		down = scheduler.ErrAgentUnavailable
	}
	if down != nil {
		return fmt.Errorf("%s: %w", s.Message(), down)
	}
	return &scheduler.StepError{Code: s.Code().String(), Reason: reason, Message: s.Message()}
}

// hubEvents lets the scheduler publish step changes on the hub.
type hubEvents struct{ h *hub }

func (e hubEvents) Publish(taskID string, st *tasksv1.Step) { e.h.publish(taskID, st) }
func (e hubEvents) Watched(taskID string) bool              { return e.h.watched(taskID) }
