package routine_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/services/negotiator/internal/negotiation"
	"github.com/parleyhq/parley/services/negotiator/internal/protocol"
	"github.com/parleyhq/parley/services/negotiator/internal/routine"
	"github.com/parleyhq/parley/services/negotiator/internal/routine/routinetest"
)

func tester() routine.Tester { return (&routinetest.Dispatcher{}).Client() }

// TestVerify_noTester: without a dispatcher nothing is verified.
func TestVerify_noTester(t *testing.T) {
	if _, err := routine.VerifySender(t.Context(), nil, "def send(task):\n    return task\n", derivedDoc(t), nil, nil); !errors.Is(err, routine.ErrNoTester) {
		t.Errorf("VerifySender without a tester = %v, want ErrNoTester", err)
	}
}

// TestVerify_callToolSignature: call_tool takes the name and the arguments,
// both required, as in the dispatcher.
func TestVerify_callToolSignature(t *testing.T) {
	doc := derivedDoc(t)
	tool := routine.Tool{Name: "stock_lookup", Output: json.RawMessage(`{"type":"object","properties":{"inStock":{"type":"boolean"},"count":{"type":"integer"}}}`)}
	for _, tt := range []struct {
		src  string
		pass bool
	}{
		{"def reply(query, memory):\n    return json.encode(call_tool('stock_lookup', {}))\n", true},
		{"def reply(query, memory):\n    return json.encode(stock_lookup({}))\n", true},
		{"def reply(query, memory):\n    return json.encode(call_tool('stock_lookup'))\n", false},
	} {
		_, err := routine.VerifyReceiver(t.Context(), tester(), tt.src, doc, []routine.Tool{tool})
		if (err == nil) != tt.pass {
			t.Errorf("VerifyReceiver(%q) = %v, want pass %v", tt.src, err, tt.pass)
		}
	}
}

func derivedDoc(t *testing.T) protocol.Document {
	t.Helper()
	pd, err := negotiation.DeriveProtocol(negotiation.Task{
		Name:   "stock",
		Input:  json.RawMessage(`{"type":"object","required":["itemId"],"properties":{"itemId":{"type":"string"},"warehouse":{"type":"string"}}}`),
		Output: json.RawMessage(`{"type":"object","required":["inStock","count"],"properties":{"inStock":{"type":"boolean"},"count":{"type":"integer"}}}`),
	})
	if err != nil {
		t.Fatal(err)
	}
	d, err := protocol.Parse(pd)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestDeriveReceiver(t *testing.T) {
	tests := []struct {
		name       string
		tool       routine.Tool
		wantErr    error
		wantReason string
	}{
		{
			name: "snake case tool lines up",
			tool: routine.Tool{Name: "stock_lookup",
				Input:  json.RawMessage(`{"type":"object","required":["item_id"],"properties":{"item_id":{"type":"string"},"warehouse":{"type":"string"}}}`),
				Output: json.RawMessage(`{"type":"object","properties":{"in_stock":{"type":"boolean"},"count":{"type":"integer"},"extra":{"type":"string"}}}`)},
		},
		{
			name: "tool needs a field the request lacks",
			tool: routine.Tool{Name: "t",
				Input:  json.RawMessage(`{"type":"object","required":["item_id","region"],"properties":{"item_id":{"type":"string"},"region":{"type":"string"}}}`),
				Output: json.RawMessage(`{"type":"object","properties":{"in_stock":{"type":"boolean"},"count":{"type":"integer"}}}`)},
			wantErr: routine.ErrSchemaMismatch, wantReason: `"region"`,
		},
		{
			name: "type clash",
			tool: routine.Tool{Name: "t",
				Input:  json.RawMessage(`{"type":"object","properties":{"itemId":{"type":"integer"}}}`),
				Output: json.RawMessage(`{"type":"object","properties":{"in_stock":{"type":"boolean"},"count":{"type":"integer"}}}`)},
			wantErr: routine.ErrSchemaMismatch, wantReason: "needs integer",
		},
		{
			name:    "tool without schemas",
			tool:    routine.Tool{Name: "t"},
			wantErr: routine.ErrNoSchemas,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			doc := derivedDoc(t)
			src, err := routine.DeriveReceiver(doc, tt.tool)
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil && err != nil) {
				t.Fatalf("DeriveReceiver() = %v, want %v", err, tt.wantErr)
			}
			if tt.wantErr != nil {
				if !strings.Contains(err.Error(), tt.wantReason) {
					t.Errorf("error %q does not mention %q", err, tt.wantReason)
				}
				return
			}
			n, err := routine.VerifyReceiver(t.Context(), tester(), src, doc, []routine.Tool{tt.tool})
			if err != nil || n == 0 {
				t.Errorf("VerifyReceiver(derived) = %d, %v\n%s", n, err, src)
			}
		})
	}
}

func TestVerify_catchesBrokenRoutines(t *testing.T) {
	doc := derivedDoc(t)
	tool := routine.Tool{Name: "stock_lookup",
		Input:  json.RawMessage(`{"type":"object","properties":{"item_id":{"type":"string"}}}`),
		Output: json.RawMessage(`{"type":"object","properties":{"in_stock":{"type":"boolean"},"count":{"type":"integer"}}}`)}
	tests := []struct {
		name, src string
		sender    bool
	}{
		{name: "reply misses a required field", src: "def reply(query, memory):\n    return json.encode({\"inStock\": True})\n"},
		{name: "reply has wrong type", src: "def reply(query, memory):\n    return json.encode({\"inStock\": \"yes\", \"count\": 1})\n"},
		{name: "reply crashes", src: "def reply(query, memory):\n    return 1 // 0\n"},
		{name: "no reply function", src: "def answer(query):\n    return query\n"},
		{name: "send builds a bad body", src: "def send(task):\n    return json.encode({\"item\": 1})\n", sender: true},
		{name: "parse drops fields", src: "def send(task):\n    return json.encode(task)\ndef parse(reply):\n    return {}\n", sender: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var err error
			if tt.sender {
				_, err = routine.VerifySender(t.Context(), tester(), tt.src, doc, nil, json.RawMessage(`{"type":"object","required":["count"],"properties":{"count":{"type":"integer"}}}`))
			} else {
				_, err = routine.VerifyReceiver(t.Context(), tester(), tt.src, doc, []routine.Tool{tool})
			}
			if !errors.Is(err, routine.ErrRoutine) {
				t.Errorf("verification = %v, want ErrRoutine for a broken routine:\n%s", err, tt.src)
			}
		})
	}
}

func TestDeriveSender(t *testing.T) {
	doc := derivedDoc(t)
	src, err := routine.DeriveSender(doc, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	n, err := routine.VerifySender(t.Context(), tester(), src, doc, nil, nil)
	if err != nil || n < 2 {
		t.Errorf("VerifySender(derived) = %d, %v", n, err)
	}
	resp, err := tester().TestRoutine(t.Context(), &dispatcherv1.TestRoutineRequest{Source: src, Cases: []*dispatcherv1.TestRoutineCase{
		{Function: "send", ArgsJson: []string{`{"itemId":"a1","ignored":true}`}},
		{Function: "parse", ArgsJson: []string{`"{\"error\":\"unknown item\"}"`}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if r := resp.GetResults()[0]; r.GetOutputJson() != `"{\"itemId\":\"a1\"}"` {
		t.Errorf("send() = %v", r)
	}
	if r := resp.GetResults()[1]; r.GetError() == "" {
		t.Errorf("parse(error reply) = %v, want a routine failure (so the LLM takes over)", r)
	}
}
