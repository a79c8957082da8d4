// Package protocol reads Agora protocol documents (PDs): the YAML metadata
// block in either layout (front matter "---\nYAML\n---\ntext", or the
// Working Standard's "YAML\n---\ntext"), the Parley extension keys
// requestSchema and responseSchema, and the hashes. The bytes are never
// changed: hashes cover exactly what was given.
package protocol

import (
	"bytes"
	"crypto/sha1" //nolint:gosec // SHA-1 is the Agora protocol id; SHA-256 guards against collisions
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"

	"go.yaml.in/yaml/v3"
)

// Metadata keys of a PD. RequestSchemaKey and ResponseSchemaKey are
// Parley's: JSON Schemas of the request and response bodies.
const (
	RequestSchemaKey  = "requestSchema"
	ResponseSchemaKey = "responseSchema"
)

// ErrMalformed is wrapped by errors about unreadable metadata.
var ErrMalformed = errors.New("malformed protocol document")

// Document is a parsed PD.
type Document struct {
	Name        string
	Description string
	Multiround  bool
	// HasMetadata is false when no metadata block was found.
	HasMetadata bool
	// RequestSchema and ResponseSchema are the JSON Schemas declared in the
	// metadata, re-encoded as JSON; nil when absent.
	RequestSchema  json.RawMessage
	ResponseSchema json.RawMessage
	// Text is what follows the metadata block.
	Text string
}

// Parse reads content. A PD without a metadata block is not an error: it
// gets the reference library's defaults and HasMetadata false.
func Parse(content []byte) (Document, error) {
	d := Document{Name: "Unnamed protocol", Description: "No description provided", Text: string(content)}
	meta, text, ok := split(content)
	if !ok {
		return d, nil
	}
	var m map[string]any
	if err := yaml.Unmarshal(meta, &m); err != nil {
		return d, fmt.Errorf("%w: metadata: %w", ErrMalformed, err)
	}
	if m == nil {
		return d, nil
	}
	d.HasMetadata = true
	d.Text = string(text)
	if s, ok := m["name"].(string); ok {
		d.Name = s
	}
	if s, ok := m["description"].(string); ok {
		d.Description = s
	}
	if b, ok := m["multiround"].(bool); ok {
		d.Multiround = b
	}
	for key, dst := range map[string]*json.RawMessage{RequestSchemaKey: &d.RequestSchema, ResponseSchemaKey: &d.ResponseSchema} {
		v, ok := m[key]
		if !ok {
			continue
		}
		if _, isMap := v.(map[string]any); !isMap {
			return d, fmt.Errorf("%w: %s is not an object", ErrMalformed, key)
		}
		raw, err := json.Marshal(v)
		if err != nil {
			return d, fmt.Errorf("%w: %s: %w", ErrMalformed, key, err)
		}
		*dst = raw
	}
	return d, nil
}

// split finds the metadata block: layout A when the first line is exactly
// "---", else layout B up to the first line that is exactly "---".
func split(content []byte) (meta, text []byte, ok bool) {
	lines := bytes.SplitAfter(content, []byte("\n"))
	isSep := func(l []byte) bool { return string(bytes.TrimRight(l, "\r\n")) == "---" }
	first, metaStart := 0, 0
	if len(lines) > 0 && isSep(lines[0]) {
		first, metaStart = 1, len(lines[0])
	}
	off := metaStart
	for _, l := range lines[first:] {
		if isSep(l) {
			return content[metaStart:off], content[off+len(l):], true
		}
		off += len(l)
	}
	return nil, nil, false
}

// SHA1Hex is the lowercase hex SHA-1 of content, the Agora protocol id.
func SHA1Hex(content []byte) string {
	s := sha1.Sum(content) //nolint:gosec // see import
	return hex.EncodeToString(s[:])
}

// SHA256Hex is the lowercase hex SHA-256 of content.
func SHA256Hex(content []byte) string {
	s := sha256.Sum256(content)
	return hex.EncodeToString(s[:])
}
