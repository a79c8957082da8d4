package routine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/parleyhq/parley/platform/jsondepth"
)

// TableTool returns a Tool that looks keys up in entriesJSON, a JSON object.
// A string argument is looked up as is; any other value by its compact JSON
// encoding. A missing key gives nil (None in Starlark).
func TableTool(entriesJSON string) (Tool, error) {
	if err := jsondepth.CheckString(entriesJSON, maxFastDepth); err != nil {
		return Tool{}, fmt.Errorf("table entries: %w", err)
	}
	var entries map[string]json.RawMessage
	if err := json.Unmarshal([]byte(entriesJSON), &entries); err != nil {
		return Tool{}, fmt.Errorf("table entries must be a JSON object: %w", err)
	}
	// Keys that are JSON objects are read in canonical form (compact, keys
	// sorted), so {"b":1,"a":2} and {"a":2,"b":1} name one entry.
	for k, v := range entries {
		if strings.HasPrefix(k, "{") {
			if c, err := canonicalJSON([]byte(k)); err == nil && c != k {
				delete(entries, k)
				entries[c] = v
			}
		}
	}
	call := func(_ context.Context, arg json.RawMessage) (json.RawMessage, error) {
		var s string
		if json.Unmarshal(arg, &s) == nil {
			return entries[s], nil
		}
		key, err := canonicalJSON(arg)
		if err != nil {
			return nil, errors.New("the key is not JSON")
		}
		return entries[key], nil
	}
	callString := func(_ context.Context, key string) (json.RawMessage, error) { return entries[key], nil }
	return Tool{call: call, callString: callString, table: &entriesJSON}, nil
}

// canonicalJSON returns raw compacted, with object keys sorted at every
// level (encoding/json sorts map keys).
func canonicalJSON(raw []byte) (string, error) {
	var v any
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	if err := d.Decode(&v); err != nil {
		return "", err
	}
	out, err := json.Marshal(v)
	if err != nil {
		return "", err
	}
	return string(out), nil
}

// Call runs the tool outside a routine (for an LLM's tool call): arg is
// JSON, and a nil result means no value.
func (t Tool) Call(ctx context.Context, arg json.RawMessage) (json.RawMessage, error) {
	if t.call == nil {
		return nil, errors.New("the tool cannot be called")
	}
	return t.call(ctx, arg)
}

// FuncTool is a tool answering every call with f; arg is the argument as
// JSON.
func FuncTool(f func(ctx context.Context, arg json.RawMessage) (json.RawMessage, error)) Tool {
	return Tool{call: f}
}
