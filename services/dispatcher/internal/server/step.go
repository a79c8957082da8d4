package server

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/platform/grpcerr"
)

// ExecuteStep implements DispatcherServiceServer: a connected SDK handler,
// else the agent's step routine, else the LLM, else FAILED_PRECONDITION
// NO_EXECUTOR.
func (s *Server) ExecuteStep(ctx context.Context, req *dispatcherv1.ExecuteStepRequest) (*dispatcherv1.ExecuteStepResponse, error) {
	var v grpcerr.Violations
	if !validAgentName(req.GetAgent()) {
		v.Add("agent", "must be clients/{client}/agents/{agent}")
	}
	if req.GetTaskId() == "" {
		v.Add("task_id", "must not be empty")
	}
	if req.GetStepId() == "" {
		v.Add("step_id", "must not be empty")
	}
	addIn := json.RawMessage(req.GetAdditionalInputJson())
	if len(addIn) == 0 {
		addIn = json.RawMessage("{}")
	} else if !json.Valid(addIn) {
		v.Add("additional_input_json", "must be JSON")
	}
	if err := v.Err("INVALID_ARGUMENT", Domain); err != nil {
		return nil, err
	}
	agent := req.GetAgent()
	if _, err := s.agent(ctx, agent); err != nil {
		if status.Code(err) == codes.NotFound {
			return nil, grpcerr.New(codes.NotFound, "agent "+agent+" is not registered", "AGENT_NOT_FOUND", Domain, map[string]string{"agent": agent})
		}
		return nil, s.peerError(ctx, err, "agent "+agent)
	}

	if c := s.hub.stepHandler(agent); c != nil {
		resp, err := s.stepOnHandler(ctx, c, req)
		if err != nil {
			return nil, err
		}
		s.metrics.steps.WithLabelValues(pathHandler).Inc()
		return resp, nil
	}

	var routineErr error
	r, err := s.routines.get(ctx, agent, stepRoutineID)
	if err != nil {
		s.logger.WarnContext(ctx, "step routine lookup failed; trying the LLM", slog.Any("err", err))
	} else if r.usable() && (r.prog == nil || r.prog.Has("step")) {
		ti, _ := json.Marshal(req.GetTaskInput())
		in, _ := json.Marshal(req.GetInput())
		out, _, err := s.runRoutine(ctx, r, "step", []json.RawMessage{ti, in, addIn}, nil, validStepOutput)
		if err == nil {
			s.metrics.steps.WithLabelValues(pathRoutine).Inc()
			resp := stepResponse(out)
			resp.Executor = pathRoutine
			return resp, nil
		}
		routineErr = err
	}

	input, _ := json.Marshal(map[string]any{"task_input": req.GetTaskInput(), "input": req.GetInput(), "additional_input": addIn})
	out, err := s.complete(ctx, LLMRequest{Agent: agent, Purpose: PurposeStep, Input: input})
	switch {
	case err == nil:
		s.metrics.steps.WithLabelValues(pathLLM).Inc()
		resp := stepResponse(out)
		resp.Executor = pathLLM
		return resp, nil
	case errors.Is(err, ErrNoLLM):
		msg := "agent " + agent + " has no connected step handler, no step routine and no LLM; connect one and retry"
		if routineErr != nil {
			msg = "the step routine of " + agent + " failed and no LLM is configured: " + routineErr.Error()
		}
		return nil, grpcerr.New(codes.FailedPrecondition, msg, "NO_EXECUTOR", Domain, map[string]string{"agent": agent})
	default:
		return nil, grpcerr.New(codes.Unavailable, "the language model could not execute the step: "+err.Error(), "LLM_FAILED", Domain, nil)
	}
}

func (s *Server) stepOnHandler(ctx context.Context, c *agentConn, req *dispatcherv1.ExecuteStepRequest) (*dispatcherv1.ExecuteStepResponse, error) {
	m, err := c.call(ctx, s.opts.HandlerTimeout, func(id string, deadline *timestamppb.Timestamp) *dispatcherv1.ConnectResponse {
		return &dispatcherv1.ConnectResponse{Kind: &dispatcherv1.ConnectResponse_Step{Step: &dispatcherv1.StepRequest{
			RequestId: id, Deadline: deadline, TaskId: req.GetTaskId(), StepId: req.GetStepId(),
			TaskInput: req.GetTaskInput(), Input: req.GetInput(), AdditionalInputJson: req.GetAdditionalInputJson(),
		}}}
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		return nil, grpcerr.New(codes.DeadlineExceeded, "the agent's step handler did not answer: "+err.Error(), "HANDLER_TIMEOUT", Domain, nil)
	}
	rep := m.GetStepReply()
	if rep.GetError() != "" {
		return nil, grpcerr.New(codes.Aborted, "the agent's step handler failed: "+rep.GetError(), "HANDLER_FAILED", Domain, nil)
	}
	return &dispatcherv1.ExecuteStepResponse{
		Output: rep.GetOutput(), AdditionalOutputJson: rep.GetAdditionalOutputJson(), IsLast: rep.GetIsLast(),
		Artifacts: rep.GetArtifacts(), StepName: rep.GetStepName(), Executor: pathHandler,
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

func validStepOutput(out json.RawMessage) error {
	var s string
	if json.Unmarshal(out, &s) == nil {
		return nil
	}
	var r stepResult
	if err := json.Unmarshal(out, &r); err != nil || r.Output == nil {
		return errors.New("a step must return a string or a dict with an output string")
	}
	return nil
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
