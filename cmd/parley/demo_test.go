package main

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/parleyhq/parley/services/negotiator/demo"
	"github.com/parleyhq/parley/services/negotiator/llmtest"
)

func runDemoJSON(t *testing.T, args ...string) demo.Summary {
	t.Helper()
	var out, errOut bytes.Buffer
	e := env{getenv: func(string) string { return "" }, stdout: &out, stderr: &errOut}
	if err := runDemo(e, append([]string{"weather", "--json"}, args...)); err != nil {
		t.Fatalf("parley demo weather: %v\n%s", err, errOut.String())
	}
	var s demo.Summary
	if err := json.Unmarshal(out.Bytes(), &s); err != nil {
		t.Fatalf("summary %s: %v", out.String(), err)
	}
	return s
}

func demoPhase(t *testing.T, s demo.Summary, name string) demo.Phase {
	t.Helper()
	for _, p := range s.Phases {
		if p.Name == name {
			return p
		}
	}
	t.Fatalf("no phase %q in %+v", name, s.Phases)
	return demo.Phase{}
}

// TestDemoWeather_withoutLLM: two in-process suites, no LLM: both sides
// hold the same negotiated hash, and nothing after the skipped
// natural-language phase calls an LLM.
func TestDemoWeather_withoutLLM(t *testing.T) {
	s := runDemoJSON(t, "--queries", "12")
	if !s.Protocol.SameHash || len(s.Protocol.AliceSHA1) != 40 || s.Protocol.AliceSHA1 != s.Protocol.BobSHA1 {
		t.Errorf("protocol = %+v, want Alice and Bob holding the same SHA-1", s.Protocol)
	}
	if nl := demoPhase(t, s, "natural-language"); !nl.Skipped || nl.LLMCalls != 0 {
		t.Errorf("natural-language phase = %+v, want skipped", nl)
	}
	for _, name := range []string{"negotiation", "routines", "structured"} {
		if p := demoPhase(t, s, name); p.LLMCalls != 0 || p.CostUSD != 0 {
			t.Errorf("%s phase = %+v, want no LLM calls", name, p)
		}
	}
	if st := demoPhase(t, s, "structured"); st.Correct != 12 || st.Note != "12 of 12 sent and read by Alice's routine" {
		t.Errorf("structured phase = %+v, want 12 correct answers by routines", st)
	}
	if s.BreakEvenQuery != 1 || s.BreakEvenBasis != "paper" {
		t.Errorf("break-even = query %d (%s), want 1 on the paper's NL cost", s.BreakEvenQuery, s.BreakEvenBasis)
	}
}

// TestDemoWeather_scriptedLLM: with the scripted LLM fixture configured on
// both suites, the natural-language phase is counted and the break-even
// query is reported from the measured cost; structured queries still make
// no LLM call.
func TestDemoWeather_scriptedLLM(t *testing.T) {
	f, err := llmtest.NewFakeServer(llmtest.Conversational)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	s := runDemoJSON(t, "--nl-queries", "2", "--queries", "5",
		"--llm-provider", "openai", "--llm-base-url", f.URL+"/v1", "--llm-model", "gpt-4o", "--llm-api-key", "k", "--llm-max-retries", "0")
	nl := demoPhase(t, s, "natural-language")
	// Per query: Alice composes; Bob asks for his tool, then replies.
	if nl.Skipped || nl.Queries != 2 || nl.LLMCalls != 6 || nl.CostUSD <= 0 {
		t.Errorf("natural-language phase = %+v, want 6 counted LLM calls with a cost", nl)
	}
	prompt, completion := f.Tokens()
	if nl.PromptTokens != prompt || nl.CompletionTokens != completion {
		t.Errorf("NL tokens %d/%d, the fake counted %d/%d", nl.PromptTokens, nl.CompletionTokens, prompt, completion)
	}
	for _, name := range []string{"negotiation", "routines", "structured"} {
		if p := demoPhase(t, s, name); p.LLMCalls != 0 {
			t.Errorf("%s phase = %+v, want no LLM calls", name, p)
		}
	}
	if st := demoPhase(t, s, "structured"); st.Correct != 5 {
		t.Errorf("structured phase = %+v, want 5 correct answers", st)
	}
	if s.BreakEvenBasis != "measured" || s.BreakEvenQuery != 1 || !s.Protocol.SameHash {
		t.Errorf("summary = %+v, want a measured break-even at query 1 and the same hash", s)
	}
	if got := len(f.Calls()); got != 6 {
		t.Errorf("fake saw %d calls, want 6", got)
	}
}
