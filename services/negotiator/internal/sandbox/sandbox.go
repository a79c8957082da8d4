// Package sandbox runs routines, small Starlark programs, under budgets: a
// step limit, a wall-time limit and a cap on tool calls. A routine sees
// only the json module (encode, decode, indent) and call_tool(name, args);
// there is no load, file system, network or clock.
//
// The negotiator uses it to test routines against generated examples before
// saving them, and the weather demo to run the structured phase. The
// dispatcher has its own runtime for production traffic; routine sources
// written here follow the same contract: the receiver defines
// reply(query, memory), the sender send(task) and parse(reply), and tools
// are reached through call_tool(name, args) returning a dict.
package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	starjson "go.starlark.net/lib/json"
	"go.starlark.net/starlark"
	"go.starlark.net/syntax"
)

// ErrBudget is wrapped when a routine runs out of steps, time or tool calls.
var ErrBudget = errors.New("routine budget exceeded")

// ErrRoutine is wrapped by every other routine failure: syntax, runtime
// error, fail(), a missing function or a result that is not JSON.
var ErrRoutine = errors.New("routine failed")

// Tool runs one tool call for a routine: args and the result are JSON.
type Tool func(ctx context.Context, name string, args []byte) ([]byte, error)

// Limits bound one run. Zero values take the defaults shown.
type Limits struct {
	MaxSteps     uint64        // 1,000,000
	Timeout      time.Duration // 1s
	MaxToolCalls int           // 8
}

func (l Limits) withDefaults() Limits {
	if l.MaxSteps == 0 {
		l.MaxSteps = 1_000_000
	}
	if l.Timeout <= 0 {
		l.Timeout = time.Second
	}
	if l.MaxToolCalls <= 0 {
		l.MaxToolCalls = 8
	}
	return l
}

var fileOptions = &syntax.FileOptions{}

// Check compiles src and reports whether it defines every function in fns.
func Check(src string, fns ...string) error {
	globals, err := load(context.Background(), src, nil, Limits{}.withDefaults())
	if err != nil {
		return err
	}
	for _, fn := range fns {
		if _, ok := globals[fn].(*starlark.Function); !ok {
			return fmt.Errorf("%w: routine does not define %s", ErrRoutine, fn)
		}
	}
	return nil
}

// Call runs fn from src with the given JSON arguments and returns its
// result as JSON. tool may be nil: call_tool then fails.
func Call(ctx context.Context, src, fn string, args []json.RawMessage, tool Tool, lim Limits) (json.RawMessage, error) {
	lim = lim.withDefaults()
	ctx, cancel := context.WithTimeout(ctx, lim.Timeout)
	defer cancel()
	globals, err := load(ctx, src, tool, lim)
	if err != nil {
		return nil, err
	}
	f, ok := globals[fn].(*starlark.Function)
	if !ok {
		return nil, fmt.Errorf("%w: routine does not define %s", ErrRoutine, fn)
	}
	thread := newThread(ctx, lim)
	defer thread.stop()
	sargs := make(starlark.Tuple, len(args))
	for i, a := range args {
		v, err := fromJSON(thread.Thread, a)
		if err != nil {
			return nil, fmt.Errorf("%w: argument %d: %w", ErrRoutine, i, err)
		}
		sargs[i] = v
	}
	res, err := starlark.Call(thread.Thread, f, sargs, nil)
	if err != nil {
		return nil, thread.wrap(err)
	}
	out, err := toJSON(thread.Thread, res)
	if err != nil {
		return nil, fmt.Errorf("%w: result: %w", ErrRoutine, err)
	}
	return out, nil
}

// thread is a Starlark thread bound to a context and a step budget.
type thread struct {
	*starlark.Thread
	ctx      context.Context
	maxSteps uint64
	stop     func() bool
}

func newThread(ctx context.Context, lim Limits) *thread {
	t := &thread{Thread: &starlark.Thread{Name: "routine"}, ctx: ctx, maxSteps: lim.MaxSteps}
	t.SetMaxExecutionSteps(lim.MaxSteps)
	t.stop = context.AfterFunc(ctx, func() { t.Cancel("time limit exceeded") })
	return t
}

// wrap classifies a Starlark error as a budget overrun or a routine failure.
func (t *thread) wrap(err error) error {
	if t.ctx.Err() != nil || t.ExecutionSteps() >= t.maxSteps || errors.Is(err, ErrBudget) {
		return fmt.Errorf("%w: %w", ErrBudget, err)
	}
	return fmt.Errorf("%w: %w", ErrRoutine, err)
}

func load(ctx context.Context, src string, tool Tool, lim Limits) (starlark.StringDict, error) {
	t := newThread(ctx, lim)
	defer t.stop()
	predeclared := starlark.StringDict{
		"json": starjson.Module,
		"call_tool": starlark.NewBuiltin("call_tool", func(th *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
			var name string
			var targs starlark.Value = starlark.NewDict(0)
			if err := starlark.UnpackArgs(b.Name(), args, kwargs, "name", &name, "args?", &targs); err != nil {
				return nil, err
			}
			if tool == nil {
				return nil, fmt.Errorf("call_tool: no tools are available")
			}
			count, _ := th.Local("tool_calls").(int)
			if count >= lim.MaxToolCalls {
				return nil, fmt.Errorf("call_tool: %w (%d tool calls)", ErrBudget, lim.MaxToolCalls)
			}
			th.SetLocal("tool_calls", count+1)
			raw, err := toJSON(th, targs)
			if err != nil {
				return nil, fmt.Errorf("call_tool: args: %w", err)
			}
			res, err := tool(ctx, name, raw)
			if err != nil {
				// A tool's failure is the routine's: a budget or context error
				// inside it must neither make wrap report a budget overrun of
				// this run nor reach the caller's error mapping.
				return nil, fmt.Errorf("call_tool %s: %v", name, err) //nolint:errorlint // flattened on purpose, see above
			}
			return fromJSON(th, res)
		}),
	}
	globals, err := starlark.ExecFileOptions(fileOptions, t.Thread, "routine.star", src, predeclared)
	if err != nil {
		return nil, t.wrap(err)
	}
	return globals, nil
}

var (
	jsonDecode = starjson.Module.Members["decode"]
	jsonEncode = starjson.Module.Members["encode"]
)

func fromJSON(th *starlark.Thread, raw json.RawMessage) (starlark.Value, error) {
	if len(raw) == 0 {
		return starlark.None, nil
	}
	return starlark.Call(th, jsonDecode, starlark.Tuple{starlark.String(raw)}, nil)
}

func toJSON(th *starlark.Thread, v starlark.Value) (json.RawMessage, error) {
	s, err := starlark.Call(th, jsonEncode, starlark.Tuple{v}, nil)
	if err != nil {
		return nil, err
	}
	str, ok := s.(starlark.String)
	if !ok {
		return nil, errors.New("json.encode returned a non-string")
	}
	return json.RawMessage(str.GoString()), nil
}
