package routine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
)

// TableTool returns a Tool that looks keys up in entriesJSON, a JSON object.
// A string argument is looked up as is; any other value by its compact JSON
// encoding. A missing key gives nil (None in Starlark).
func TableTool(entriesJSON string) (Tool, error) {
	var entries map[string]json.RawMessage
	if err := json.Unmarshal([]byte(entriesJSON), &entries); err != nil {
		return Tool{}, fmt.Errorf("table entries must be a JSON object: %w", err)
	}
	call := func(_ context.Context, arg json.RawMessage) (json.RawMessage, error) {
		key := string(arg)
		var s string
		if json.Unmarshal(arg, &s) == nil {
			key = s
		} else {
			var buf bytes.Buffer
			if err := json.Compact(&buf, arg); err != nil {
				return nil, errors.New("the key is not JSON")
			}
			key = buf.String()
		}
		return entries[key], nil
	}
	callString := func(_ context.Context, key string) (json.RawMessage, error) { return entries[key], nil }
	return Tool{call: call, callString: callString}, nil
}
