package routinetest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"go.starlark.net/starlark"

	negotiatorv1 "github.com/parleyhq/parley/gen/parley/negotiator/v1"
	"github.com/parleyhq/parley/services/negotiator/internal/schema"
)

// ErrCheck is wrapped by Check's failures.
var ErrCheck = errors.New("routine failed its check")

// Check runs c on src the way the dispatcher does before it uses a
// routine the negotiator wrote (services/dispatcher/README.md, Routine
// checks): src loads with the check's tool stand-ins, defines every listed
// function, and every call returns a result that matches the call's output
// schema (a string holding JSON is checked as that JSON). Calls of an
// optional function src does not define are skipped.
func Check(src string, c *negotiatorv1.RoutineCheck) error {
	var stand []Tool
	for _, t := range c.GetTools() {
		stand = append(stand, Tool{Name: t.GetName(), Input: t.GetInputSchemaJson(), Result: t.GetResultJson()})
	}
	tools, err := declare(stand)
	if err != nil {
		return err
	}
	globals, err := load(src, tools)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrCheck, err)
	}
	for _, fn := range c.GetFunctions() {
		if _, ok := globals[fn].(starlark.Callable); !ok {
			return fmt.Errorf("%w: the routine defines no %s", ErrCheck, fn)
		}
	}
	for _, call := range c.GetCalls() {
		if _, ok := globals[call.GetFunction()].(starlark.Callable); !ok && call.GetOptional() {
			continue
		}
		var out *schema.Schema
		if len(call.GetOutputSchemaJson()) > 0 {
			if out, err = schema.Compile(call.GetOutputSchemaJson()); err != nil {
				return fmt.Errorf("output schema of %s: %w", call.GetFunction(), err)
			}
		}
		for _, raw := range call.GetArgsJson() {
			var args []json.RawMessage
			if err := json.Unmarshal(raw, &args); err != nil {
				return fmt.Errorf("arguments %s: %w", raw, err)
			}
			got, err := callFn(globals, call.GetFunction(), args)
			if err != nil {
				return fmt.Errorf("%w: %s%s: %w", ErrCheck, call.GetFunction(), raw, err)
			}
			if out != nil {
				if err := out.Validate(body(got)); err != nil {
					return fmt.Errorf("%w: %s%s answered %s: %w", ErrCheck, call.GetFunction(), raw, got, err)
				}
			}
		}
	}
	return nil
}

// body is raw, or the JSON a string in raw holds.
func body(raw json.RawMessage) json.RawMessage {
	raw = bytes.TrimSpace(raw)
	var s string
	if len(raw) > 0 && raw[0] == '"' && json.Unmarshal(raw, &s) == nil && json.Valid([]byte(s)) {
		return json.RawMessage(s)
	}
	return raw
}
