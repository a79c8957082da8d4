// Package negotiation holds the rules of protocol negotiation as plain Go:
// deterministic derivation of a PD from a task's JSON Schemas, the Parley
// negotiation meta-protocol (its PD and messages), the state machine one
// side of a negotiation runs, the reference library's FINALPROTOCOL
// exchange, and the per-(task, target) thresholds. It makes no LLM, gRPC or
// storage calls.
package negotiation

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/parleyhq/parley/services/negotiator/internal/protocol"
	"github.com/parleyhq/parley/services/negotiator/internal/schema"
)

// Sentinel errors.
var (
	// ErrNoSchemas: the task lacks input or output schemas, so the PD
	// cannot be derived without an LLM.
	ErrNoSchemas = errors.New("task has no input and output schemas")
	// ErrInvalidTask: the task's name or schemas are malformed.
	ErrInvalidTask = errors.New("invalid task")
)

// Task is what a sending agent wants done.
type Task struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Input       json.RawMessage `json:"inputSchema,omitempty"`
	Output      json.RawMessage `json:"outputSchema,omitempty"`
}

// HasSchemas reports whether both schemas are declared.
func (t Task) HasSchemas() bool { return len(t.Input) > 0 && len(t.Output) > 0 }

// ErrorSchema is the schema of the error reply every derived PD allows.
const ErrorSchema = `{"additionalProperties":false,"properties":{"error":{"type":"string"}},"required":["error"],"type":"object"}`

// DeriveProtocol writes the PD for t from its schemas, with no LLM: YAML
// front matter (name, description, multiround: false, requestSchema,
// responseSchema) and a text that restates the schemas for people and
// LLMs. Equal inputs (after canonical JSON encoding of the schemas) give
// byte-identical PDs, hence the same hash on both sides.
//
// requestSchema is the task's input schema; responseSchema accepts the
// task's output schema or ErrorSchema.
func DeriveProtocol(t Task) ([]byte, error) {
	if !t.HasSchemas() {
		return nil, ErrNoSchemas
	}
	if strings.TrimSpace(t.Name) == "" {
		return nil, fmt.Errorf("%w: name is empty", ErrInvalidTask)
	}
	in, inSchema, err := objectSchema("input", t.Input)
	if err != nil {
		return nil, err
	}
	out, outSchema, err := objectSchema("output", t.Output)
	if err != nil {
		return nil, err
	}
	resp := []byte(`{"anyOf":[` + string(out) + `,` + ErrorSchema + `]}`)
	name, _ := json.Marshal(t.Name)
	desc := t.Description
	if desc == "" {
		desc = "Derived by Parley from the task's JSON Schemas."
	}
	descJSON, _ := json.Marshal(desc)

	var b strings.Builder
	b.WriteString("---\n")
	fmt.Fprintf(&b, "name: %s\n", name)
	fmt.Fprintf(&b, "description: %s\n", descJSON)
	b.WriteString("multiround: false\n")
	fmt.Fprintf(&b, "%s: %s\n", protocol.RequestSchemaKey, in)
	fmt.Fprintf(&b, "%s: %s\n", protocol.ResponseSchemaKey, resp)
	b.WriteString("---\n\n")
	fmt.Fprintf(&b, "Protocol for the task %s: %s\n\n", name, desc)
	b.WriteString("The sender sends one JSON object, valid against requestSchema, with these fields:\n")
	writeFields(&b, inSchema.Properties())
	b.WriteString("\nThe receiver replies with one JSON object, valid against the first branch of responseSchema, with these fields:\n")
	writeFields(&b, outSchema.Properties())
	b.WriteString("\nIf the receiver cannot answer, it replies {\"error\": \"<reason>\"} instead.\n")
	return []byte(b.String()), nil
}

func objectSchema(which string, raw json.RawMessage) ([]byte, *schema.Schema, error) {
	canon, err := schema.Canonical(raw)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %s schema: %w", ErrInvalidTask, which, err)
	}
	s, err := schema.Compile(canon)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %s schema: %w", ErrInvalidTask, which, err)
	}
	if s.Type() != "object" || len(s.Properties()) == 0 {
		return nil, nil, fmt.Errorf("%w: %s schema must be an object with properties", ErrInvalidTask, which)
	}
	return canon, s, nil
}

func writeFields(b *strings.Builder, props []schema.Property) {
	for _, p := range props {
		typ := p.Type
		if typ == "" {
			typ = "any"
		}
		req := "optional"
		if p.Required {
			req = "required"
		}
		fmt.Fprintf(b, "- %s (%s, %s)", p.Name, typ, req)
		if len(p.Enum) > 0 {
			vals, _ := json.Marshal(p.Enum)
			fmt.Fprintf(b, ", one of %s", vals)
		}
		if p.Desc != "" {
			fmt.Fprintf(b, ": %s", strings.ReplaceAll(p.Desc, "\n", " "))
		}
		b.WriteString("\n")
	}
}
