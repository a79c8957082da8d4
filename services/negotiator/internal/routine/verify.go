package routine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/services/negotiator/internal/protocol"
	"github.com/parleyhq/parley/services/negotiator/internal/schema"
)

// Tester runs routines in the dispatcher's runtime, the one that serves
// them in production: the dispatcher's TestRoutine RPC (its generated
// client satisfies this).
type Tester interface {
	TestRoutine(ctx context.Context, in *dispatcherv1.TestRoutineRequest, opts ...grpc.CallOption) (*dispatcherv1.TestRoutineResponse, error)
}

// ErrRoutine is wrapped when a routine fails its test: it does not compile
// or load, lacks a function, fails on an example or returns a value off
// its schema. Any other error (the dispatcher unreachable, say) is not the
// routine's fault.
var ErrRoutine = errors.New("routine failed")

// ErrNoTester is returned when no dispatcher is configured to test routines.
var ErrNoTester = errors.New("no dispatcher to test routines (set the dispatcher peer)")

// ErrTester wraps a failed TestRoutine call (the dispatcher unreachable,
// busy, or refusing the request): the routine was not tested.
var ErrTester = errors.New("testing the routine on the dispatcher failed")

// body decodes an Agora body that is either JSON or a string holding JSON.
func body(raw json.RawMessage) json.RawMessage {
	raw = bytes.TrimSpace(raw)
	var s string
	if len(raw) > 0 && raw[0] == '"' && json.Unmarshal(raw, &s) == nil && json.Valid([]byte(s)) {
		return json.RawMessage(s)
	}
	return raw
}

func quote(raw []byte) json.RawMessage {
	b, _ := json.Marshal(string(raw))
	return b
}

// run sends src and cases to the dispatcher and returns the functions src
// defines and the results, in order.
func run(ctx context.Context, tester Tester, src string, tools []*dispatcherv1.TestRoutineTool, cases []*dispatcherv1.TestRoutineCase) ([]string, []*dispatcherv1.TestRoutineResult, error) {
	if tester == nil {
		return nil, nil, ErrNoTester
	}
	resp, err := tester.TestRoutine(ctx, &dispatcherv1.TestRoutineRequest{Source: src, Tools: tools, Cases: cases})
	if err != nil {
		if status.Code(err) == codes.InvalidArgument && reason(err) == "ROUTINE_INVALID" {
			return nil, nil, fmt.Errorf("%w: %s", ErrRoutine, status.Convert(err).Message())
		}
		return nil, nil, fmt.Errorf("%w: %w", ErrTester, err)
	}
	if len(resp.GetResults()) != len(cases) {
		return nil, nil, fmt.Errorf("%w: %d results for %d cases", ErrTester, len(resp.GetResults()), len(cases))
	}
	return resp.GetFunctions(), resp.GetResults(), nil
}

func reason(err error) string {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetReason()
		}
	}
	return ""
}

// capped keeps a request within TestRoutine's 100 cases.
func capped(examples [][]byte) []json.RawMessage {
	out := make([]json.RawMessage, 0, min(len(examples), 40))
	for _, ex := range examples[:cap(out)] {
		out = append(out, ex)
	}
	return out
}

func testCase(fn string, args ...json.RawMessage) *dispatcherv1.TestRoutineCase {
	c := &dispatcherv1.TestRoutineCase{Function: fn}
	for _, a := range args {
		c.ArgsJson = append(c.ArgsJson, string(a))
	}
	return c
}

func defines(fns []string, fn string) error {
	if !slices.Contains(fns, fn) {
		return fmt.Errorf("%w: routine does not define %s", ErrRoutine, fn)
	}
	return nil
}

// output returns a case's result, or its error as a routine failure.
func output(r *dispatcherv1.TestRoutineResult) (json.RawMessage, error) {
	if r.GetError() != "" {
		return nil, fmt.Errorf("%w: %s", ErrRoutine, r.GetError())
	}
	return json.RawMessage(r.GetOutputJson()), nil
}

