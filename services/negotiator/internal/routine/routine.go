// Package routine derives Starlark routines from a PD's schemas and a
// tool's schemas, and tests routines (derived or LLM-written) against
// examples generated from those schemas, run by the dispatcher's
// TestRoutine (the runtime that serves them; see Tester).
//
// The routine contract is the dispatcher's (services/dispatcher/README.md,
// Routines); the functions:
//
//	def send(task)            # sender: task input (a dict) → body (a JSON string)
//	def parse(reply)          # sender: reply body → task output (a dict)
//	def reply(query, memory)  # receiver: query body → reply body (a JSON string)
//
// Bodies arrive as Agora bodies: usually a string holding JSON, sometimes
// the JSON value itself; derived routines accept both. The receiver reaches
// its tools with call_tool(name, args), both arguments required.
//
// Fields are matched by name, ignoring case, "_", "-" and spaces
// (weatherCondition matches weather_condition); nothing else is guessed.
// When a required field has no match, derivation fails with
// ErrSchemaMismatch and the LLM path takes over.
package routine

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/parleyhq/parley/services/negotiator/internal/protocol"
	"github.com/parleyhq/parley/services/negotiator/internal/schema"
)

// Sentinel errors.
var (
	// ErrSchemaMismatch: the schemas do not line up; the reasons are in the
	// wrapping *MismatchError.
	ErrSchemaMismatch = errors.New("schemas do not line up")
	// ErrNoSchemas: the PD or the tool declares no schemas to derive from.
	ErrNoSchemas = errors.New("no schemas to derive a routine from")
)

// MismatchError lists why the schemas do not line up.
type MismatchError struct{ Reasons []string }

func (e *MismatchError) Error() string {
	return ErrSchemaMismatch.Error() + ": " + strings.Join(e.Reasons, "; ")
}

func (e *MismatchError) Unwrap() error { return ErrSchemaMismatch }

// Tool is one tool a receiver can call.
type Tool struct {
	Name        string
	Description string
	Input       json.RawMessage
	Output      json.RawMessage
}

// SuccessSchema returns a PD's response schema without the error branch
// derived PDs add: the first anyOf branch when there is one.
func SuccessSchema(resp json.RawMessage) json.RawMessage {
	var m struct {
		AnyOf []json.RawMessage `json:"anyOf"`
	}
	if json.Unmarshal(resp, &m) == nil && len(m.AnyOf) > 0 {
		return m.AnyOf[0]
	}
	return resp
}

func norm(name string) string {
	r := strings.NewReplacer("_", "", "-", "", " ", "")
	return strings.ToLower(r.Replace(name))
}

// pair maps a destination field to a source field.
type pair struct{ dst, src string }

// match maps each destination property to a source property with the same
// normalised name. Required destinations without a source, and required
// sources nobody takes when strict, are reasons for a mismatch.
func match(what string, src, dst []schema.Property, strictSources bool) ([]pair, []string) {
	bySrc := map[string]schema.Property{}
	for _, p := range src {
		bySrc[norm(p.Name)] = p
	}
	used := map[string]bool{}
	var pairs []pair
	var reasons []string
	for _, d := range dst {
		s, ok := bySrc[norm(d.Name)]
		if !ok {
			if d.Required {
				reasons = append(reasons, fmt.Sprintf("%s: nothing provides required field %q", what, d.Name))
			}
			continue
		}
		if !compatible(s.Type, d.Type) {
			reasons = append(reasons, fmt.Sprintf("%s: field %q is %s but %q needs %s", what, s.Name, s.Type, d.Name, d.Type))
			continue
		}
		used[s.Name] = true
		pairs = append(pairs, pair{dst: d.Name, src: s.Name})
	}
	if strictSources {
		for _, s := range src {
			if s.Required && !used[s.Name] {
				reasons = append(reasons, fmt.Sprintf("%s: required field %q would be ignored", what, s.Name))
			}
		}
	}
	return pairs, reasons
}

func compatible(src, dst string) bool {
	return src == "" || dst == "" || src == dst || (src == "integer" && dst == "number")
}

func props(what string, raw json.RawMessage) ([]schema.Property, error) {
	if len(raw) == 0 {
		return nil, fmt.Errorf("%w: %s", ErrNoSchemas, what)
	}
	s, err := schema.Compile(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return s.Properties(), nil
}

func pairsLiteral(ps []pair) string {
	var b strings.Builder
	b.WriteString("[")
	for i, p := range ps {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "(%s, %s)", strconv.Quote(p.dst), strconv.Quote(p.src))
	}
	b.WriteString("]")
	return b.String()
}

