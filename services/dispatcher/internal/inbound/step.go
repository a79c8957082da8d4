package inbound

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"

	"google.golang.org/protobuf/types/known/timestamppb"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/services/dispatcher/internal/directory"
	"github.com/parleyhq/parley/services/dispatcher/internal/fault"
	"github.com/parleyhq/parley/services/dispatcher/internal/hosted"
	"github.com/parleyhq/parley/services/dispatcher/internal/hub"
	"github.com/parleyhq/parley/services/dispatcher/internal/llm"
	"github.com/parleyhq/parley/services/dispatcher/internal/metrics"
)

// Errors of Step; each error from it wraps one, and its text is fit for
// the caller.
var (
	// ErrUnknownAgent: the agent is not registered.
	ErrUnknownAgent = errors.New("unknown agent")
	// ErrRegistry: the registry could not be reached.
	ErrRegistry = errors.New("registry unavailable")
	// ErrNoExecutor: no handler, step routine or LLM can run the step.
	ErrNoExecutor = errors.New("no executor")
	// ErrHandlerTimeout: the connected step handler did not answer.
	ErrHandlerTimeout = errors.New("handler timeout")
	// ErrRoutineFailed: the agent's step routine failed and no LLM could
	// stand in. The step has an executor, so it fails rather than waits.
	ErrRoutineFailed = errors.New("step routine failed")
	// ErrHandlerFailed: the connected step handler reported an error.
	ErrHandlerFailed = errors.New("handler failed")
	// ErrLLM: the LLM could not execute the step.
	ErrLLM = errors.New("LLM failed")
)

// fail is fault.New, the core's caller-facing error.
var fail = fault.New

// Step is one Agent Protocol step for a hosted agent; the caller has
// validated it.
type Step struct {
	Agent, TaskID, StepID string
	TaskInput, Input      string
	// AdditionalInput is a JSON value as the caller sent it; nil when the
	// step has none (routines and the LLM then see {}).
	AdditionalInput json.RawMessage
}

// Step runs a step: a connected SDK handler, else the agent's step
// routine, else the LLM, else ErrNoExecutor.
func (p *Pipeline) Step(ctx context.Context, req Step) (*dispatcherv1.ExecuteStepResponse, error) {
	agent := req.Agent
	if _, err := p.dir.Agent(ctx, agent); err != nil {
		switch {
		case errors.Is(err, directory.ErrNotFound):
			return nil, fail(ErrUnknownAgent, "agent "+agent+" is not registered")
		case errors.Is(err, directory.ErrUnavailable):
			return nil, fail(ErrRegistry, "agent "+agent+": registry unavailable, retry later")
		}
		return nil, err
	}

	if c := p.hub.Steps(agent); c != nil {
		resp, err := p.stepOnHandler(ctx, c, req)
		if err != nil {
			return nil, err
		}
		p.opts.Metrics.Steps.WithLabelValues(metrics.PathHandler).Inc()
		return resp, nil
	}

	addIn := req.AdditionalInput
	if len(addIn) == 0 {
		addIn = json.RawMessage("{}")
	}
	var routineErr error
	r, err := p.routines.Get(ctx, agent, hosted.StepsID)
	if err != nil {
		p.opts.Logger.WarnContext(ctx, "step routine lookup failed; trying the LLM", slog.Any("err", err))
	} else if r.Usable() && (r.Ready() && r.Has("step") || !r.Ready()) {
		ti, _ := json.Marshal(req.TaskInput)
		in, _ := json.Marshal(req.Input)
		out, _, err := p.routines.Run(ctx, r, hosted.Call{Fn: "step", Args: []json.RawMessage{ti, in, addIn}, Check: validStepOutput, InputChecked: true})
		if err == nil {
			p.opts.Metrics.Steps.WithLabelValues(metrics.PathRoutine).Inc()
			resp := stepResponse(out)
			resp.Executor = metrics.PathRoutine
			return resp, nil
		}
		routineErr = err
	}

	input, _ := json.Marshal(map[string]any{"task_input": req.TaskInput, "input": req.Input, "additional_input": addIn})
	out, err := p.llm.Complete(ctx, llm.Request{Agent: agent, Purpose: llm.PurposeStep, Input: input})
	switch {
	case err == nil:
		p.opts.Metrics.Steps.WithLabelValues(metrics.PathLLM).Inc()
		resp := stepResponse(out)
		resp.Executor = metrics.PathLLM
		return resp, nil
	case errors.Is(err, llm.ErrNoLLM):
		if routineErr != nil {
			// The detail is the routine owner's: hosted.Run keeps it on the
			// Routine resource; the step's caller gets one sentence.
			return nil, fail(ErrRoutineFailed, "the step routine of "+agent+" failed and no LLM is configured to stand in; its owner can read why on the routine")
		}
		return nil, fail(ErrNoExecutor, "agent "+agent+" has no connected step handler, no step routine and no LLM; connect one and retry")
	default:
		return nil, fail(ErrLLM, "the language model could not execute the step: "+err.Error())
	}
}

