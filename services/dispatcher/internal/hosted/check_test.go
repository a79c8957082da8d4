package hosted_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/parleyhq/parley/services/dispatcher/internal/hosted"
)

// weatherCheck is a receiver's check as the negotiator writes it: reply on
// example requests, each reply matching the response schema, the tool
// answering a declared result and checking its argument.
func weatherCheck() hosted.Check {
	ex := func(q string) []json.RawMessage {
		b, _ := json.Marshal(q)
		return []json.RawMessage{b, json.RawMessage(`{}`)}
	}
	return hosted.Check{
		Functions: []string{"reply"},
		Tools: []hosted.CheckTool{{Name: "forecast", InputSchema: `{"type":"object","required":["city"]}`,
			Result: `{"temperature":21}`}},
		Calls: []hosted.CheckCall{{
			Fn:           "reply",
			Examples:     [][]json.RawMessage{ex(`{"city":"Oslo"}`), ex(`{"city":""}`)},
			OutputSchema: `{"type":"object","required":["temperature"],"properties":{"temperature":{"type":"number"}}}`,
		}},
	}
}

func TestCheck(t *testing.T) {
	s := newSet(t, 3)
	tests := []struct {
		name, src string
		check     hosted.Check
		wantErr   string // "" passes
	}{
		{name: "a routine that answers by its schema",
			src: "def reply(q, m):\n    r = call_tool('forecast', {'city': json.decode(q)['city']})\n    return json.encode({'temperature': r['temperature']})\n"},
		{name: "a result that is the JSON value itself",
			src: "def reply(q, m):\n    return {'temperature': 1}\n"},
		{name: "does not compile", src: "def reply(q, m:\n", wantErr: "does not run"},
		{name: "lacks the function", src: "def answer(q, m):\n    return q\n", wantErr: "defines no reply"},
		{name: "fails on an example", src: "def reply(q, m):\n    return 1 // 0\n", wantErr: "reply"},
		{name: "answers off the schema", src: "def reply(q, m):\n    return json.encode({'temp': 1})\n", wantErr: "answered"},
		{name: "calls the tool with a bad argument", src: "def reply(q, m):\n    return call_tool('forecast', {})\n", wantErr: "argument of forecast"},
		{name: "an optional function it lacks is skipped",
			src: "def send(task):\n    return json.encode(task)\n",
			check: hosted.Check{Functions: []string{"send"}, Calls: []hosted.CheckCall{
				{Fn: "send", Examples: [][]json.RawMessage{{json.RawMessage(`{"a":1}`)}}, OutputSchema: `{"required":["a"]}`},
				{Fn: "parse", Examples: [][]json.RawMessage{{json.RawMessage(`"{}"`)}}, OutputSchema: `{"required":["b"]}`, Optional: true},
			}}},
		{name: "an optional function it defines is run",
			src: "def send(task):\n    return json.encode(task)\ndef parse(reply):\n    return {}\n",
			check: hosted.Check{Functions: []string{"send"}, Calls: []hosted.CheckCall{
				{Fn: "parse", Examples: [][]json.RawMessage{{json.RawMessage(`"{}"`)}}, OutputSchema: `{"required":["b"]}`, Optional: true},
			}}, wantErr: "parse"},
		{name: "an empty check runs nothing", src: "def reply(q, m):\n    return 1 // 0\n", check: hosted.Check{Tools: []hosted.CheckTool{{Name: "x"}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			check := tt.check
			if check.Functions == nil && check.Tools == nil {
				check = weatherCheck()
			}
			err := s.Check(t.Context(), tt.src, check)
			if tt.wantErr == "" {
				if err != nil {
					t.Errorf("Check = %v, want it to pass", err)
				}
				return
			}
			if !errors.Is(err, hosted.ErrCheckFailed) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Check = %v, want ErrCheckFailed saying %q", err, tt.wantErr)
			}
		})
	}
}
