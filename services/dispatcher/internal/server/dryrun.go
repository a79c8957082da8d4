package server

import (
	"context"
	"encoding/json"
	"fmt"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/platform/auth"
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

// TestRoutine implements DispatcherServiceServer: a dry run of the source
// in the production runtime (hosted.Set.DryRun), answering tool calls from
// the declared results. It stores nothing and reads no agent state, so it
// works for agents this dispatcher does not host yet.
func (s *Server) TestRoutine(ctx context.Context, req *dispatcherv1.TestRoutineRequest) (*dispatcherv1.TestRoutineResponse, error) {
	tools, err := validateTestRoutine(req)
	if err != nil {
		return nil, err
	}
	cases := make([]hosted.Case, 0, len(req.GetCases()))
	for _, c := range req.GetCases() {
		args := make([]json.RawMessage, len(c.GetArgsJson()))
		for i, a := range c.GetArgsJson() {
			args[i] = json.RawMessage(a)
		}
		cases = append(cases, hosted.Case{Fn: c.GetFunction(), Args: args})
	}
	// An agent's dry runs take its own share of the routine workers, the
	// one its envelopes take: otherwise one agent could hold two shares
	// (its routine's and the dry runs') and starve the others. A client
	// key's take the client's share; the operator's (the negotiator's dry
	// runs) share one.
	if p, ok := auth.FromContext(ctx); ok {
		switch p.Kind {
		case auth.Agent:
			ctx = routine.WithAgent(ctx, p.Agent)
		case auth.Client:
			ctx = routine.WithAgent(ctx, p.Client)
		}
	}
	fns, results, err := s.routines.DryRun(ctx, req.GetSource(), tools, cases)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	resp := &dispatcherv1.TestRoutineResponse{Results: make([]*dispatcherv1.TestRoutineResult, 0, len(results)), Functions: fns}
	for _, r := range results {
		resp.Results = append(resp.Results, &dispatcherv1.TestRoutineResult{OutputJson: string(r.Output), Error: r.Err, BudgetExceeded: r.Budget, FailureKind: r.Kind})
	}
	return resp, nil
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
		tools[t.GetId()] = hosted.DeclaredTool(t.GetId(), schemas, t.GetResultJson())
	}
	if err := v.Err("INVALID_ARGUMENT", Domain); err != nil {
		return nil, err
	}
	return tools, nil
}
