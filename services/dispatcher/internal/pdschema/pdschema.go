// Package pdschema reads the JSON Schemas a protocol document declares in its
// metadata block and validates bodies against them.
//
// A PD's metadata is YAML: between a first line "---" and the next line "---"
// (layout A), or from the start up to the first line "---" (layout B). Parley
// PDs may add the keys request_schema and response_schema (camelCase
// requestSchema and responseSchema also work), each a YAML mapping or a
// string holding JSON. A PD without them validates nothing.
package pdschema

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"go.yaml.in/yaml/v3"
)

// Schemas are a PD's compiled schemas; nil fields validate anything.
type Schemas struct {
	Request  *jsonschema.Schema
	Response *jsonschema.Schema
}

// Metadata returns the metadata block of a PD, or nil.
func Metadata(pd []byte) []byte {
	lines := bytes.SplitAfter(pd, []byte("\n"))
	isSep := func(l []byte) bool { return string(bytes.TrimRight(l, "\r\n")) == "---" }
	start := 0
	if len(lines) > 0 && isSep(lines[0]) {
		start = 1
	}
	var out []byte
	for _, l := range lines[start:] {
		if isSep(l) {
			return out
		}
		out = append(out, l...)
	}
	return nil
}

// Parse compiles the schemas declared by pd. A PD with no metadata or no
// schema keys gives empty Schemas; a malformed schema is an error.
func Parse(pd []byte) (Schemas, error) {
	meta := Metadata(pd)
	if meta == nil {
		return Schemas{}, nil
	}
	var m map[string]any
	if err := yaml.Unmarshal(meta, &m); err != nil {
		return Schemas{}, nil // not YAML: plain-text PDs declare no schemas
	}
	var s Schemas
	var err error
	if s.Request, err = compile(m, "request_schema", "requestSchema"); err != nil {
		return Schemas{}, err
	}
	if s.Response, err = compile(m, "response_schema", "responseSchema"); err != nil {
		return Schemas{}, err
	}
	return s, nil
}

func compile(m map[string]any, keys ...string) (*jsonschema.Schema, error) {
	var v any
	var key string
	for _, k := range keys {
		if x, ok := m[k]; ok && x != nil {
			v, key = x, k
			break
		}
	}
	if v == nil {
		return nil, nil
	}
	if str, ok := v.(string); ok {
		dec, err := jsonschema.UnmarshalJSON(strings.NewReader(str))
		if err != nil {
			return nil, fmt.Errorf("%s is not JSON: %w", key, err)
		}
		v = dec
	} else {
		// Round-trip through JSON so numbers and maps take the types the
		// compiler expects.
		b, err := json.Marshal(v)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", key, err)
		}
		if v, err = jsonschema.UnmarshalJSON(bytes.NewReader(b)); err != nil {
			return nil, fmt.Errorf("%s: %w", key, err)
		}
	}
	c := jsonschema.NewCompiler()
	url := "mem:///" + key + ".json"
	if err := c.AddResource(url, v); err != nil {
		return nil, fmt.Errorf("%s: %w", key, err)
	}
	sch, err := c.Compile(url)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", key, err)
	}
	return sch, nil
}

// Validate checks raw JSON against s; a nil schema accepts everything.
func Validate(s *jsonschema.Schema, body []byte) error {
	if s == nil {
		return nil
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("body is not JSON: %w", err)
	}
	if err := s.Validate(v); err != nil {
		return fmt.Errorf("body does not match the protocol's schema: %s", oneLine(err))
	}
	return nil
}

func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}
