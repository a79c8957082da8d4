package hosted

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/parleyhq/parley/services/dispatcher/internal/agora"
	"github.com/parleyhq/parley/services/dispatcher/internal/pdschema"
	"github.com/parleyhq/parley/services/dispatcher/internal/routine"
)

// ErrCheckFailed is the error of a routine that failed its check (it does
// not run, lacks a function, fails on an example, or answers off its
// schema). The routine is at fault, not the machine.
var ErrCheckFailed = errors.New("the routine failed its check")

// Check is how to check a routine someone else wrote (the negotiator)
// before it is shadowed or installed: see Set.Check.
type Check struct {
	// Functions the source must define.
	Functions []string
	// Tools answer the routine's tool calls with declared results.
	Tools []CheckTool
	// Calls are run in order.
	Calls []CheckCall
}

// CheckTool is a tool's stand-in during a check.
type CheckTool struct {
	Name        string
	InputSchema string // JSON Schema of the argument; "" accepts any
	Result      string // raw JSON; "" answers null
}

// CheckCall is one function run on examples.
type CheckCall struct {
	Fn string
	// Examples holds one argument list per call.
	Examples [][]json.RawMessage
	// OutputSchema every result must match; "" accepts any result.
	OutputSchema string
	// Optional skips the call when the source does not define Fn.
	Optional bool
}

// DeclaredTool is a tool stand-in for dry runs: it checks its argument
// against the input schema and answers result ("" answers null).
func DeclaredTool(name string, in pdschema.Schemas, result string) routine.Tool {
	return routine.FuncTool(func(_ context.Context, arg json.RawMessage) (json.RawMessage, error) {
		if err := pdschema.Validate(in.Request, arg); err != nil {
			return nil, fmt.Errorf("argument of %s: %w", name, err)
		}
		if result == "" {
			return nil, nil
		}
		return json.RawMessage(result), nil
	})
}

// Check dry-runs src on c in the production runtime (DryRun): src must
// load, define c's functions, and answer every example without failing,
// with a result that matches the call's output schema (a string holding a
// JSON object or list is checked as that JSON, as routines see bodies).
// Errors wrap ErrCheckFailed, or are routine.ErrBusy or a malformed check.
//
// An empty check (no functions, no calls) passes without running
// anything: routines written before checks travelled with them were run
// on examples by their writer, and Install still compiles every routine.
func (s *Set) Check(ctx context.Context, src string, c Check) error {
	if len(c.Functions) == 0 && len(c.Calls) == 0 {
		return nil
	}
	tools := make(map[string]routine.Tool, len(c.Tools))
	for _, t := range c.Tools {
		in, err := pdschema.Compile(t.InputSchema, "")
		if err != nil {
			return fmt.Errorf("check: input schema of tool %s: %w", t.Name, err)
		}
		tools[t.Name] = DeclaredTool(t.Name, in, t.Result)
	}
	var cases []Case
	var outputs []pdschema.Schemas
	for _, call := range c.Calls {
		out, err := pdschema.Compile("", call.OutputSchema)
		if err != nil {
			return fmt.Errorf("check: output schema of %s: %w", call.Fn, err)
		}
		for _, args := range call.Examples {
			cases = append(cases, Case{Fn: call.Fn, Args: args})
			outputs = append(outputs, out)
		}
	}
	fns, results, err := s.DryRun(ctx, src, tools, cases)
	if errors.Is(err, ErrInvalid) {
		return fmt.Errorf("%w: %w", ErrCheckFailed, err)
	}
	if err != nil {
		return err
	}
	for _, fn := range c.Functions {
		if !slices.Contains(fns, fn) {
			return fmt.Errorf("%w: the routine defines no %s", ErrCheckFailed, fn)
		}
	}
	for i, r := range results {
		fn := cases[i].Fn
		if !slices.Contains(fns, fn) && optional(c, fn) {
			continue
		}
		if r.Err != "" {
			return fmt.Errorf("%w: %s%s: %s", ErrCheckFailed, fn, args(cases[i].Args), r.Err)
		}
		got, _ := agora.Query(r.Output)
		if err := pdschema.Validate(outputs[i].Response, got); err != nil {
			return fmt.Errorf("%w: %s%s answered %s: %w", ErrCheckFailed, fn, args(cases[i].Args), r.Output, err)
		}
	}
	return nil
}

func optional(c Check, fn string) bool {
	for _, call := range c.Calls {
		if call.Fn == fn && call.Optional {
			return true
		}
	}
	return false
}

// args writes an argument list for an error message, clipped.
func args(a []json.RawMessage) string {
	b, _ := json.Marshal(a)
	if len(b) > 200 {
		return "(" + string(b[1:197]) + "...)"
	}
	return "(" + string(b[1:len(b)-1]) + ")"
}
