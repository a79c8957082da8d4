// Package pdschema compiles the JSON Schemas a protocol document declares and
// validates bodies against them.
//
// The registry is the one reader of PD metadata: it parses requestSchema and
// responseSchema, checks they compile, and hands them over as compact JSON
// (Protocol.request_schema_json, response_schema_json). This package only
// compiles that JSON, the same way (draft 2020-12 unless the schema names
// another, no loader), and remembers the result per PD.
package pdschema

import (
	"bytes"
	"fmt"
	"strings"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/parleyhq/parley/platform/jsondepth"
)

// Schemas are a PD's compiled schemas; nil fields validate anything.
type Schemas struct {
	Request  *jsonschema.Schema
	Response *jsonschema.Schema
}

// Compile compiles a PD's request and response schemas; an empty string
// declares none.
func Compile(requestJSON, responseJSON string) (Schemas, error) {
	var s Schemas
	var err error
	if s.Request, err = compile(requestJSON, "requestSchema"); err != nil {
		return Schemas{}, err
	}
	if s.Response, err = compile(responseJSON, "responseSchema"); err != nil {
		return Schemas{}, err
	}
	return s, nil
}

// CompileSchema compiles one schema the same way, naming it key in errors; an
// empty string declares none and gives a nil schema.
func CompileSchema(raw, key string) (*jsonschema.Schema, error) {
	return compile(raw, key)
}

func compile(raw, key string) (*jsonschema.Schema, error) {
	if raw == "" {
		return nil, nil
	}
	if err := jsondepth.CheckString(raw, jsondepth.Max); err != nil {
		return nil, fmt.Errorf("%s: %w", key, err)
	}
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("%s is not JSON: %w", key, err)
	}
	c := jsonschema.NewCompiler()
	// jsonschema installs a file loader by default; a schema from a PD must
	// never make us read files or URLs, so every external $ref is refused.
	c.UseLoader(refuseLoader{})
	c.DefaultDraft(jsonschema.Draft2020)
	url := "mem:///" + key + ".json"
	if err := c.AddResource(url, doc); err != nil {
		return nil, fmt.Errorf("%s: %w", key, err)
	}
	sch, err := c.Compile(url)
	if err != nil {
		return nil, fmt.Errorf("%s: %s", key, oneLine(err))
	}
	return sch, nil
}

// Cache remembers compiled schemas per PD hash. PDs are immutable, so an
// entry never goes stale; the cache only bounds its size.
type Cache struct {
	max int

	mu      sync.Mutex // guards entries
	entries map[string]cached
}

type cached struct {
	s   Schemas
	err error
}

// NewCache returns a cache holding at most n PDs (at least 1).
func NewCache(n int) *Cache {
	return &Cache{max: max(n, 1), entries: map[string]cached{}}
}

// Compile is Compile, done once per hash.
func (c *Cache) Compile(hash, requestJSON, responseJSON string) (Schemas, error) {
	c.mu.Lock()
	e, ok := c.entries[hash]
	c.mu.Unlock()
	if ok {
		return e.s, e.err
	}
	s, err := Compile(requestJSON, responseJSON)
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.entries) >= c.max {
		clear(c.entries) // crude bound: a flood of distinct PDs must not grow memory forever
	}
	c.entries[hash] = cached{s, err}
	return s, err
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

// refuseLoader refuses every external $ref: a protocol's schema may refer
// only to itself.
type refuseLoader struct{}

func (refuseLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("external $ref %q is not allowed", url)
}
