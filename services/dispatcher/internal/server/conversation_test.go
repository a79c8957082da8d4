package server

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/services/dispatcher/internal/agora"
)

const counterPD = "---\nname: Counter\ndescription: counts the messages of a conversation\nmultiround: true\n---\n\nEach message gets the number of messages so far."

const counterRoutine = `
def reply(query, memory):
    memory["n"] = memory.get("n", 0) + 1
    memory["last"] = query
    return {"n": memory["n"]}
`

const counterAgent = "clients/acme/agents/counter"

// startCounter starts a dispatcher whose agent counter runs counterRoutine.
// These tests are about conversations (ids, caps, expiry, memory across
// restarts), not the routine's budgets, which package routine tests. The
// default wall-time budget (1 s, measured from the call's start in its
// worker process) was passed once on a machine at load average ~20, and a
// budgeted run answers "failure", which these tests read as a broken
// conversation. So, unless a test sets its own, the budget here is one a
// starved machine does not reach: a routine that hangs still fails the
// test, after a minute. The other budgets (steps, memory, output) are
// counted, not timed, and stay the defaults.
func startCounter(t *testing.T, dataDir string, opts Options) (*testEnv, string) {
	t.Helper()
	if opts.RoutineLimits.Timeout == 0 {
		opts.RoutineLimits.Timeout = time.Minute
	}
	reg := newFakeRegistry()
	h := reg.addProtocol(counterPD)
	reg.addAgent(agentRes(counterAgent, 0, 0, h))
	e := startEnv(t, reg, dataDir, opts)
	e.setRoutine(counterAgent, h, counterRoutine)
	return e, h
}

func bodyN(t *testing.T, m map[string]any) float64 {
	t.Helper()
	b, ok := m["body"].(map[string]any)
	if !ok {
		return -1
	}
	n, _ := b["n"].(float64)
	return n
}

func TestConversation_lifecycle(t *testing.T) {
	dir := t.TempDir()
	e, h := startCounter(t, dir, Options{ConversationTTL: time.Minute})
	_, m, raw := e.do("POST", "/agora/acme/counter", `{"protocolHash":"`+h+`","body":{"q":1},"multiround":true}`)
	id, _ := m["conversationId"].(string)
	exp, _ := m["conversationExpires"].(float64)
	if m["status"] != "success" || len(id) < 22 || bodyN(t, m) != 1 {
		t.Fatalf("POST first = %s, want success n=1 with a conversationId of ≥128 bits", raw)
	}
	if want := e.now().Add(time.Minute).Unix(); int64(exp) != want {
		t.Errorf("conversationExpires = %v, want %d", exp, want)
	}
	conv := "/agora/acme/counter/conversations/" + id

	// Follow-up without hash (std) and with the same hash (pylib); the TTL slides.
	e.advance(50 * time.Second)
	_, m, raw = e.do("POST", conv, `{"body":{"q":2}}`)
	if bodyN(t, m) != 2 || int64(m["conversationExpires"].(float64)) != e.now().Add(time.Minute).Unix() {
		t.Errorf("POST follow-up = %s, want n=2 and a slid expiry", raw)
	}
	e.advance(50 * time.Second) // past the first expiry, within the slid one
	_, m, raw = e.do("POST", conv, `{"protocolHash":"`+h+`","body":{"q":3}}`)
	if bodyN(t, m) != 3 {
		t.Errorf("POST follow-up repeating the hash = %s, want n=3", raw)
	}

	// Changing the protocol is malformed.
	if code, _, raw := e.do("POST", conv, `{"protocolHash":"`+weatherHex+`","body":{}}`); code != 400 {
		t.Errorf("POST follow-up with another hash = %d %s, want 400", code, raw)
	}
	// Unknown conversations are 404.
	if code, _, raw := e.do("POST", "/agora/acme/counter/conversations/AAAAAAAAAAAAAAAAAAAAAA", `{"body":{}}`); code != 404 {
		t.Errorf("POST unknown conversation = %d %s, want 404", code, raw)
	}

	// Conversations (and routine memory) survive a restart.
	e2, _ := func() (*testEnv, string) {
		e.srv.store.Close()
		return startCounter(t, dir, Options{ConversationTTL: time.Minute, Now: e.now})
	}()
	_, m, raw = e2.do("POST", conv, `{"body":{"q":4}}`)
	if bodyN(t, m) != 4 {
		t.Errorf("POST after restart = %s, want n=4", raw)
	}

	// Expired conversations answer 200 failure "Conversation expired".
	e.advance(2 * time.Minute)
	code, m, raw := e2.do("POST", conv, `{"body":{"q":5}}`)
	if code != 200 || m["status"] != "failure" || m["error"] != "Conversation expired" {
		t.Errorf("POST expired = %d %s, want 200 failure Conversation expired", code, raw)
	}
}

