package sandbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/parleyhq/parley/services/negotiator/internal/sandbox"
)

const echoTool = `
def reply(query, memory):
    q = json.decode(query)
    r = call_tool("lookup", {"key": q["key"]})
    return json.encode({"value": r["value"], "seen": memory.get("seen", 0)})
`

func TestCall(t *testing.T) {
	tool := func(_ context.Context, name string, args []byte) ([]byte, error) {
		var a map[string]string
		if err := json.Unmarshal(args, &a); err != nil {
			return nil, err
		}
		return json.Marshal(map[string]string{"value": name + ":" + a["key"]})
	}
	tests := []struct {
		name    string
		src     string
		fn      string
		args    []string
		want    string
		wantErr error
	}{
		{name: "tool call", src: echoTool, fn: "reply", args: []string{`"{\"key\":\"k\"}"`, `{"seen":2}`}, want: `"{\"seen\":2,\"value\":\"lookup:k\"}"`},
		{name: "missing function", src: echoTool, fn: "send", wantErr: sandbox.ErrRoutine},
		{name: "fail", src: "def f():\n    fail(\"nope\")\n", fn: "f", wantErr: sandbox.ErrRoutine},
		{name: "syntax error", src: "def f(:\n", fn: "f", wantErr: sandbox.ErrRoutine},
		{name: "step budget", src: "def f():\n    n = 0\n    for i in range(100000000):\n        n += i\n    return n\n", fn: "f", wantErr: sandbox.ErrBudget},
		{name: "tool call budget", src: "def f():\n    for i in range(100):\n        call_tool(\"lookup\", {\"key\": \"x\"})\n", fn: "f", wantErr: sandbox.ErrBudget},
		{name: "no load", src: "load(\"os.star\", \"x\")\ndef f():\n    return 1\n", fn: "f", wantErr: sandbox.ErrRoutine},
		{name: "no while", src: "def f():\n    while True:\n        pass\n", fn: "f", wantErr: sandbox.ErrRoutine},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var args []json.RawMessage
			for _, a := range tt.args {
				args = append(args, json.RawMessage(a))
			}
			got, err := sandbox.Call(t.Context(), tt.src, tt.fn, args, tool, sandbox.Limits{MaxSteps: 100000})
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil && err != nil) {
				t.Fatalf("Call(%s) error = %v, want %v", tt.fn, err, tt.wantErr)
			}
			if tt.wantErr == nil && string(got) != tt.want {
				t.Errorf("Call(%s) = %s, want %s", tt.fn, got, tt.want)
			}
		})
	}
}
