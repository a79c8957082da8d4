package pd

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"go.yaml.in/yaml/v3"

	"github.com/parleyhq/parley/platform/jsondepth"
)

// ErrInvalidMetadata reports a metadata block that cannot be used: bad YAML
// in a front-matter block, a key of the wrong type, or a machine-readable
// part that does not compile. Errors wrapping it say which key and why.
var ErrInvalidMetadata = errors.New("invalid protocol metadata")

// Defaults for missing metadata, as the Python reference library uses them.
const (
	DefaultName        = "Unnamed protocol"
	DefaultDescription = "No description provided"
)

// Layout is where a document keeps its metadata block.
type Layout int

// Layouts (specs/agora.md, section 4).
const (
	// LayoutNone: no metadata block; every key has its default.
	LayoutNone Layout = iota
	// LayoutFrontMatter: a line "---", YAML, a line "---", then text.
	LayoutFrontMatter
	// LayoutStandard: YAML, a line "---", then text (the Working Standard).
	LayoutStandard
)

// Options tune Parse.
type Options struct {
	// Strict rejects a document whose metadata lacks name, description or
	// multiround instead of applying defaults.
	Strict bool
}

// Metadata is what Parse reads from a document's metadata block.
type Metadata struct {
	Layout      Layout
	Name        string
	Description string
	Multiround  bool
	Tags        []string
	// RequestSchemaJSON and ResponseSchemaJSON are the compiled-and-checked
	// JSON Schemas from requestSchema and responseSchema, as compact JSON;
	// empty when absent.
	RequestSchemaJSON  string
	ResponseSchemaJSON string
	// StateMachine is the validated stateMachine key; nil when absent.
	StateMachine *StateMachine
}

// Parse reads the metadata block of content. Layout: when the first line is
// exactly "---", front matter up to the next "---" line; otherwise the text
// before the first "---" line, if it is a YAML mapping. A line may end in
// CRLF. Content itself is never changed.
//
// A front-matter block must be a valid YAML mapping. A Standard-layout
// candidate that is not a YAML mapping is taken for prose: no metadata.
// Errors wrap ErrInvalidMetadata and name the offending key.
func Parse(content []byte, opts Options) (*Metadata, error) {
	md := &Metadata{Name: DefaultName, Description: DefaultDescription}
	block, layout := metadataBlock(content)
	var root yaml.Node
	if layout != LayoutNone {
		err := yaml.Unmarshal(block, &root)
		if err == nil && yamlTooDeep(&root, jsondepth.Max) {
			err = fmt.Errorf("mappings and sequences nested more than %d levels deep", jsondepth.Max)
		}
		switch {
		case err != nil && layout == LayoutFrontMatter:
			return nil, fmt.Errorf("metadata block is not valid YAML (%s): %w", oneLine(err.Error()), ErrInvalidMetadata)
		case err != nil:
			layout = LayoutNone
		}
	}
	var mapping *yaml.Node
	if layout != LayoutNone && len(root.Content) > 0 {
		mapping = root.Content[0]
		if mapping.Kind != yaml.MappingNode {
			if layout == LayoutFrontMatter {
				return nil, fmt.Errorf("metadata block must be a YAML mapping of keys to values: %w", ErrInvalidMetadata)
			}
			layout, mapping = LayoutNone, nil
		}
	}
	md.Layout = layout
	if mapping == nil {
		if opts.Strict {
			return nil, fmt.Errorf("document has no metadata block with name, description and multiround (strict mode): %w", ErrInvalidMetadata)
		}
		return md, nil
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(mapping.Content); i += 2 {
		k, v := mapping.Content[i], mapping.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			continue
		}
		seen[k.Value] = true
		if err := md.setKey(k.Value, v); err != nil {
			return nil, fmt.Errorf("metadata key %s: %w: %w", k.Value, err, ErrInvalidMetadata)
		}
	}
	if opts.Strict {
		for _, k := range []string{"name", "description", "multiround"} {
			if !seen[k] {
				return nil, fmt.Errorf("metadata key %s is missing (strict mode): %w", k, ErrInvalidMetadata)
			}
		}
	}
	return md, nil
}

