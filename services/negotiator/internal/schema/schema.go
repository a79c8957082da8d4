// Package schema holds the JSON Schema helpers the negotiator needs:
// canonical encoding (so derived PDs are byte-identical for equal inputs),
// validation, a flat view of an object schema's properties, and example
// instances generated from a schema to test routines.
//
// Only the common subset of JSON Schema is understood for examples and
// property views: type, properties, required, enum, const, items, format
// (date, date-time), minimum, anyOf/oneOf (first branch). Validation uses
// the full draft 2020-12 validator.
package schema

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/parleyhq/parley/platform/jsondepth"
)

// ErrInvalid is wrapped by every error about a malformed schema.
var ErrInvalid = errors.New("invalid JSON Schema")

// Canonical re-encodes a JSON document with sorted object keys, no
// insignificant whitespace and no HTML escaping. Numbers keep their text.
func Canonical(raw []byte) ([]byte, error) {
	v, err := decode(raw)
	if err != nil {
		return nil, err
	}
	return encode(v)
}

func decode(raw []byte) (any, error) {
	if err := jsondepth.Check(raw, jsondepth.Max); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if d.More() {
		return nil, fmt.Errorf("%w: trailing data", ErrInvalid)
	}
	return v, nil
}

func encode(v any) ([]byte, error) {
	var b bytes.Buffer
	e := json.NewEncoder(&b)
	e.SetEscapeHTML(false)
	if err := e.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimRight(b.Bytes(), "\n"), nil
}

// Schema is a compiled schema.
type Schema struct {
	raw      map[string]any
	compiled *jsonschema.Schema
}

// Compile parses and compiles raw, which must be a JSON object.
func Compile(raw []byte) (*Schema, error) {
	v, err := decode(raw)
	if err != nil {
		return nil, err
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%w: not a JSON object", ErrInvalid)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	c := jsonschema.NewCompiler()
	// jsonschema installs a file loader by default; a schema from a PD must
	// never make us read files or URLs, so every external $ref is refused.
	c.UseLoader(refuseLoader{})
	if err := c.AddResource("mem:///schema.json", doc); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	sch, err := c.Compile("mem:///schema.json")
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return &Schema{raw: m, compiled: sch}, nil
}

// Validate checks a JSON instance against the schema.
func (s *Schema) Validate(instance []byte) error {
	if err := jsondepth.Check(instance, jsondepth.Max); err != nil {
		return fmt.Errorf("instance: %w", err)
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(instance))
	if err != nil {
		return fmt.Errorf("instance is not JSON: %w", err)
	}
	return s.compiled.Validate(v)
}

// Property is one property of an object schema.
type Property struct {
	Name     string
	Type     string // "" when not declared
	Required bool
	Desc     string
	Enum     []any
}

// Properties lists an object schema's properties sorted by name.
func (s *Schema) Properties() []Property { return properties(s.raw) }

// Type is the schema's declared type, or "".
func (s *Schema) Type() string { return typeOf(s.raw) }

func properties(m map[string]any) []Property {
	req := map[string]bool{}
	if r, ok := m["required"].([]any); ok {
		for _, x := range r {
			if s, ok := x.(string); ok {
				req[s] = true
			}
		}
	}
	props, _ := m["properties"].(map[string]any)
	out := make([]Property, 0, len(props))
	for name, p := range props {
		pm, _ := p.(map[string]any)
		prop := Property{Name: name, Required: req[name], Type: typeOf(pm)}
		prop.Desc, _ = pm["description"].(string)
		prop.Enum, _ = pm["enum"].([]any)
		out = append(out, prop)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func typeOf(m map[string]any) string {
	switch t := m["type"].(type) {
	case string:
		return t
	case []any:
		for _, x := range t {
			if s, ok := x.(string); ok && s != "null" {
				return s
			}
		}
	}
	return ""
}

// Examples returns instances of the schema as JSON: one with every
// property set, and, when it differs, one with only the required ones.
// They are deterministic.
func (s *Schema) Examples() [][]byte {
	full, _ := encode(example(s.raw, true, 0))
	minimal, _ := encode(example(s.raw, false, 0))
	if bytes.Equal(full, minimal) {
		return [][]byte{full}
	}
	return [][]byte{full, minimal}
}

func example(m map[string]any, all bool, depth int) any {
	if depth > 8 {
		return nil
	}
	if c, ok := m["const"]; ok {
		return c
	}
	if e, ok := m["enum"].([]any); ok && len(e) > 0 {
		return e[0]
	}
	for _, k := range []string{"anyOf", "oneOf"} {
		if branches, ok := m[k].([]any); ok && len(branches) > 0 {
			if b, ok := branches[0].(map[string]any); ok {
				return example(b, all, depth+1)
			}
		}
	}
	switch typeOf(m) {
	case "object":
		out := map[string]any{}
		props, _ := m["properties"].(map[string]any)
		for _, p := range properties(m) {
			if all || p.Required {
				pm, _ := props[p.Name].(map[string]any)
				out[p.Name] = example(pm, all, depth+1)
			}
		}
		return out
	case "array":
		items, _ := m["items"].(map[string]any)
		return []any{example(items, all, depth+1)}
	case "string":
		switch m["format"] {
		case "date":
			return "2024-10-15"
		case "date-time":
			return "2024-10-15T12:00:00Z"
		}
		return "example"
	case "integer":
		if v, ok := m["minimum"].(json.Number); ok {
			return v
		}
		return json.Number("1")
	case "number":
		if v, ok := m["minimum"].(json.Number); ok {
			return v
		}
		return json.Number("1.5")
	case "boolean":
		return true
	case "null":
		return nil
	}
	return "example"
}

// refuseLoader refuses every external $ref: a protocol's schema may refer
// only to itself.
type refuseLoader struct{}

func (refuseLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("external $ref %q is not allowed", url)
}
