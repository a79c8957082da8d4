// Package routinetest is a stand-in for the dispatcher's TestRoutine RPC
// where no dispatcher runs: the negotiator's own tests, and the in-process
// negotiator of the network benchmark (services never import each other,
// so the real runtime is out of reach there). Production negotiators test
// routines on their dispatcher peer; e2e tests cover that path.
//
// It follows the dispatcher's routine contract (services/dispatcher/README.md,
// Routines): the same file options (while loops, top-level control, global
// reassignment), json, tools by id and call_tool(name, args) with both
// arguments required, results as JSON, functions listed, and a source that
// does not compile or load reported as INVALID_ARGUMENT with reason
// ROUTINE_INVALID. Budgets are steps, wall time and tool calls only; the
// dispatcher's allocation budget and worker pool are not modelled.
package routinetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	starjson "go.starlark.net/lib/json"
	"go.starlark.net/starlark"
	"go.starlark.net/syntax"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/services/negotiator/internal/schema"
)

// Dispatcher serves TestRoutine in process. Its zero value is ready; it is
// also a gRPC DispatcherService whose other methods are unimplemented.
type Dispatcher struct {
	dispatcherv1.UnimplementedDispatcherServiceServer
}

var _ dispatcherv1.DispatcherServiceServer = (*Dispatcher)(nil)

// Budgets per run, as the dispatcher's flag defaults.
const (
	maxSteps     = 1_000_000
	timeout      = time.Second
	maxToolCalls = 100
)

var fileOptions = &syntax.FileOptions{While: true, TopLevelControl: true, GlobalReassign: true}

var (
	jsonDecode = starjson.Module.Members["decode"]
	jsonEncode = starjson.Module.Members["encode"]
)

// Client adapts d to the generated client interface the negotiator's
// routine.Tester asks for.
func (d *Dispatcher) Client() ClientFunc { return d.TestRoutine }

// ClientFunc is TestRoutine in the generated client's shape.
type ClientFunc func(context.Context, *dispatcherv1.TestRoutineRequest) (*dispatcherv1.TestRoutineResponse, error)

// TestRoutine calls f.
func (f ClientFunc) TestRoutine(ctx context.Context, req *dispatcherv1.TestRoutineRequest, _ ...grpc.CallOption) (*dispatcherv1.TestRoutineResponse, error) {
	return f(ctx, req)
}

// TestRoutine implements DispatcherServiceServer.
func (d *Dispatcher) TestRoutine(ctx context.Context, req *dispatcherv1.TestRoutineRequest) (*dispatcherv1.TestRoutineResponse, error) {
	if req.GetSource() == "" || len(req.GetCases()) == 0 || len(req.GetCases()) > 100 {
		return nil, status.Error(codes.InvalidArgument, "source and 1 to 100 cases are required")
	}
	tools := map[string]declared{}
	for _, t := range req.GetTools() {
		d := declared{result: json.RawMessage(t.GetResultJson())}
		if in := t.GetInputSchemaJson(); in != "" {
			var err error
			if d.input, err = schema.Compile(json.RawMessage(in)); err != nil {
				return nil, status.Errorf(codes.InvalidArgument, "tools: input schema of %s: %v", t.GetId(), err)
			}
		}
		tools[t.GetId()] = d
	}
	globals, err := load(req.GetSource(), tools)
	if err != nil {
		st, _ := status.New(codes.InvalidArgument, fmt.Sprintf("routine.source does not run: %v", err)).
			WithDetails(&errdetails.ErrorInfo{Reason: "ROUTINE_INVALID", Domain: "dispatcher.parley.dev"})
		return nil, st.Err()
	}
	resp := &dispatcherv1.TestRoutineResponse{}
	for name, v := range globals {
		if _, ok := v.(*starlark.Function); ok {
			resp.Functions = append(resp.Functions, name)
		}
	}
	slices.Sort(resp.Functions)
	for _, c := range req.GetCases() {
		r := &dispatcherv1.TestRoutineResult{}
		out, err := call(globals, c)
		if err != nil {
			r.Error, r.BudgetExceeded = err.Error(), errors.Is(err, errBudget)
		} else {
			r.OutputJson = string(out)
		}
		resp.Results = append(resp.Results, r)
	}
	return resp, nil
}

var errBudget = errors.New("routine budget exceeded")