func (md *Metadata) setKey(key string, v *yaml.Node) error {
	switch key {
	case "name":
		s, err := scalarText(v)
		if err != nil || s == "" {
			return errOr(err, "must not be empty")
		}
		md.Name = s
	case "description":
		s, err := scalarText(v)
		if err != nil || s == "" {
			return errOr(err, "must not be empty")
		}
		md.Description = s
	case "multiround":
		if v.Kind != yaml.ScalarNode || v.Tag != "!!bool" {
			return fmt.Errorf("must be true or false, got %q", v.Value)
		}
		return v.Decode(&md.Multiround)
	case "tags":
		switch v.Kind {
		case yaml.ScalarNode:
			s, err := scalarText(v)
			if err != nil {
				return err
			}
			md.Tags = []string{s}
		case yaml.SequenceNode:
			for i, e := range v.Content {
				s, err := scalarText(e)
				if err != nil {
					return fmt.Errorf("[%d]: %w", i, err)
				}
				md.Tags = append(md.Tags, s)
			}
		default:
			return errors.New("must be a list of strings")
		}
	case "requestSchema":
		s, err := schemaJSON(v, "requestSchema")
		if err != nil {
			return err
		}
		md.RequestSchemaJSON = s
	case "responseSchema":
		s, err := schemaJSON(v, "responseSchema")
		if err != nil {
			return err
		}
		md.ResponseSchemaJSON = s
	case "stateMachine":
		sm, err := parseStateMachine(v)
		if err != nil {
			return err
		}
		md.StateMachine = sm
	}
	return nil // other keys are allowed and ignored
}

func errOr(err error, msg string) error {
	if err != nil {
		return err
	}
	return errors.New(msg)
}

// metadataBlock finds the YAML bytes of the metadata block and its layout.
func metadataBlock(content []byte) ([]byte, Layout) {
	first, rest, found := bytes.Cut(content, []byte("\n"))
	if isRule(first) {
		if !found {
			return nil, LayoutNone
		}
		if end := ruleLine(rest); end >= 0 {
			return rest[:end], LayoutFrontMatter
		}
		return nil, LayoutNone
	}
	if end := ruleLine(content); end >= 0 {
		return content[:end], LayoutStandard
	}
	return nil, LayoutNone
}

// ruleLine returns the offset of the first line of b that is exactly "---"
// (optionally ending in CR), or -1.
func ruleLine(b []byte) int {
	off := 0
	for off <= len(b) {
		line := b[off:]
		next := len(b) + 1
		if i := bytes.IndexByte(line, '\n'); i >= 0 {
			line, next = line[:i], off+i+1
		}
		if isRule(line) {
			return off
		}
		off = next
	}
	return -1
}

func isRule(line []byte) bool {
	return string(bytes.TrimSuffix(line, []byte("\r"))) == "---"
}

// yamlTooDeep reports whether n holds mappings and sequences nested more
// than limit deep. Aliases are not followed: what they name is walked where
// it is defined (and schemaJSON checks a schema after expansion).
func yamlTooDeep(n *yaml.Node, limit int) bool {
	if n.Kind == yaml.MappingNode || n.Kind == yaml.SequenceNode {
		if limit == 0 {
			return true
		}
		limit--
	}
	for _, c := range n.Content {
		if yamlTooDeep(c, limit) {
			return true
		}
	}
	return false
}

// scalarText returns a scalar's text; numbers and booleans keep their
// spelling. Null is an error, as are mappings and sequences.
func scalarText(v *yaml.Node) (string, error) {
	if v.Kind != yaml.ScalarNode || v.Tag == "!!null" {
		return "", errors.New("must be a string")
	}
	return v.Value, nil
}

