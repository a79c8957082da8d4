// Package llmtest is a test fixture, not a product component: FakeServer is
// a scripted stand-in for an LLM API (OpenAI-compatible chat completions and
// Anthropic Messages) listening on 127.0.0.1:0. Tests and the negotiator
// benchmark drive the real provider clients against it. It never reasons:
// it replays scripted replies in order, or asks a Respond function, and
// counts calls and tokens (estimated from the request and reply text).
package llmtest

import (
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strings"
	"sync"
)

// Message is one chat turn as the fake received it.
type Message struct {
	Role    string
	Content string
}

// Call is one request the fake received.
type Call struct {
	// API is "openai" or "anthropic".
	API      string
	Model    string
	System   string
	Messages []Message
	// Structured is true when the request asked for JSON output.
	Structured bool
	// Schema is the requested JSON Schema, if any.
	Schema json.RawMessage
	// Header holds the request headers (to check authentication).
	Header http.Header
	// PromptTokens and CompletionTokens are what the fake reported.
	PromptTokens, CompletionTokens int64
}

// Reply is what the fake answers to one call.
type Reply struct {
	// Text is the completion. For a structured Anthropic call it must be a
	// JSON object, returned as the forced tool's input.
	Text string
	// Status, when non-zero and not 200, answers with that HTTP status and
	// an error body instead.
	Status int
	// RetryAfter is sent as the Retry-After header with an error status.
	RetryAfter string
}

// FakeServer is the scripted LLM server. Build it with NewFakeServer.
type FakeServer struct {
	// URL is the server's root, http://127.0.0.1:port. For the OpenAI
	// client use URL + "/v1"; for the Anthropic client use URL.
	URL string

	ln      net.Listener
	srv     *http.Server
	respond func(Call) Reply

	mu         sync.Mutex // guards the fields below
	script     []Reply
	calls      []Call
	prompt     int64
	completion int64
}

// NewFakeServer starts a fake on 127.0.0.1:0. Scripted replies (Enqueue)
// are used first, in order; when none is left, respond answers (nil
// respond: HTTP 500). Close it when done.
func NewFakeServer(respond func(Call) Reply) (*FakeServer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	f := &FakeServer{URL: "http://" + ln.Addr().String(), ln: ln, respond: respond}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", f.openAI)
	mux.HandleFunc("POST /v1/messages", f.anthropic)
	mux.HandleFunc("GET /fake/stats", f.stats)
	f.srv = &http.Server{Handler: mux}
	go func() { _ = f.srv.Serve(ln) }()
	return f, nil
}

// Close stops the server.
func (f *FakeServer) Close() error {
	err := f.srv.Close()
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Enqueue appends scripted replies.
func (f *FakeServer) Enqueue(replies ...Reply) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.script = append(f.script, replies...)
}

// Calls returns the calls received so far, including failed ones.
func (f *FakeServer) Calls() []Call {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Call(nil), f.calls...)
}

// Tokens returns the prompt and completion tokens reported on successful
// calls so far.
func (f *FakeServer) Tokens() (prompt, completion int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.prompt, f.completion
}

// CountTokens estimates the tokens of text: one per four bytes, rounded up.
// It is crude but deterministic, which is what a benchmark needs.
func CountTokens(text string) int64 { return int64(len(text)+3) / 4 }

func (f *FakeServer) next(c *Call) Reply {
	f.mu.Lock()
	var r Reply
	scripted := len(f.script) > 0
	if scripted {
		r, f.script = f.script[0], f.script[1:]
	}
	f.mu.Unlock()
	if !scripted {
		if f.respond == nil {
			return Reply{Status: http.StatusInternalServerError, Text: "script exhausted"}
		}
		r = f.respond(*c)
	}
	if r.Status == 0 || r.Status == http.StatusOK {
		var in strings.Builder
		in.WriteString(c.System)
		for _, m := range c.Messages {
			in.WriteString(m.Content)
		}
		in.Write(c.Schema)
		c.PromptTokens = CountTokens(in.String())
		c.CompletionTokens = CountTokens(r.Text)
	}
	f.mu.Lock()
	f.calls = append(f.calls, *c)
	f.prompt += c.PromptTokens
	f.completion += c.CompletionTokens
	f.mu.Unlock()
	return r
}

