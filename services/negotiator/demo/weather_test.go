package demo_test

import (
	"testing"
	"time"

	"github.com/parleyhq/parley/services/negotiator/config"
	"github.com/parleyhq/parley/services/negotiator/demo"
	"github.com/parleyhq/parley/services/negotiator/internal/llm/llmtest"
)

func phase(t *testing.T, s demo.Summary, name string) demo.Phase {
	t.Helper()
	for _, p := range s.Phases {
		if p.Name == name {
			return p
		}
	}
	t.Fatalf("no phase %q in %+v", name, s.Phases)
	return demo.Phase{}
}

func TestWeather_withoutLLM(t *testing.T) {
	s, err := demo.Weather(t.Context(), demo.Options{StructuredQueries: 35})
	if err != nil {
		t.Fatal(err)
	}
	if !s.Protocol.SameHash || len(s.Protocol.AliceSHA1) != 40 {
		t.Errorf("protocol = %+v, want both sides holding the same SHA-1", s.Protocol)
	}
	if nl := phase(t, s, "natural-language"); !nl.Skipped || nl.LLMCalls != 0 {
		t.Errorf("natural-language phase = %+v, want skipped", nl)
	}
	for _, name := range []string{"negotiation", "routines", "structured"} {
		if p := phase(t, s, name); p.LLMCalls != 0 || p.CostUSD != 0 {
			t.Errorf("%s phase = %+v, want no LLM calls", name, p)
		}
	}
	if st := phase(t, s, "structured"); st.Correct != 35 {
		t.Errorf("structured phase answered %d of 35 queries correctly from the dataset", st.Correct)
	}
	if s.BreakEvenQuery != 1 || s.BreakEvenBasis != "paper" {
		t.Errorf("break-even = query %d (%s), want 1 on the paper's NL cost: negotiation cost nothing", s.BreakEvenQuery, s.BreakEvenBasis)
	}
}

func TestWeather_withScriptedLLM(t *testing.T) {
	f, err := llmtest.NewFakeServer(llmtest.Conversational)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	s, err := demo.Weather(t.Context(), demo.Options{
		LLM: config.LLM{Provider: config.ProviderOpenAI, BaseURL: f.URL + "/v1", Model: "gpt-4o", Structured: "json_schema",
			Timeout: 10 * time.Second, MaxRetries: 1, MaxConcurrent: 4},
		NLQueries: 2, StructuredQueries: 5,
	})
	if err != nil {
		t.Fatal(err)
	}
	nl := phase(t, s, "natural-language")
	// Per query: compose, reply with a tool call, reply, parse.
	if nl.Skipped || nl.LLMCalls != 8 || nl.CostUSD <= 0 {
		t.Errorf("natural-language phase = %+v, want 8 counted LLM calls with a cost", nl)
	}
	prompt, completion := f.Tokens()
	if nl.PromptTokens != prompt || nl.CompletionTokens != completion {
		t.Errorf("NL tokens %d/%d, the fake counted %d/%d", nl.PromptTokens, nl.CompletionTokens, prompt, completion)
	}
	if st := phase(t, s, "structured"); st.LLMCalls != 0 || st.Correct != 5 {
		t.Errorf("structured phase = %+v, want 5 correct answers and no LLM calls", st)
	}
	if s.BreakEvenBasis != "measured" || s.BreakEvenQuery != 1 || !s.Protocol.SameHash {
		t.Errorf("summary = %+v, want a measured break-even at query 1", s)
	}
	if got := len(f.Calls()); got != 8 {
		t.Errorf("fake saw %d calls, want 8", got)
	}
}