// schemaJSON turns a JSON Schema written as YAML (or as a string holding
// JSON) into compact JSON and checks that it compiles.
func schemaJSON(v *yaml.Node, where string) (string, error) {
	var doc any
	if v.Kind == yaml.ScalarNode && v.Tag == "!!str" {
		if err := jsondepth.CheckString(v.Value, jsondepth.Max); err != nil {
			return "", fmt.Errorf("is nested more than %d levels deep", jsondepth.Max)
		}
		if err := json.Unmarshal([]byte(v.Value), &doc); err != nil {
			return "", fmt.Errorf("is a string but not JSON: %s", oneLine(err.Error()))
		}
	} else if err := v.Decode(&doc); err != nil {
		return "", err
	}
	doc, err := jsonValue(doc, "")
	if err != nil {
		return "", err
	}
	raw, err := json.Marshal(doc)
	if err != nil {
		return "", err
	}
	// YAML aliases can nest a schema deeper than its text shows.
	if err := jsondepth.Check(raw, jsondepth.Max); err != nil {
		return "", fmt.Errorf("is nested more than %d levels deep", jsondepth.Max)
	}
	if err := compileSchema(raw, where); err != nil {
		return "", err
	}
	return string(raw), nil
}

// compileSchema compiles a JSON Schema (draft 2020-12 unless it names
// another $schema). The compiler's default loader reads file: URLs, so it is
// replaced by one that refuses every URL: only refs inside the document
// resolve, and nothing reaches the file system or the network.
func compileSchema(raw []byte, where string) error {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return err
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.UseLoader(refuseLoader{})
	loc := "https://parley.invalid/pd/" + where + ".json"
	if err := c.AddResource(loc, doc); err != nil {
		return fmt.Errorf("is not a JSON Schema: %s", oneLine(err.Error()))
	}
	if _, err := c.Compile(loc); err != nil {
		var le *jsonschema.LoadURLError
		if errors.As(err, &le) && errors.Is(le.Err, errRefOutside) {
			return fmt.Errorf("$ref %q points outside the schema; only refs inside it are allowed", le.URL)
		}
		return fmt.Errorf("is not a valid JSON Schema: %s", oneLine(err.Error()))
	}
	return nil
}

var errRefOutside = errors.New("refs outside the schema are refused")

// refuseLoader is a jsonschema.URLLoader that loads nothing.
type refuseLoader struct{}

func (refuseLoader) Load(string) (any, error) { return nil, errRefOutside }

// jsonValue converts a decoded YAML value into one encoding/json accepts.
func jsonValue(v any, path string) (any, error) {
	switch t := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(t))
		for k, e := range t {
			c, err := jsonValue(e, path+"/"+k)
			if err != nil {
				return nil, err
			}
			out[k] = c
		}
		return out, nil
	case map[any]any:
		out := make(map[string]any, len(t))
		for k, e := range t {
			ks, ok := k.(string)
			if !ok {
				return nil, fmt.Errorf("at %q: key %v is not a string", path, k)
			}
			c, err := jsonValue(e, path+"/"+ks)
			if err != nil {
				return nil, err
			}
			out[ks] = c
		}
		return out, nil
	case []any:
		out := make([]any, len(t))
		for i, e := range t {
			c, err := jsonValue(e, fmt.Sprintf("%s/%d", path, i))
			if err != nil {
				return nil, err
			}
			out[i] = c
		}
		return out, nil
	case float64:
		if math.IsNaN(t) || math.IsInf(t, 0) {
			return nil, fmt.Errorf("at %q: %v is not a JSON number", path, t)
		}
		return t, nil
	case time.Time:
		return t.Format(time.RFC3339Nano), nil
	case nil, bool, string, int, int64, uint64, json.Number:
		return t, nil
	default:
		return nil, fmt.Errorf("at %q: %T is not a JSON value", path, v)
	}
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
