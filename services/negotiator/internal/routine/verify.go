package routine

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"

	"github.com/parleyhq/parley/services/negotiator/internal/protocol"
	"github.com/parleyhq/parley/services/negotiator/internal/sandbox"
	"github.com/parleyhq/parley/services/negotiator/internal/schema"
)

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

// VerifyReceiver runs reply(query, memory) on every example request the
// PD's request schema generates, with tools answering examples of their
// output schemas, and checks each reply against the response schema. It
// returns the number of examples passed. Without a request schema it only
// checks that src defines reply.
func VerifyReceiver(ctx context.Context, src string, doc protocol.Document, tools []Tool, lim sandbox.Limits) (int, error) {
	if err := sandbox.Check(src, "reply"); err != nil {
		return 0, err
	}
	if len(doc.RequestSchema) == 0 {
		return 0, nil
	}
	reqSchema, err := schema.Compile(doc.RequestSchema)
	if err != nil {
		return 0, fmt.Errorf("protocol requestSchema: %w", err)
	}
	var respSchema *schema.Schema
	if len(doc.ResponseSchema) > 0 {
		if respSchema, err = schema.Compile(doc.ResponseSchema); err != nil {
			return 0, fmt.Errorf("protocol responseSchema: %w", err)
		}
	}
	byName := map[string]Tool{}
	for _, t := range tools {
		byName[t.Name] = t
	}
	fakeTool := func(_ context.Context, name string, args []byte) ([]byte, error) {
		t, ok := byName[name]
		if !ok {
			return nil, fmt.Errorf("unknown tool %q", name)
		}
		if len(t.Input) > 0 {
			in, err := schema.Compile(t.Input)
			if err != nil {
				return nil, err
			}
			if err := in.Validate(args); err != nil {
				return nil, fmt.Errorf("arguments for %s: %w", name, err)
			}
		}
		if len(t.Output) == 0 {
			return []byte(`{}`), nil
		}
		out, err := schema.Compile(t.Output)
		if err != nil {
			return nil, err
		}
		return out.Examples()[0], nil
	}
	passed := 0
	for _, ex := range reqSchema.Examples() {
		got, err := sandbox.Call(ctx, src, "reply", []json.RawMessage{quote(ex), json.RawMessage(`{}`)}, fakeTool, lim)
		if err != nil {
			return passed, fmt.Errorf("example %s: %w", ex, err)
		}
		if respSchema != nil {
			if err := respSchema.Validate(body(got)); err != nil {
				return passed, fmt.Errorf("example %s: reply %s does not match responseSchema: %w", ex, got, err)
			}
		}
		passed++
	}
	return passed, nil
}

// VerifySender runs send(task) on examples of the task input schema (or
// the PD's request schema) and checks each body against the request schema,
// then parse(reply) on examples of the PD's success response schema and
// checks each output against the task output schema when given.
func VerifySender(ctx context.Context, src string, doc protocol.Document, taskInput, taskOutput json.RawMessage, lim sandbox.Limits) (int, error) {
	if err := sandbox.Check(src, "send"); err != nil {
		return 0, err
	}
	if len(doc.RequestSchema) == 0 {
		return 0, nil
	}
	reqSchema, err := schema.Compile(doc.RequestSchema)
	if err != nil {
		return 0, fmt.Errorf("protocol requestSchema: %w", err)
	}
	inSchema := reqSchema
	if len(taskInput) > 0 {
		if inSchema, err = schema.Compile(taskInput); err != nil {
			return 0, fmt.Errorf("task input schema: %w", err)
		}
	}
	passed := 0
	for _, ex := range inSchema.Examples() {
		got, err := sandbox.Call(ctx, src, "send", []json.RawMessage{ex}, nil, lim)
		if err != nil {
			return passed, fmt.Errorf("example %s: %w", ex, err)
		}
		if err := reqSchema.Validate(body(got)); err != nil {
			return passed, fmt.Errorf("example %s: body %s does not match requestSchema: %w", ex, got, err)
		}
		passed++
	}
	if len(doc.ResponseSchema) == 0 || sandbox.Check(src, "parse") != nil {
		return passed, nil
	}
	respSchema, err := schema.Compile(SuccessSchema(doc.ResponseSchema))
	if err != nil {
		return passed, fmt.Errorf("protocol responseSchema: %w", err)
	}
	var outSchema *schema.Schema
	if len(taskOutput) > 0 {
		if outSchema, err = schema.Compile(taskOutput); err != nil {
			return passed, fmt.Errorf("task output schema: %w", err)
		}
	}
	for _, ex := range respSchema.Examples() {
		got, err := sandbox.Call(ctx, src, "parse", []json.RawMessage{quote(ex)}, nil, lim)
		if err != nil {
			return passed, fmt.Errorf("reply example %s: %w", ex, err)
		}
		if outSchema != nil {
			if err := outSchema.Validate(got); err != nil {
				return passed, fmt.Errorf("reply example %s: output %s does not match the task output schema: %w", ex, got, err)
			}
		}
		passed++
	}
	return passed, nil
}