func TestConversation_boundToPeerAndCapped(t *testing.T) {
	e, h := startCounter(t, "", Options{MaxConversationsPerPeer: 2})
	var ids []string
	for i := range 3 {
		_, m, raw := e.do("POST", "/agora/acme/counter", `{"protocolHash":"`+h+`","body":{},"multiround":true}`)
		if i < 2 {
			if m["status"] != "success" {
				t.Fatalf("POST #%d = %s, want success", i, raw)
			}
			ids = append(ids, m["conversationId"].(string))
			continue
		}
		if m["status"] != "failure" || !strings.Contains(raw, "Too many open conversations") {
			t.Errorf("POST #%d over the cap = %s, want failure", i, raw)
		}
	}
	// Ending one frees a slot.
	if code, _, raw := e.do("DELETE", "/agora/acme/counter/conversations/"+ids[0], ""); code != 200 || raw != `{"status":"success"}` {
		t.Errorf("DELETE = %d %s, want 200 success", code, raw)
	}
	if _, m, raw := e.do("POST", "/agora/acme/counter", `{"protocolHash":"`+h+`","body":{},"multiround":true}`); m["status"] != "success" {
		t.Errorf("POST after DELETE = %s, want success", raw)
	}
	// Another agent's URL does not reach this conversation.
	e.reg.addAgent(agentRes("clients/acme/agents/other", 0, 0, h))
	if code, _, raw := e.do("POST", "/agora/acme/other/conversations/"+ids[1], `{"body":{}}`); code != 404 {
		t.Errorf("POST conversation via another agent = %d %s, want 404", code, raw)
	}
}

// TestPylibShapedConversation replays what the reference Python library
// sends: both keys always, a base64 hash, the PD as a data: URI on every
// request, string bodies, then DELETE. Its client accepts a reply when
// status == "success" and reads body (a string) and, on the first reply of
// a multiround exchange, conversationId.
func TestPylibShapedConversation(t *testing.T) {
	tests := []struct {
		name       string
		peers      map[string]agora.Dialect
		wantDelete string
	}{
		{"detected from the base64 hash", nil, `{"status":"success"}`},
		{"peer configured as pylib", map[string]agora.Dialect{"127.0.0.1": agora.Pylib}, `{"status":"success","body":null}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := newFakeRegistry()
			h := sha1Hex([]byte(counterPD))
			reg.addAgent(agentRes(counterAgent, 0, registryv1.SupportPolicy_SUPPORT_POLICY_IMPLEMENTED))
			e := startEnv(t, reg, "", Options{PeerDialects: tt.peers})
			// An LLM that answers, so that a call is counted.
			e.llm.reply = func(LLMRequest) (LLMResult, error) { return LLMResult{Output: json.RawMessage(`"llm"`)}, nil }
			e.setRoutine(counterAgent, h, counterRoutine)
			b64 := base64.StdEncoding.EncodeToString(mustHex(h))
			dataURI := "data:text/plain;charset=utf-8;base64," + base64.StdEncoding.EncodeToString([]byte(counterPD))
			envelope := func(body string) string {
				return mustJSON(map[string]any{"protocolHash": b64, "protocolSources": []string{dataURI}, "body": body, "multiround": true})
			}
			code, m, raw := e.do("POST", "/agora/acme/counter", envelope(`{"q": "first"}`))
			id, _ := m["conversationId"].(string)
			body, isString := m["body"].(string)
			if code != 200 || m["status"] != "success" || id == "" || !isString {
				t.Fatalf("POST first = %d %s, want 200 success with conversationId and a string body", code, raw)
			}
			var got map[string]any
			if err := json.Unmarshal([]byte(body), &got); err != nil || got["n"] != 1.0 {
				t.Errorf("first body = %q, want JSON text with n=1", body)
			}
			for i := 2; i <= 3; i++ {
				code, m, raw = e.do("POST", "/agora/acme/counter/conversations/"+id, envelope(`{"q": "next"}`))
				body, isString = m["body"].(string)
				if code != 200 || m["status"] != "success" || !isString || !strings.Contains(body, fmt.Sprintf(`"n":%d`, i)) {
					t.Errorf("POST follow-up %d = %d %s, want 200 success with a string body, n=%d", i, code, raw, i)
				}
			}
			if code, _, raw = e.do("DELETE", "/agora/acme/counter/conversations/"+id, ""); code != 200 || raw != tt.wantDelete {
				t.Errorf("DELETE = %d %s, want 200 %s", code, raw, tt.wantDelete)
			}
			if e.llm.calls.Load() != 0 {
				t.Errorf("LLM calls = %d, want 0", e.llm.calls.Load())
			}
		})
	}
}

// TestConversation_capCheckedBeforeAnswering: a peer at its conversation cap
// gets the cap's failure without the LLM being paid for an answer it would
// throw away; a first answer that fails gives the slot back.
func TestConversation_capCheckedBeforeAnswering(t *testing.T) {
	e := startWeather(t, 0, Options{MaxConversationsPerPeer: 1})
	var fail atomic.Bool
	fail.Store(true)
	e.llm.reply = func(LLMRequest) (LLMResult, error) {
		if fail.Load() {
			return LLMResult{}, errors.New("model down")
		}
		return LLMResult{Output: json.RawMessage(`"hello"`)}, nil
	}
	post := `{"body":"hi","multiround":true}`
	// A failed first answer releases its slot...
	if code, m, raw := e.do("POST", "/agora/acme/weather", post); code != 200 || m["status"] != "failure" || m["conversationId"] != nil {
		t.Fatalf("answer failing = %d %s, want failure without a conversation", code, raw)
	}
	fail.Store(false)
	for i := range 5 {
		code, m, raw := e.do("POST", "/agora/acme/weather", post)
		switch {
		case i == 0 && (code != 200 || m["status"] != "success" || m["conversationId"] == nil):
			t.Errorf("post %d = %d %s, want success in a new conversation (the failed one's slot is free)", i, code, raw)
		case i > 0 && (m["status"] != "failure" || !strings.Contains(raw, "Too many open conversations")):
			t.Errorf("post %d = %d %s, want the cap's failure", i, code, raw)
		}
	}
	if got := e.llm.calls.Load(); got != 2 {
		t.Errorf("LLM calls = %d, want 2 (the failed answer and the one conversation)", got)
	}
}