func call(globals starlark.StringDict, c *dispatcherv1.TestRoutineCase) (json.RawMessage, error) {
	f, ok := globals[c.GetFunction()].(starlark.Callable)
	if !ok {
		return nil, fmt.Errorf("the routine defines no function %s", c.GetFunction())
	}
	th, stop := newThread()
	defer stop()
	args := make(starlark.Tuple, len(c.GetArgsJson()))
	for i, a := range c.GetArgsJson() {
		v, err := fromJSON(th, json.RawMessage(a))
		if err != nil {
			return nil, fmt.Errorf("argument %d: %w", i, err)
		}
		args[i] = v
	}
	res, err := starlark.Call(th, f, args, nil)
	if err != nil {
		return nil, wrap(th, err)
	}
	return toJSON(th, res)
}

type toolCalls struct{ n int }

func newThread() (*starlark.Thread, func()) {
	th := &starlark.Thread{
		Name:  "routine",
		Print: func(*starlark.Thread, string) {},
		Load: func(*starlark.Thread, string) (starlark.StringDict, error) {
			return nil, errors.New("load is not allowed in routines")
		},
	}
	th.SetMaxExecutionSteps(maxSteps)
	th.SetLocal("calls", &toolCalls{})
	timer := time.AfterFunc(timeout, func() { th.Cancel("wall time budget exceeded") })
	return th, func() { timer.Stop() }
}

func wrap(th *starlark.Thread, err error) error {
	if th.ExecutionSteps() >= maxSteps || errors.Is(err, errBudget) {
		return fmt.Errorf("%w: %w", errBudget, err)
	}
	return err
}

// declared is a tool of a test run: its argument schema and its answer.
type declared struct {
	input  *schema.Schema
	result json.RawMessage
}

func load(src string, tools map[string]declared) (starlark.StringDict, error) {
	tool := func(name string) *starlark.Builtin {
		return starlark.NewBuiltin(name, func(th *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			var arg starlark.Value
			if err := starlark.UnpackPositionalArgs(b.Name(), args, kwargs, 1, &arg); err != nil {
				return nil, err
			}
			return answer(th, name, tools[name], arg)
		})
	}
	predeclared := starlark.StringDict{"json": starjson.Module}
	for name := range tools {
		predeclared[name] = tool(name)
	}
	if _, taken := predeclared["call_tool"]; !taken {
		predeclared["call_tool"] = starlark.NewBuiltin("call_tool", func(th *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			var name string
			var arg starlark.Value
			if err := starlark.UnpackPositionalArgs(b.Name(), args, kwargs, 2, &name, &arg); err != nil {
				return nil, err
			}
			t, ok := tools[name]
			if !ok {
				return nil, fmt.Errorf("call_tool: this agent has no tool %q", name)
			}
			return answer(th, name, t, arg)
		})
	}
	th, stop := newThread()
	defer stop()
	_, prog, err := starlark.SourceProgramOptions(fileOptions, "routine.star", src, predeclared.Has)
	if err != nil {
		return nil, err
	}
	globals, err := prog.Init(th, predeclared)
	if err != nil {
		return nil, wrap(th, err)
	}
	globals.Freeze()
	return globals, nil
}

func answer(th *starlark.Thread, name string, t declared, arg starlark.Value) (starlark.Value, error) {
	c, _ := th.Local("calls").(*toolCalls)
	if c == nil {
		return nil, fmt.Errorf("%s: tools can only be called from routine functions", name)
	}
	if c.n++; c.n > maxToolCalls {
		return nil, fmt.Errorf("%w: more than %d tool calls", errBudget, maxToolCalls)
	}
	if t.input != nil {
		raw, err := toJSON(th, arg)
		if err != nil {
			return nil, err
		}
		if err := t.input.Validate(raw); err != nil {
			return nil, fmt.Errorf("argument of %s: %w", name, err)
		}
	}
	return fromJSON(th, t.result)
}

func fromJSON(th *starlark.Thread, raw json.RawMessage) (starlark.Value, error) {
	if len(raw) == 0 {
		return starlark.None, nil
	}
	return starlark.Call(th, jsonDecode, starlark.Tuple{starlark.String(raw)}, nil)
}

func toJSON(th *starlark.Thread, v starlark.Value) (json.RawMessage, error) {
	s, err := starlark.Call(th, jsonEncode, starlark.Tuple{v}, nil)
	if err != nil {
		return nil, fmt.Errorf("the result is not JSON-encodable: %w", err)
	}
	str, ok := s.(starlark.String)
	if !ok {
		return nil, errors.New("json.encode returned a non-string")
	}
	return json.RawMessage(str.GoString()), nil
}
