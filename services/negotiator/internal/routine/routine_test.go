package routine_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/parleyhq/parley/services/negotiator/internal/negotiation"
	"github.com/parleyhq/parley/services/negotiator/internal/protocol"
	"github.com/parleyhq/parley/services/negotiator/internal/routine"
	"github.com/parleyhq/parley/services/negotiator/negotiatortest/routinetest"
)

// receiverCheck checks src as the dispatcher would before installing it
// as a receiver routine for doc and tools.
func receiverCheck(t *testing.T, src string, doc protocol.Document, tools []routine.Tool) error {
	t.Helper()
	c, err := routine.ReceiverCheck(doc, tools)
	if err != nil {
		t.Fatal(err)
	}
	return routinetest.Check(src, c)
}

func senderCheck(t *testing.T, src string, doc protocol.Document, in, out json.RawMessage) error {
	t.Helper()
	c, err := routine.SenderCheck(doc, in, out)
	if err != nil {
		t.Fatal(err)
	}
	return routinetest.Check(src, c)
}

// TestParses: what the negotiator checks without a runtime.
func TestParses(t *testing.T) {
	for _, tt := range []struct {
		src  string
		fns  []string
		pass bool
	}{
		{"def reply(query, memory):\n    return query\n", []string{"reply"}, true},
		{"def send(task):\n    return task\ndef parse(reply):\n    return reply\n", []string{"send"}, true},
		{"def reply(query, memory)\n    return query\n", []string{"reply"}, false},
		{"def answer(query, memory):\n    return query\n", []string{"reply"}, false},
		{"x = 1\nwhile x < 3:\n    x += 1\ndef reply(q, m):\n    return q\n", []string{"reply"}, true},
	} {
		err := routine.Parses(tt.src, tt.fns...)
		if (err == nil) != tt.pass || (err != nil && !errors.Is(err, routine.ErrRoutine)) {
			t.Errorf("Parses(%q) = %v, want pass %v", tt.src, err, tt.pass)
		}
	}
}

// TestCheck_callToolSignature: call_tool takes the name and the arguments,
// both required, as in the dispatcher.
func TestCheck_callToolSignature(t *testing.T) {
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
		err := receiverCheck(t, tt.src, doc, []routine.Tool{tool})
		if (err == nil) != tt.pass {
			t.Errorf("check(%q) = %v, want pass %v", tt.src, err, tt.pass)
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
			if err := receiverCheck(t, src, doc, []routine.Tool{tt.tool}); err != nil {
				t.Errorf("check(derived) = %v\n%s", err, src)
			}
		})
	}
}

func TestCheck_catchesBrokenRoutines(t *testing.T) {
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
				err = senderCheck(t, tt.src, doc, nil, json.RawMessage(`{"type":"object","required":["count"],"properties":{"count":{"type":"integer"}}}`))
			} else {
				err = receiverCheck(t, tt.src, doc, []routine.Tool{tool})
			}
			if !errors.Is(err, routinetest.ErrCheck) {
				t.Errorf("check = %v, want ErrCheck for a broken routine:\n%s", err, tt.src)
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
	if err := senderCheck(t, src, doc, nil, nil); err != nil {
		t.Errorf("check(derived) = %v", err)
	}
	if out, err := routinetest.Run(src, "send", []json.RawMessage{json.RawMessage(`{"itemId":"a1","ignored":true}`)}, nil); err != nil || string(out) != `"{\"itemId\":\"a1\"}"` {
		t.Errorf("send() = %s, %v", out, err)
	}
	if out, err := routinetest.Run(src, "parse", []json.RawMessage{json.RawMessage(`"{\"error\":\"unknown item\"}"`)}, nil); err == nil {
		t.Errorf("parse(error reply) = %s, want a routine failure (so the LLM takes over)", out)
	}
}