func (p *Pipeline) stepOnHandler(ctx context.Context, c *hub.Conn, req Step) (*dispatcherv1.ExecuteStepResponse, error) {
	m, err := c.Call(ctx, p.hub.Timeout(), func(id string, deadline *timestamppb.Timestamp) *dispatcherv1.ConnectResponse {
		return &dispatcherv1.ConnectResponse{Kind: &dispatcherv1.ConnectResponse_Step{Step: &dispatcherv1.StepRequest{
			RequestId: id, Deadline: deadline, TaskId: req.TaskID, StepId: req.StepID,
			TaskInput: req.TaskInput, Input: req.Input, AdditionalInputJson: req.AdditionalInput,
		}}}
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fail(ErrHandlerTimeout, "the agent's step handler did not answer: "+err.Error())
	}
	rep := m.GetStepReply()
	if rep.GetError() != "" {
		return nil, fail(ErrHandlerFailed, "the agent's step handler failed: "+rep.GetError())
	}
	return &dispatcherv1.ExecuteStepResponse{
		Output: rep.GetOutput(), AdditionalOutputJson: rep.GetAdditionalOutputJson(), IsLast: rep.GetIsLast(),
		Artifacts: rep.GetArtifacts(), StepName: rep.GetStepName(), Executor: metrics.PathHandler,
	}, nil
}

// stepResult is what a step routine or LLM may return besides a plain
// string: {"output", "additional_output", "is_last", "name"}.
type stepResult struct {
	Output           *string         `json:"output"`
	AdditionalOutput json.RawMessage `json:"additional_output"`
	IsLast           bool            `json:"is_last"`
	Name             string          `json:"name"`
}

func validStepOutput(out json.RawMessage) (json.RawMessage, error) {
	var s string
	if json.Unmarshal(out, &s) == nil {
		return out, nil
	}
	var r stepResult
	if err := json.Unmarshal(out, &r); err != nil || r.Output == nil {
		return nil, errors.New("a step must return a string or a dict with an output string")
	}
	return out, nil
}

func stepResponse(out json.RawMessage) *dispatcherv1.ExecuteStepResponse {
	var s string
	if json.Unmarshal(out, &s) == nil {
		return &dispatcherv1.ExecuteStepResponse{Output: s}
	}
	var r stepResult
	if json.Unmarshal(out, &r) != nil || r.Output == nil {
		return &dispatcherv1.ExecuteStepResponse{Output: string(out)}
	}
	resp := &dispatcherv1.ExecuteStepResponse{Output: *r.Output, IsLast: r.IsLast, StepName: r.Name}
	if len(r.AdditionalOutput) > 0 && string(r.AdditionalOutput) != "null" {
		resp.AdditionalOutputJson = r.AdditionalOutput
	}
	return resp
}