func namesLiteral(ps []schema.Property, requiredOnly bool) string {
	var names []string
	for _, p := range ps {
		if !requiredOnly || p.Required {
			names = append(names, strconv.Quote(p.Name))
		}
	}
	return "[" + strings.Join(names, ", ") + "]"
}

// DeriveReceiver writes reply(query, memory) for a PD with request and
// response schemas, served by one tool with input and output schemas.
func DeriveReceiver(doc protocol.Document, tool Tool) (string, error) {
	req, err := props("protocol requestSchema", doc.RequestSchema)
	if err != nil {
		return "", err
	}
	resp, err := props("protocol responseSchema", SuccessSchema(doc.ResponseSchema))
	if err != nil {
		return "", err
	}
	toolIn, err := props("tool "+tool.Name+" input schema", tool.Input)
	if err != nil {
		return "", err
	}
	toolOut, err := props("tool "+tool.Name+" output schema", tool.Output)
	if err != nil {
		return "", err
	}
	args, r1 := match("tool arguments", req, toolIn, true)
	results, r2 := match("reply", toolOut, resp, false)
	if reasons := append(r1, r2...); len(reasons) > 0 {
		return "", &MismatchError{Reasons: reasons}
	}
	return fmt.Sprintf(receiverTemplate, strconv.Quote(doc.Name), strconv.Quote(tool.Name), pairsLiteral(args), namesLiteral(req, true), pairsLiteral(results)), nil
}

const receiverTemplate = `# Receiver routine for %s, derived by Parley from the schemas.
TOOL = %s
ARGS = %s  # (tool argument, request field)
REQUIRED = %s
RESULTS = %s  # (reply field, tool result field)

def _body(v):
    if type(v) == "string":
        return json.decode(v)
    return v

def reply(query, memory):
    q = _body(query)
    if type(q) != "dict":
        return json.encode({"error": "the request must be a JSON object"})
    for field in REQUIRED:
        if field not in q:
            return json.encode({"error": "missing field " + field})
    args = {}
    for param, field in ARGS:
        if field in q:
            args[param] = q[field]
    result = call_tool(TOOL, args)
    if type(result) != "dict":
        return json.encode({"error": "the tool returned no object"})
    if "error" in result:
        return json.encode({"error": str(result["error"])})
    out = {}
    for field, key in RESULTS:
        if key in result:
            out[field] = result[key]
    return json.encode(out)
`

// DeriveSender writes send(task) and parse(reply) for a PD with request and
// response schemas. With the task's schemas (either may be nil) fields are
// mapped by name; without, the task input is the request and the reply the
// output.
func DeriveSender(doc protocol.Document, taskInput, taskOutput json.RawMessage) (string, error) {
	req, err := props("protocol requestSchema", doc.RequestSchema)
	if err != nil {
		return "", err
	}
	resp, err := props("protocol responseSchema", SuccessSchema(doc.ResponseSchema))
	if err != nil {
		return "", err
	}
	in, out := req, resp
	if len(taskInput) > 0 {
		if in, err = props("task input schema", taskInput); err != nil {
			return "", err
		}
	}
	if len(taskOutput) > 0 {
		if out, err = props("task output schema", taskOutput); err != nil {
			return "", err
		}
	}
	sendPairs, r1 := match("request", in, req, false)
	parsePairs, r2 := match("task output", resp, out, false)
	if reasons := append(r1, r2...); len(reasons) > 0 {
		return "", &MismatchError{Reasons: reasons}
	}
	return fmt.Sprintf(senderTemplate, strconv.Quote(doc.Name), pairsLiteral(sendPairs), pairsLiteral(parsePairs)), nil
}

const senderTemplate = `# Sender routine for %s, derived by Parley from the schemas.
SEND = %s  # (request field, task input field)
PARSE = %s  # (task output field, reply field)

def send(task):
    body = {}
    for field, key in SEND:
        if key in task:
            body[field] = task[key]
    return json.encode(body)

def parse(reply):
    r = reply
    if type(r) == "string":
        r = json.decode(r)
    if type(r) != "dict":
        fail("the reply is not a JSON object")
    if "error" in r:
        fail("the peer replied with an error: " + str(r["error"]))
    out = {}
    for field, key in PARSE:
        if key in r:
            out[field] = r[key]
    return out
`
