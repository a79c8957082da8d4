package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/services/dispatcher/internal/hosted"
	"github.com/parleyhq/parley/services/dispatcher/internal/pdschema"
	"github.com/parleyhq/parley/services/dispatcher/internal/routine"
)

// Bounds of one TestRoutine request.
const (
	maxTestCases = 100
	maxTestTools = 64
)

// TestRoutine implements DispatcherServiceServer: it compiles the source
// and runs each case in the production runtime (routine.Compile and
// Program.Call with the server's budgets and worker pool), answering tool
// calls from the declared results. It stores nothing and reads no agent
// state, so it works for agents this dispatcher does not host yet.
func (s *Server) TestRoutine(ctx context.Context, req *dispatcherv1.TestRoutineRequest) (*dispatcherv1.TestRoutineResponse, error) {
	tools, err := validateTestRoutine(req)
	if err != nil {
		return nil, err
	}
	prog, err := routine.Compile(ctx, "test", req.GetSource(), tools, s.opts.RoutineLimits)
	if err != nil {
		hosted.CountStop(s.metrics, err)
		return nil, routineCompileStatus(err)
	}
	resp := &dispatcherv1.TestRoutineResponse{
		Results:   make([]*dispatcherv1.TestRoutineResult, 0, len(req.GetCases())),
		Functions: prog.Functions(),
	}
	for _, c := range req.GetCases() {
		res := &dispatcherv1.TestRoutineResult{}
		if !prog.Has(c.GetFunction()) {
			res.Error = fmt.Sprintf("the routine defines no function %s", c.GetFunction())
			resp.Results = append(resp.Results, res)
			continue
		}
		args := make([]json.RawMessage, len(c.GetArgsJson()))
		for i, a := range c.GetArgsJson() {
			args[i] = json.RawMessage(a)
		}
		out, _, err := prog.Call(ctx, c.GetFunction(), args, nil)
		switch {
		case errors.Is(err, routine.ErrBusy):
			return nil, busyStatus()
		case err != nil:
			res.Error = err.Error()
			res.BudgetExceeded = errors.Is(err, routine.ErrBudget)
			res.FailureKind = hosted.FailureKind(err)
			hosted.CountStop(s.metrics, err)
		default:
			res.OutputJson = string(out)
		}
		resp.Results = append(resp.Results, res)
	}
	return resp, nil
}

// routineCompileStatus maps a routine.Compile error: a full worker pool is
// RESOURCE_EXHAUSTED, anything else a source that does not run.
func routineCompileStatus(err error) error {
	if errors.Is(err, routine.ErrBusy) {
		return busyStatus()
	}
	return grpcerr.New(codes.InvalidArgument, fmt.Sprintf("routine.source does not run: %v", err), "ROUTINE_INVALID", Domain, nil)
}

func busyStatus() error {
	return grpcerr.New(codes.ResourceExhausted, "every routine worker is busy; retry later", "ROUTINE_BUSY", Domain, nil)
}

// validateTestRoutine checks req and builds its tools.
func validateTestRoutine(req *dispatcherv1.TestRoutineRequest) (map[string]routine.Tool, error) {
	var v grpcerr.Violations
	if req.GetSource() == "" {
		v.Add("source", "must not be empty")
	} else if len(req.GetSource()) > 256<<10 {
		v.Add("source", "must be at most 256 KiB")
	}
	if n := len(req.GetCases()); n == 0 || n > maxTestCases {
		v.Add("cases", fmt.Sprintf("must hold 1 to %d cases", maxTestCases))
	}
	for i, c := range req.GetCases() {
		if c.GetFunction() == "" {
			v.Add(fmt.Sprintf("cases[%d].function", i), "must not be empty")
		}
		for j, a := range c.GetArgsJson() {
			if !json.Valid([]byte(a)) {
				v.Add(fmt.Sprintf("cases[%d].args_json[%d]", i, j), "must be JSON")
			}
		}
	}
	if len(req.GetTools()) > maxTestTools {
		v.Add("tools", fmt.Sprintf("must hold at most %d tools", maxTestTools))
	}
	tools := make(map[string]routine.Tool, len(req.GetTools()))
	for i, t := range req.GetTools() {
		field := fmt.Sprintf("tools[%d]", i)
		if t.GetId() == "" || len(t.GetId()) > 128 {
			v.Add(field+".id", "must be 1 to 128 characters")
		} else if _, dup := tools[t.GetId()]; dup {
			v.Add(field+".id", "is declared twice")
		}
		if r := t.GetResultJson(); r != "" && !json.Valid([]byte(r)) {
			v.Add(field+".result_json", "must be JSON")
		}
		schemas, err := pdschema.Compile(t.GetInputSchemaJson(), "")
		if err != nil {
			v.Add(field+".input_schema_json", err.Error())
		}
		tools[t.GetId()] = declaredTool(t.GetId(), schemas, t.GetResultJson())
	}
	if err := v.Err("INVALID_ARGUMENT", Domain); err != nil {
		return nil, err
	}
	return tools, nil
}

// declaredTool checks its argument against the input schema and answers
// the declared result.
func declaredTool(id string, in pdschema.Schemas, result string) routine.Tool {
	return routine.FuncTool(func(_ context.Context, arg json.RawMessage) (json.RawMessage, error) {
		if err := pdschema.Validate(in.Request, arg); err != nil {
			return nil, fmt.Errorf("argument of %s: %w", id, err)
		}
		if result == "" {
			return nil, nil
		}
		return json.RawMessage(result), nil
	})
}
