// Package routinetest is test support, not product code: a stand-in for
// the dispatcher's routine runtime where no dispatcher runs (the
// negotiator's own tests and the network benchmark; services never import
// each other, so the real runtime is out of reach there). Run calls one
// function; Check runs a RoutineCheck the way the dispatcher does before it
// uses a routine the negotiator wrote. The negotiator itself runs no
// routine.
//
// It follows the dispatcher's routine contract (services/dispatcher/README.md,
// Routines): the same file options (while loops, top-level control, global
// reassignment), json, tools by name and call_tool(name, args) with both
// arguments required, results as JSON. Budgets are steps, wall time and
// tool calls only; the dispatcher's allocation budget and worker pool are
// not modelled.
package routinetest

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	starjson "go.starlark.net/lib/json"
	"go.starlark.net/starlark"
	"go.starlark.net/syntax"

	"github.com/parleyhq/parley/services/negotiator/internal/schema"
)

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

// Tool is a tool's stand-in: it checks its argument against Input (when
// set) and answers Result (null when empty).
type Tool struct {
	Name   string
	Input  json.RawMessage
	Result json.RawMessage
}

// Run loads src with tools and calls fn once with args (raw JSON each),
// returning its result as JSON. A source that does not load, a missing
// function and a failing call are errors.
func Run(src, fn string, args []json.RawMessage, tools []Tool) (json.RawMessage, error) {
	declared, err := declare(tools)
	if err != nil {
		return nil, err
	}
	globals, err := load(src, declared)
	if err != nil {
		return nil, err
	}
	return callFn(globals, fn, args)
}

// Example returns the first example a JSON Schema generates ({} when it
// does not compile).
func Example(raw json.RawMessage) json.RawMessage {
	s, err := schema.Compile(raw)
	if err != nil {
		return json.RawMessage(`{}`)
	}
	return s.Examples()[0]
}

func declare(tools []Tool) (map[string]declared, error) {
	out := map[string]declared{}
	for _, t := range tools {
		d := declared{result: t.Result}
		if len(t.Input) > 0 {
			var err error
			if d.input, err = schema.Compile(t.Input); err != nil {
				return nil, fmt.Errorf("input schema of %s: %w", t.Name, err)
			}
		}
		out[t.Name] = d
	}
	return out, nil
}

var errBudget = errors.New("routine budget exceeded")

func callFn(globals starlark.StringDict, fn string, raw []json.RawMessage) (json.RawMessage, error) {
	f, ok := globals[fn].(starlark.Callable)
	if !ok {
		return nil, fmt.Errorf("the routine defines no function %s", fn)
	}
	th, stop := newThread()
	defer stop()
	args := make(starlark.Tuple, len(raw))
	for i, a := range raw {
		v, err := fromJSON(th, a)
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