// VerifyReceiver runs reply(query, memory) on every example request the
// PD's request schema generates, with tools answering examples of their
// output schemas (and checking arguments against their input schemas),
// and checks each reply against the response schema. It returns the number
// of examples passed. Without a request schema it only checks that src
// defines reply.
func VerifyReceiver(ctx context.Context, tester Tester, src string, doc protocol.Document, tools []Tool) (int, error) {
	var reqSchema, respSchema *schema.Schema
	var err error
	if len(doc.RequestSchema) > 0 {
		if reqSchema, err = schema.Compile(doc.RequestSchema); err != nil {
			return 0, fmt.Errorf("protocol requestSchema: %w", err)
		}
	}
	if len(doc.ResponseSchema) > 0 {
		if respSchema, err = schema.Compile(doc.ResponseSchema); err != nil {
			return 0, fmt.Errorf("protocol responseSchema: %w", err)
		}
	}
	declared := make([]*dispatcherv1.TestRoutineTool, 0, len(tools))
	for _, t := range tools {
		result := json.RawMessage(`{}`)
		if len(t.Output) > 0 {
			out, err := schema.Compile(t.Output)
			if err != nil {
				return 0, fmt.Errorf("output schema of tool %s: %w", t.Name, err)
			}
			result = out.Examples()[0]
		}
		declared = append(declared, &dispatcherv1.TestRoutineTool{Id: t.Name, InputSchemaJson: string(t.Input), ResultJson: string(result)})
	}
	var examples []json.RawMessage
	if reqSchema != nil {
		examples = capped(reqSchema.Examples())
	}
	// Always one case, so a source that does not load fails even without
	// examples.
	cases := []*dispatcherv1.TestRoutineCase{testCase("reply", quote([]byte(`{}`)), json.RawMessage(`{}`))}
	for _, ex := range examples {
		cases = append(cases, testCase("reply", quote(ex), json.RawMessage(`{}`)))
	}
	fns, results, err := run(ctx, tester, src, declared, cases)
	if err != nil {
		return 0, err
	}
	if err := defines(fns, "reply"); err != nil {
		return 0, err
	}
	passed := 0
	for i, ex := range examples {
		got, err := output(results[i+1])
		if err != nil {
			return passed, fmt.Errorf("example %s: %w", ex, err)
		}
		if respSchema != nil {
			if err := respSchema.Validate(body(got)); err != nil {
				return passed, fmt.Errorf("%w: example %s: reply %s does not match responseSchema: %w", ErrRoutine, ex, got, err)
			}
		}
		passed++
	}
	return passed, nil
}

// VerifySender runs send(task) on examples of the task input schema (or
// the PD's request schema) and checks each body against the request schema,
// then parse(reply), when defined, on examples of the PD's success response
// schema and checks each output against the task output schema when given.
func VerifySender(ctx context.Context, tester Tester, src string, doc protocol.Document, taskInput, taskOutput json.RawMessage) (int, error) {
	var reqSchema, inSchema, respSchema, outSchema *schema.Schema
	var err error
	if len(doc.RequestSchema) > 0 {
		if reqSchema, err = schema.Compile(doc.RequestSchema); err != nil {
			return 0, fmt.Errorf("protocol requestSchema: %w", err)
		}
		inSchema = reqSchema
		if len(taskInput) > 0 {
			if inSchema, err = schema.Compile(taskInput); err != nil {
				return 0, fmt.Errorf("task input schema: %w", err)
			}
		}
		if len(doc.ResponseSchema) > 0 {
			if respSchema, err = schema.Compile(SuccessSchema(doc.ResponseSchema)); err != nil {
				return 0, fmt.Errorf("protocol responseSchema: %w", err)
			}
		}
		if len(taskOutput) > 0 {
			if outSchema, err = schema.Compile(taskOutput); err != nil {
				return 0, fmt.Errorf("task output schema: %w", err)
			}
		}
	}
	var sendEx, parseEx []json.RawMessage
	if inSchema != nil {
		sendEx = capped(inSchema.Examples())
	}
	if respSchema != nil {
		parseEx = capped(respSchema.Examples())
	}
	cases := []*dispatcherv1.TestRoutineCase{testCase("send", json.RawMessage(`{}`))}
	for _, ex := range sendEx {
		cases = append(cases, testCase("send", ex))
	}
	for _, ex := range parseEx {
		cases = append(cases, testCase("parse", quote(ex)))
	}
	fns, results, err := run(ctx, tester, src, nil, cases)
	if err != nil {
		return 0, err
	}
	if err := defines(fns, "send"); err != nil {
		return 0, err
	}
	passed := 0
	for i, ex := range sendEx {
		got, err := output(results[1+i])
		if err != nil {
			return passed, fmt.Errorf("example %s: %w", ex, err)
		}
		if err := reqSchema.Validate(body(got)); err != nil {
			return passed, fmt.Errorf("%w: example %s: body %s does not match requestSchema: %w", ErrRoutine, ex, got, err)
		}
		passed++
	}
	if !slices.Contains(fns, "parse") {
		return passed, nil
	}
	for i, ex := range parseEx {
		got, err := output(results[1+len(sendEx)+i])
		if err != nil {
			return passed, fmt.Errorf("reply example %s: %w", ex, err)
		}
		if outSchema != nil {
			if err := outSchema.Validate(got); err != nil {
				return passed, fmt.Errorf("%w: reply example %s: output %s does not match the task output schema: %w", ErrRoutine, ex, got, err)
			}
		}
		passed++
	}
	return passed, nil
}
