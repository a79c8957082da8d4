package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"testing"

	"github.com/parleyhq/parley/cmd/parley/internal/demo"
	"github.com/parleyhq/parley/services/negotiator/negotiatortest/llmtest"
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
// hold the same negotiated hash, the natural-language phase is skipped,
// and routines answer. With no LLM nothing could count a call, so "no LLM
// calls" is asserted where it can fail: TestDemoWeather_scriptedLLM.
func TestDemoWeather_withoutLLM(t *testing.T) {
	s := runDemoJSON(t, "--queries", "12")
	if !s.Protocol.SameHash || len(s.Protocol.AliceSHA1) != 40 || s.Protocol.AliceSHA1 != s.Protocol.BobSHA1 {
		t.Errorf("protocol = %+v, want Alice and Bob holding the same SHA-1", s.Protocol)
	}
	if nl := demoPhase(t, s, "natural-language"); !nl.Skipped {
		t.Errorf("natural-language phase = %+v, want skipped", nl)
	}
	for _, name := range []string{"negotiation", "routines"} {
		demoPhase(t, s, name) // each phase must be in the summary
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

// TestDemoWeather_llmNegotiation: with --negotiation llm and the scripted
// weather story on both suites, the natural-language queries are followed
// by the paper's three-turn LLM negotiation of the canonical weather PD and
// routines written by the programming LLMs; the break-even query is
// computed from the ledgers and equals what the fixture's own call and
// token counts give at gpt-4o's prices (5/15 USD per 1M tokens).
func TestDemoWeather_llmNegotiation(t *testing.T) {
	f, err := llmtest.NewFakeServer(llmtest.WeatherStory)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	const nlQueries, queries = 2, 5
	s := runDemoJSON(t, "--negotiation", "llm", "--nl-queries", fmt.Sprint(nlQueries), "--queries", fmt.Sprint(queries),
		"--llm-provider", "openai", "--llm-base-url", f.URL+"/v1", "--llm-model", "gpt-4o", "--llm-api-key", "k", "--llm-max-retries", "0")

	const weatherSHA1 = "3a732bde0e63d2e838d1a722feebf3d67b52b211"
	if !s.Protocol.SameHash || s.Protocol.AliceSHA1 != weatherSHA1 {
		t.Errorf("protocol = %+v, want both sides on the canonical weather PD", s.Protocol)
	}
	// What the fixture saw, priced as the ledger prices it.
	var nlMicro, onceMicro int64
	kinds := map[string]int{}
	for _, c := range f.Calls() {
		micro := int64(math.Round(float64(c.PromptTokens)*5 + float64(c.CompletionTokens)*15))
		kinds[llmtest.StoryKind(c)]++
		if llmtest.StoryKind(c) == "conversation" {
			nlMicro += micro
		} else {
			onceMicro += micro
		}
	}
	// Per NL query: Alice composes, Bob asks for his tool, then replies.
	// Then three negotiation turns and one routine per side.
	if kinds["conversation"] != 3*nlQueries || kinds["negotiation"] != 3 || kinds["programming"] != 2 {
		t.Fatalf("fixture calls by kind = %v", kinds)
	}
	nl, neg, rt, st := demoPhase(t, s, "natural-language"), demoPhase(t, s, "negotiation"), demoPhase(t, s, "routines"), demoPhase(t, s, "structured")
	if nl.LLMCalls != 3*nlQueries || neg.LLMCalls != 3 || rt.LLMCalls != 2 || st.LLMCalls != 0 {
		t.Errorf("LLM calls per phase: NL %d, negotiation %d, routines %d, structured %d; want %d, 3, 2, 0", nl.LLMCalls, neg.LLMCalls, rt.LLMCalls, st.LLMCalls, 3*nlQueries)
	}
	prompt, completion := f.Tokens()
	if got := nl.PromptTokens + neg.PromptTokens + rt.PromptTokens + st.PromptTokens; got != prompt {
		t.Errorf("prompt tokens over the phases = %d, the fixture counted %d", got, prompt)
	}
	if got := nl.CompletionTokens + neg.CompletionTokens + rt.CompletionTokens + st.CompletionTokens; got != completion {
		t.Errorf("completion tokens over the phases = %d, the fixture counted %d", got, completion)
	}
	if st.Correct != queries || st.Note != fmt.Sprintf("%d of %d sent and read by Alice's routine", queries, queries) {
		t.Errorf("structured phase = %+v, want %d correct answers by routines", st, queries)
	}
	nlPerQuery := float64(nlMicro) / 1e6 / nlQueries
	once := float64(onceMicro) / 1e6
	if s.BreakEvenBasis != "measured" || math.Abs(s.NLCostPerQueryUSD-nlPerQuery) > 1e-9 || math.Abs(neg.CostUSD+rt.CostUSD-once) > 1e-9 {
		t.Errorf("summary NL %.6f USD/query (%s), one-time %.6f; the fixture gives %.6f and %.6f", s.NLCostPerQueryUSD, s.BreakEvenBasis, neg.CostUSD+rt.CostUSD, nlPerQuery, once)
	}
	want := int(math.Ceil(once/nlPerQuery - 1e-9))
	if s.BreakEvenQuery != want || want < 2 {
		t.Errorf("break-even query = %d, want %d (one-time %.6f USD over %.6f USD per NL query)", s.BreakEvenQuery, want, once, nlPerQuery)
	}
	t.Logf("negotiation + routines %.6f USD once, NL %.6f USD per query: break-even at query %d", once, nlPerQuery, s.BreakEvenQuery)
}