// Stats is what GET /fake/stats answers: the successful calls and their
// tokens, so that a test running the fake as a process (fakellm) can compare
// them with a ledger.
type Stats struct {
	Calls            int   `json:"calls"`
	PromptTokens     int64 `json:"promptTokens"`
	CompletionTokens int64 `json:"completionTokens"`
}

// Stats counts the successful calls so far and their tokens.
func (f *FakeServer) Stats() Stats {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := Stats{PromptTokens: f.prompt, CompletionTokens: f.completion}
	for _, c := range f.calls {
		if c.PromptTokens > 0 || c.CompletionTokens > 0 {
			st.Calls++
		}
	}
	return st
}

func (f *FakeServer) stats(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, f.Stats(), "")
}

func (f *FakeServer) openAI(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model    string    `json:"model"`
		Messages []Message `json:"messages"`
		Format   *struct {
			Type       string `json:"type"`
			JSONSchema struct {
				Schema json.RawMessage `json:"schema"`
			} `json:"json_schema"`
		} `json:"response_format"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]any{"error": map[string]string{"message": err.Error()}}, "")
		return
	}
	c := Call{API: "openai", Model: req.Model, Header: r.Header.Clone()}
	for _, m := range req.Messages {
		if m.Role == "system" {
			c.System += m.Content
			continue
		}
		c.Messages = append(c.Messages, m)
	}
	if req.Format != nil {
		c.Structured = true
		c.Schema = req.Format.JSONSchema.Schema
	}
	rep := f.next(&c)
	if rep.Status != 0 && rep.Status != http.StatusOK {
		writeJSON(w, rep.Status, map[string]any{"error": map[string]string{"message": "scripted failure"}}, rep.RetryAfter)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"id":     "chatcmpl-fake",
		"object": "chat.completion",
		"model":  req.Model,
		"choices": []any{map[string]any{
			"index":         0,
			"finish_reason": "stop",
			"message":       map[string]string{"role": "assistant", "content": rep.Text},
		}},
		"usage": map[string]int64{"prompt_tokens": c.PromptTokens, "completion_tokens": c.CompletionTokens, "total_tokens": c.PromptTokens + c.CompletionTokens},
	}, "")
}

func (f *FakeServer) anthropic(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model    string    `json:"model"`
		System   string    `json:"system"`
		Messages []Message `json:"messages"`
		Tools    []struct {
			Name        string          `json:"name"`
			InputSchema json.RawMessage `json:"input_schema"`
		} `json:"tools"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]any{"type": "error", "error": map[string]string{"message": err.Error()}}, "")
		return
	}
	c := Call{API: "anthropic", Model: req.Model, System: req.System, Messages: req.Messages, Header: r.Header.Clone()}
	if len(req.Tools) > 0 {
		c.Structured = true
		c.Schema = req.Tools[0].InputSchema
	}
	rep := f.next(&c)
	if rep.Status != 0 && rep.Status != http.StatusOK {
		writeJSON(w, rep.Status, map[string]any{"type": "error", "error": map[string]string{"type": "overloaded_error", "message": "scripted failure"}}, rep.RetryAfter)
		return
	}
	var content []any
	if c.Structured && json.Valid([]byte(rep.Text)) && strings.HasPrefix(strings.TrimSpace(rep.Text), "{") {
		content = append(content, map[string]any{"type": "tool_use", "id": "toolu_fake", "name": req.Tools[0].Name, "input": json.RawMessage(rep.Text)})
	} else {
		content = append(content, map[string]any{"type": "text", "text": rep.Text})
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"id":          "msg_fake",
		"type":        "message",
		"role":        "assistant",
		"model":       req.Model,
		"content":     content,
		"stop_reason": "end_turn",
		"usage":       map[string]int64{"input_tokens": c.PromptTokens, "output_tokens": c.CompletionTokens},
	}, "")
}

func writeJSON(w http.ResponseWriter, code int, v any, retryAfter string) {
	w.Header().Set("Content-Type", "application/json")
	if retryAfter != "" {
		w.Header().Set("Retry-After", retryAfter)
	}
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
