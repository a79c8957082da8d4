package routine

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"go.starlark.net/syntax"

	negotiatorv1 "github.com/parleyhq/parley/gen/parley/negotiator/v1"
	"github.com/parleyhq/parley/services/negotiator/internal/protocol"
	"github.com/parleyhq/parley/services/negotiator/internal/schema"
)

// ErrRoutine is wrapped when a routine's source does not parse or lacks a
// function its side needs.
var ErrRoutine = errors.New("routine failed")

// maxExamples bounds the examples of one call in a check, so a check stays
// within what the dispatcher's dry run accepts.
const maxExamples = 40

// fileOptions are the dialect options of the dispatcher's runtime; a
// source that parses here may still fail there (the check is for that).
var fileOptions = &syntax.FileOptions{While: true, TopLevelControl: true, GlobalReassign: true}

// Parses checks, without running anything, that src is Starlark that
// defines fns at top level: the part of a check that needs no runtime, so
// an LLM can be told at once what to fix. Errors wrap ErrRoutine.
func Parses(src string, fns ...string) error {
	f, err := fileOptions.Parse("routine.star", src, 0)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrRoutine, err)
	}
	var defined []string
	for _, st := range f.Stmts {
		if d, ok := st.(*syntax.DefStmt); ok {
			defined = append(defined, d.Name.Name)
		}
	}
	for _, fn := range fns {
		if !slices.Contains(defined, fn) {
			return fmt.Errorf("%w: routine does not define %s", ErrRoutine, fn)
		}
	}
	return nil
}

// examples returns at most maxExamples examples of s, each as the argument
// list (a JSON array) of a call: the example, quoted when asString (Agora
// bodies arrive as strings holding JSON), followed by extra.
func examples(s *schema.Schema, asString bool, extra ...json.RawMessage) [][]byte {
	all := s.Examples()
	out := make([][]byte, 0, min(len(all), maxExamples))
	for _, ex := range all[:cap(out)] {
		arg := json.RawMessage(ex)
		if asString {
			arg = quote(ex)
		}
		args, _ := json.Marshal(append([]json.RawMessage{arg}, extra...))
		out = append(out, args)
	}
	return out
}

func quote(raw []byte) json.RawMessage {
	b, _ := json.Marshal(string(raw))
	return b
}

func compile(what string, raw json.RawMessage) (*schema.Schema, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	s, err := schema.Compile(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return s, nil
}

// ReceiverCheck returns how the dispatcher checks a receiver routine:
// reply(query, memory) on every example request the PD's request schema
// generates, each reply matching the response schema, with tools answering
// an example of their output schemas (and checking their arguments against
// their input schemas). Without a request schema it only asks that the
// source define reply.
func ReceiverCheck(doc protocol.Document, tools []Tool) (*negotiatorv1.RoutineCheck, error) {
	reqSchema, err := compile("protocol requestSchema", doc.RequestSchema)
	if err != nil {
		return nil, err
	}
	if _, err := compile("protocol responseSchema", doc.ResponseSchema); err != nil {
		return nil, err
	}
	c := &negotiatorv1.RoutineCheck{Functions: []string{"reply"}}
	for _, t := range tools {
		result := json.RawMessage(`{}`)
		out, err := compile("output schema of tool "+t.Name, t.Output)
		if err != nil {
			return nil, err
		}
		if out != nil {
			result = out.Examples()[0]
		}
		c.Tools = append(c.Tools, &negotiatorv1.RoutineCheckTool{Name: t.Name, InputSchemaJson: t.Input, ResultJson: result})
	}
	if reqSchema != nil {
		c.Calls = append(c.Calls, &negotiatorv1.RoutineCheckCall{
			Function:         "reply",
			ArgsJson:         examples(reqSchema, true, json.RawMessage(`{}`)),
			OutputSchemaJson: doc.ResponseSchema,
		})
	}
	return c, nil
}

// SenderCheck returns how the dispatcher checks a sender routine: send(task)
// on examples of the task input schema (or the PD's request schema), each
// body matching the request schema, then parse(reply), when defined, on
// examples of the PD's success response schema, each output matching the
// task output schema when given. Without a request schema it only asks that
// the source define send.
func SenderCheck(doc protocol.Document, taskInput, taskOutput json.RawMessage) (*negotiatorv1.RoutineCheck, error) {
	c := &negotiatorv1.RoutineCheck{Functions: []string{"send"}}
	reqSchema, err := compile("protocol requestSchema", doc.RequestSchema)
	if err != nil || reqSchema == nil {
		return c, err
	}
	inSchema := reqSchema
	if in, err := compile("task input schema", taskInput); err != nil {
		return nil, err
	} else if in != nil {
		inSchema = in
	}
	if _, err := compile("task output schema", taskOutput); err != nil {
		return nil, err
	}
	c.Calls = append(c.Calls, &negotiatorv1.RoutineCheckCall{Function: "send", ArgsJson: examples(inSchema, false), OutputSchemaJson: doc.RequestSchema})
	if len(doc.ResponseSchema) > 0 {
		success := SuccessSchema(doc.ResponseSchema)
		respSchema, err := compile("protocol responseSchema", success)
		if err != nil {
			return nil, err
		}
		c.Calls = append(c.Calls, &negotiatorv1.RoutineCheckCall{Function: "parse", ArgsJson: examples(respSchema, true), OutputSchemaJson: taskOutput, Optional: true})
	}
	return c, nil
}

// Check returns the check of a routine of side for doc.
func Check(doc protocol.Document, side negotiatorv1.RoutineSide, tools []Tool, taskInput, taskOutput json.RawMessage) (*negotiatorv1.RoutineCheck, error) {
	if side == negotiatorv1.RoutineSide_ROUTINE_SIDE_SENDER {
		return SenderCheck(doc, taskInput, taskOutput)
	}
	return ReceiverCheck(doc, tools)
}
