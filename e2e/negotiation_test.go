package e2e

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/parleyhq/parley/e2e/parleytest"
)

// The negotiation tests run two separate `parley serve` processes, Alice's
// server (tour booking) and Bob's (weather), talking Agora over real HTTP.

const (
	aliceAgent = "clients/tours/agents/alice"
	bobAgent   = "clients/weather/agents/bob"

	forecastInput  = `{"type":"object","required":["date","location"],"properties":{"date":{"type":"string","description":"Day of the forecast, YYYY-MM-DD."},"location":{"type":"string","description":"City name."}}}`
	forecastOutput = `{"type":"object","required":["temperature","precipitation","weatherCondition"],"properties":{"temperature":{"type":"number"},"precipitation":{"type":"number"},"weatherCondition":{"enum":["sunny","cloudy","rainy","snowy"]}}}`

	lookupInput  = `{"type":"object","required":["date","location"],"properties":{"date":{"type":"string"},"location":{"type":"string"}}}`
	lookupOutput = `{"type":"object","properties":{"temperature":{"type":"number"},"precipitation":{"type":"number"},"weather_condition":{"enum":["sunny","cloudy","rainy","snowy"]},"error":{"type":"string"}}}`
)

// forecasts is Bob's dataset: (location, date) → forecast in the tool's
// field names.
var forecasts = []struct {
	location, date string
	temperature    float64
	precipitation  float64
	condition      string
}{
	{"Paris", "2024-05-01", 18, 0, "sunny"},
	{"Rome", "2024-05-01", 24, 0, "sunny"},
	{"Oslo", "2024-05-02", 7, 3.5, "rainy"},
	{"Lima", "2024-05-03", 19, 0.5, "cloudy"},
}

// setUpWeather creates Alice on a and Bob on b, Bob with his forecast tool
// (a table keyed by the arguments, with JSON Schemas), and returns Bob's
// Agora base URL.
func setUpWeather(t *testing.T, a, b *parleytest.Server) string {
	t.Helper()
	createAgent(t, a, "tours", "alice", "")
	createAgent(t, b, "weather", "bob", "")
	entries := map[string]any{}
	for _, f := range forecasts {
		key := mustJSON(t, map[string]string{"date": f.date, "location": f.location})
		entries[key] = map[string]any{"temperature": f.temperature, "precipitation": f.precipitation, "weather_condition": f.condition}
	}
	mustAPI(t, "PUT", b.URL("/v1/"+bobAgent+"/tools/forecast_lookup"), mustJSON(t, map[string]any{
		"description":      "Look up the forecast of a city on a date.",
		"table":            map[string]string{"entriesJson": mustJSON(t, entries)},
		"inputSchemaJson":  lookupInput,
		"outputSchemaJson": lookupOutput,
	}))
	return b.URL("/agora/weather/bob")
}

type sendResult struct {
	Status       string `json:"status"`
	ResultJSON   string `json:"resultJson"`
	ProtocolHash string `json:"protocolHash"`
	Path         string `json:"path"`
	Error        string `json:"error"`
	Negotiation  string `json:"negotiation"`
}

func sendForecast(t *testing.T, a *parleytest.Server, target, location, date string) sendResult {
	t.Helper()
	raw := mustAPI(t, "POST", a.URL("/v1/"+aliceAgent+":send"), mustJSON(t, map[string]string{
		"targetUrl":        target,
		"task":             "weather-forecast",
		"taskDescription":  "Get the weather forecast for a date and a city.",
		"taskDataJson":     mustJSON(t, map[string]string{"date": date, "location": location}),
		"inputSchemaJson":  forecastInput,
		"outputSchemaJson": forecastOutput,
	}))
	var r sendResult
	if err := json.Unmarshal([]byte(raw), &r); err != nil {
		t.Fatalf("send reply %s: %v", raw, err)
	}
	return r
}

// costCalls returns the negotiator's LLM call count for agent.
func costCalls(t *testing.T, srv *parleytest.Server, agent string) int {
	t.Helper()
	var c struct {
		Calls string `json:"calls"` // int64 is a JSON string
	}
	if err := json.Unmarshal([]byte(mustAPI(t, "GET", srv.URL("/v1/costSummary?agent="+agent), "")), &c); err != nil {
		t.Fatal(err)
	}
	var n int
	if c.Calls != "" {
		if _, err := fmt.Sscan(c.Calls, &n); err != nil {
			t.Fatalf("costSummary calls = %q, want an integer: %v", c.Calls, err)
		}
	}
	return n
}

// TestNegotiation_twoServersDeterministic: with task and tool schemas,
// Alice's first Send negotiates a PD with Bob over Agora, both registries
// hold it, both dispatchers run routines, and every structured query is
// answered with zero LLM calls, although both servers have an LLM (a
// scripted fake each) that would answer and count any call.
func TestNegotiation_twoServersDeterministic(t *testing.T) {
	fa, fb := startFake(t), startFake(t)
	alice := parleytest.Start(t, "", llmShadowFlags(fa, "--send-allow-private")...)
	bob := parleytest.Start(t, "", llmShadowFlags(fb)...)
	target := setUpWeather(t, alice, bob)

	first := sendForecast(t, alice, target, "Paris", "2024-05-01")
	if first.Status != "success" || first.Negotiation == "" || first.ProtocolHash == "" || first.Path != "routine" {
		t.Fatalf("first send = %+v, want success after a negotiation, answered by routines", first)
	}
	hash := first.ProtocolHash

	// Both sides hold the same negotiated PD, byte for byte.
	pdA := mustAPI(t, "GET", alice.URL("/protocols/"+hash), "")
	pdB := mustAPI(t, "GET", bob.URL("/protocols/"+hash), "")
	if pdA != pdB || sha1Hex([]byte(pdA)) != hash {
		t.Fatalf("Alice's and Bob's PDs differ or do not hash to %s:\n%s\n---\n%s", hash, pdA, pdB)
	}
	// Alice's negotiation ended accepted; Bob advertises the PD.
	neg := decode(t, mustAPI(t, "GET", alice.URL("/v1/"+first.Negotiation), ""))
	if neg["state"] != "NEGOTIATION_STATE_ACCEPTED" || neg["mode"] != "NEGOTIATION_MODE_DETERMINISTIC" || neg["protocolSha1Hex"] != hash {
		t.Fatalf("Alice's negotiation = %v", neg)
	}
	if wk := mustAPI(t, "GET", bob.URL("/agora/weather/bob/.wellknown"), ""); !strings.Contains(wk, hash) {
		t.Fatalf("Bob's .wellknown %s does not list %s", wk, hash)
	}
	// Each side holds its routine for the PD.
	mustAPI(t, "GET", alice.URL("/v1/"+aliceAgent+"/routines/"+hash), "")
	mustAPI(t, "GET", bob.URL("/v1/"+bobAgent+"/routines/"+hash), "")

	const n = 20
	for i := range n {
		f := forecasts[i%len(forecasts)]
		r := sendForecast(t, alice, target, f.location, f.date)
		if r.Status != "success" || r.Path != "routine" || r.ProtocolHash != hash || r.Negotiation != "" {
			t.Fatalf("send %d = %+v, want success by routine under %s with no new negotiation", i, r, hash)
		}
		var out map[string]any
		if err := json.Unmarshal([]byte(r.ResultJSON), &out); err != nil {
			t.Fatal(err)
		}
		if out["temperature"] != f.temperature || out["weatherCondition"] != f.condition {
			t.Fatalf("send %d result %v, want %+v", i, out, f)
		}
	}
	fa.assertNoCalls(t, alice)
	fb.assertNoCalls(t, bob)
	assertLLMCounted(t, alice, fa, alice.URL("/agora/tours/alice"))
	assertLLMCounted(t, bob, fb, target)

	// An unknown city gets an error reply. It is checked after the zeros
	// above: Bob's routine answers it, but Alice's derived parse fails on
	// a reply without the output schema's fields (a routine failure), so
	// with an LLM configured it falls back to one "parse" LLM call.
	if r := sendForecast(t, alice, target, "Atlantis", "2024-05-01"); r.Status != "success" || !strings.Contains(r.ResultJSON, `"error"`) {
		t.Errorf("unknown city = %+v, want the PD's error reply", r)
	}
	if got := metric(t, bob, `parley_dispatcher_envelopes_total{path="routine"}`); got < n+1 {
		t.Errorf("Bob's routine envelopes = %v, want at least %d", got, n+1)
	}
	if got := metric(t, bob, `parley_dispatcher_envelopes_total{path="negotiation"}`); got != 1 {
		t.Errorf("Bob's negotiation envelopes = %v, want 1", got)
	}
	if got := metric(t, alice, `parley_dispatcher_negotiations_total{outcome="accepted"}`); got != 1 {
		t.Errorf("Alice's accepted negotiations = %v, want 1", got)
	}
}

// startFakeLLM runs the scripted LLM fixture (fakellm) as a process and
// returns its OpenAI-compatible base URL.
func startFakeLLM(t *testing.T) string {
	t.Helper()
	return startFake(t).base
}

// fakeLLM is one fakellm process.
type fakeLLM struct {
	root, base string // http://host:port and its /v1
}

func startFake(t *testing.T) fakeLLM {
	t.Helper()
	bin := parleytest.Build(t, "github.com/parleyhq/parley/services/negotiator/negotiatortest/llmtest/fakellm")
	f := parleytest.StartProcess(t, bin)
	return fakeLLM{root: "http://" + f.HTTPAddr, base: "http://" + f.HTTPAddr + "/v1"}
}

// fakeStats is the fixture's count of successful calls and their tokens.
type fakeStats struct {
	Calls            int   `json:"calls"`
	PromptTokens     int64 `json:"promptTokens"`
	CompletionTokens int64 `json:"completionTokens"`
}

func (f fakeLLM) stats(t *testing.T) fakeStats {
	t.Helper()
	var st fakeStats
	if err := json.Unmarshal([]byte(mustAPI(t, "GET", f.root+"/fake/stats", "")), &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// llmFlags points a `parley serve` at a fake LLM; every LLM-written
// routine is promoted at once (--routine-shadow-calls 0).
func llmFlags(f fakeLLM, extra ...string) []string {
	return append(llmShadowFlags(f), append([]string{"--routine-shadow-calls", "0"}, extra...)...)
}

// llmShadowFlags points a `parley serve` at a fake LLM, LLM-written
// routines shadowing the LLM for the default number of calls.
func llmShadowFlags(f fakeLLM, extra ...string) []string {
	return append([]string{"--llm-provider", "openai", "--llm-base-url", f.base, "--llm-model", "gpt-4o",
		"--llm-api-key", "test-key", "--llm-max-retries", "0"}, extra...)
}

// assertNoCalls fails the test if srv, configured with the fake f, made
// any LLM call so far: f answered none, srv's ledger records none, and
// neither the dispatcher's nor the negotiator's LLM call metric counts one.
// Those metrics have no sample before the first call (their children are
// made per label), so only assertLLMCounted requires them to exist.
func (f fakeLLM) assertNoCalls(t *testing.T, srv *parleytest.Server) {
	t.Helper()
	if st := f.stats(t); st.Calls != 0 {
		t.Errorf("the scripted LLM answered %d calls from %s, want 0", st.Calls, srv.HTTPAddr)
	}
	if got := ledgerTotals(t, srv); got.Calls != 0 {
		t.Errorf("the ledger of %s records %d LLM calls, want 0", srv.HTTPAddr, got.Calls)
	}
	// The metrics count failed calls too, which the fake's and the
	// ledger's counts leave out.
	for _, m := range []string{"parley_dispatcher_llm_calls_total", "parley_negotiator_llm_calls_total"} {
		if got, _ := scrape(t, srv, m); got != 0 {
			t.Errorf("%s of %s = %v, want 0", m, srv.HTTPAddr, got)
		}
	}
}

// assertLLMCounted proves that an earlier assertNoCalls could fail: one
// natural-language envelope to agora (an Agora agent URL on srv) is
// answered by the LLM, and the call shows up at the fake f, in srv's
// ledger and in both LLM call metrics.
func assertLLMCounted(t *testing.T, srv *parleytest.Server, f fakeLLM, agora string) {
	t.Helper()
	code, raw := api(t, "POST", agora, `{"body":"What will the weather be in Paris on 1 May 2024?"}`)
	if m := decode(t, raw); code != 200 || m["status"] != "success" {
		t.Fatalf("natural-language envelope to %s = %d %s, want an LLM's answer", agora, code, raw)
	}
	if st := f.stats(t); st.Calls == 0 {
		t.Errorf("the scripted LLM answered no call after a natural-language envelope to %s", agora)
	}
	if got := ledgerTotals(t, srv); got.Calls == 0 {
		t.Errorf("the ledger of %s records no call after a natural-language envelope", srv.HTTPAddr)
	}
	for _, m := range []string{"parley_dispatcher_llm_calls_total", "parley_negotiator_llm_calls_total"} {
		if got := metric(t, srv, m); got == 0 {
			t.Errorf("%s of %s = 0 after a natural-language envelope", m, srv.HTTPAddr)
		}
	}
}

// ledgerTotals reads a negotiator's cost summary (every agent).
func ledgerTotals(t *testing.T, srv *parleytest.Server) fakeStats {
	t.Helper()
	var c struct {
		Calls, PromptTokens, CompletionTokens string // int64 are JSON strings
	}
	if err := json.Unmarshal([]byte(mustAPI(t, "GET", srv.URL("/v1/costSummary"), "")), &c); err != nil {
		t.Fatal(err)
	}
	var st fakeStats
	for _, f := range []struct {
		s string
		p any
	}{{c.Calls, &st.Calls}, {c.PromptTokens, &st.PromptTokens}, {c.CompletionTokens, &st.CompletionTokens}} {
		if f.s == "" {
			continue
		}
		if _, err := fmt.Sscan(f.s, f.p); err != nil {
			t.Fatalf("costSummary %+v: %v", c, err)
		}
	}
	return st
}

// sendNLTask sends the weather task with no schemas: Alice's LLM writes
// the query until a protocol is negotiated.
func sendNLTask(t *testing.T, a *parleytest.Server, target, location, date string) sendResult {
	t.Helper()
	raw := mustAPI(t, "POST", a.URL("/v1/"+aliceAgent+":send"), mustJSON(t, map[string]string{
		"targetUrl":       target,
		"task":            "weather-forecast",
		"taskDescription": "Get the weather forecast for a date and a city.",
		"taskDataJson":    mustJSON(t, map[string]string{"date": date, "location": location}),
	}))
	var r sendResult
	if err := json.Unmarshal([]byte(raw), &r); err != nil {
		t.Fatalf("send reply %s: %v", raw, err)
	}
	return r
}

// roleCalls counts ledger entries of srv by role.
func roleCalls(t *testing.T, srv *parleytest.Server) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, e := range ledgerEntries(t, srv, "") {
		role, _ := e["role"].(string)
		out[role]++
	}
	return out
}

// TestNegotiation_llmTwoServers: a task with no schemas goes out in natural
// language until the negotiate threshold; then Alice's and Bob's LLMs (one
// scripted fake each) negotiate over Agora in the paper's three turns,
// agree on the canonical weather PD, each writes its routine (tested on its
// own dispatcher), and later Sends are answered by routines with no LLM.
func TestNegotiation_llmTwoServers(t *testing.T) {
	fa, fb := startFake(t), startFake(t)
	const negotiateAfter = 3
	alice := parleytest.Start(t, "", llmFlags(fa, "--send-allow-private", "--negotiation-thresholds", fmt.Sprintf("*@*=1/%d/10", negotiateAfter))...)
	bob := parleytest.Start(t, "", llmFlags(fb)...)
	target := setUpWeather(t, alice, bob)

	// Natural language below the threshold.
	for i := 1; i < negotiateAfter; i++ {
		r := sendNLTask(t, alice, target, "Paris", "2024-05-01")
		if r.Status != "success" || r.Path != "llm" || r.Negotiation != "" || !strings.Contains(r.ResultJSON, "sunny") {
			t.Fatalf("NL send %d = %+v, want an LLM exchange quoting Bob's tool", i, r)
		}
	}
	nlA, nlB := ledgerTotals(t, alice), ledgerTotals(t, bob)
	if nlA.Calls == 0 || nlB.Calls == 0 {
		t.Fatalf("ledgers after the NL phase: alice %+v bob %+v, want LLM calls on both", nlA, nlB)
	}

	// The threshold: negotiation through the LLMs, then routines.
	first := sendNLTask(t, alice, target, "Paris", "2024-05-01")
	if first.Status != "success" || first.Negotiation == "" || first.ProtocolHash != weatherHex || first.Path != "routine" {
		t.Fatalf("send at the threshold = %+v, want the weather PD %s negotiated and answered by routines", first, weatherHex)
	}
	if !strings.Contains(first.ResultJSON, `"weatherCondition":"sunny"`) {
		t.Errorf("result %s, want Paris's forecast", first.ResultJSON)
	}
	for name, srv := range map[string]*parleytest.Server{"alice": alice, "bob": bob} {
		if got := mustAPI(t, "GET", srv.URL("/protocols/"+weatherHex), ""); got != weatherPD {
			t.Errorf("%s's registry holds %q, want the canonical weather PD", name, got)
		}
	}
	mustAPI(t, "GET", alice.URL("/v1/"+aliceAgent+"/routines/"+weatherHex), "")
	mustAPI(t, "GET", bob.URL("/v1/"+bobAgent+"/routines/"+weatherHex), "")
	if wk := mustAPI(t, "GET", bob.URL("/agora/weather/bob/.wellknown"), ""); !strings.Contains(wk, weatherHex) {
		t.Errorf("Bob's .wellknown %s does not list the agreed PD", wk)
	}

	// Alice's transcript: her proposal, Bob's counter, her acceptance.
	neg := decode(t, mustAPI(t, "GET", alice.URL("/v1/"+first.Negotiation), ""))
	transcript, _ := neg["transcript"].([]any)
	if neg["state"] != "NEGOTIATION_STATE_ACCEPTED" || neg["mode"] != "NEGOTIATION_MODE_LLM" || neg["protocolSha1Hex"] != weatherHex || len(transcript) != 3 {
		t.Fatalf("Alice's negotiation = %v, want ACCEPTED by the LLMs in 3 messages", neg)
	}
	for i, want := range []string{"propose", "counter", "accept"} {
		m, _ := transcript[i].(map[string]any)
		raw, _ := base64.StdEncoding.DecodeString(fmt.Sprint(m["bodyJson"]))
		if !strings.Contains(string(raw), `"type":"`+want+`"`) || (m["sent"] == true) != (i != 1) {
			t.Errorf("transcript[%d] = %v (%s), want %s", i, m, raw, want)
		}
	}

	// Each ledger counts the negotiation's turns and the routine written
	// on its side, with the tokens its fake reported.
	wantRoles := map[*parleytest.Server]map[string]int{alice: {"negotiation": 2, "programming": 1}, bob: {"negotiation": 1, "programming": 1}}
	for name, pair := range map[string]struct {
		srv  *parleytest.Server
		fake fakeLLM
	}{"alice": {alice, fa}, "bob": {bob, fb}} {
		roles := roleCalls(t, pair.srv)
		for role, n := range wantRoles[pair.srv] {
			if roles[role] != n {
				t.Errorf("%s's ledger: %d %s calls, want %d (%v)", name, roles[role], role, n, roles)
			}
		}
		if got, want := ledgerTotals(t, pair.srv), pair.fake.stats(t); got != want {
			t.Errorf("%s's ledger %+v, its fake reported %+v", name, got, want)
		}
	}

	// Later Sends: routines on both sides, no LLM anywhere.
	ledA, ledB := ledgerTotals(t, alice), ledgerTotals(t, bob)
	for i := range 8 {
		f := forecasts[i%len(forecasts)]
		r := sendNLTask(t, alice, target, f.location, f.date)
		if r.Status != "success" || r.Path != "routine" || r.ProtocolHash != weatherHex || r.Negotiation != "" {
			t.Fatalf("send %d after the negotiation = %+v, want routines under %s", i, r, weatherHex)
		}
		var out map[string]any
		if err := json.Unmarshal([]byte(r.ResultJSON), &out); err != nil || out["temperature"] != f.temperature || out["weatherCondition"] != f.condition {
			t.Fatalf("send %d result %s, want %+v", i, r.ResultJSON, f)
		}
	}
	if got := ledgerTotals(t, alice); got != ledA {
		t.Errorf("Alice's ledger went from %+v to %+v with routines", ledA, got)
	}
	if got := ledgerTotals(t, bob); got != ledB {
		t.Errorf("Bob's ledger went from %+v to %+v with routines", ledB, got)
	}
	if got := metric(t, alice, `parley_dispatcher_negotiations_total{outcome="accepted"}`); got != 1 {
		t.Errorf("Alice's accepted negotiations = %v, want 1", got)
	}
}

// candidatePath is the negotiator's REST path of the routine candidate for
// (agent, PD, side): its id is the first 16 bytes of SHA-256(agent NUL
// sha1-hex NUL side) in hex.
func candidatePath(agent, hexHash, side string) string {
	h := sha256.Sum256([]byte(agent + "\x00" + hexHash + "\x00" + side))
	return "/v1/routineCandidates/" + hex.EncodeToString(h[:16])
}

// TestNegotiation_llmTwoServersShadow: at the default --routine-shadow-calls
// (5), the routines the programming LLMs write after the negotiation first
// shadow the LLM: each Send under the agreed PD is still composed and
// answered by the LLMs while each dispatcher runs its candidate on the same
// input and reports the comparison. After 5 agreeing calls both candidates
// are promoted and installed, and later Sends use routines with no LLM.
func TestNegotiation_llmTwoServersShadow(t *testing.T) {
	fa, fb := startFake(t), startFake(t)
	const negotiateAfter, shadowCalls = 2, 5
	alice := parleytest.Start(t, "", llmShadowFlags(fa, "--send-allow-private", "--negotiation-thresholds", fmt.Sprintf("*@*=1/%d/10", negotiateAfter))...)
	bob := parleytest.Start(t, "", llmShadowFlags(fb)...)
	target := setUpWeather(t, alice, bob)
	candidates := map[string]string{
		"alice": alice.URL(candidatePath(aliceAgent, weatherHex, "ROUTINE_SIDE_SENDER")),
		"bob":   bob.URL(candidatePath(bobAgent, weatherHex, "ROUTINE_SIDE_RECEIVER")),
	}
	// waitCandidates polls both candidates until they have agreements
	// agreements and state.
	waitCandidates := func(agreements int, state string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for name, u := range candidates {
			for {
				c := decode(t, mustAPI(t, "GET", u, ""))
				if c["state"] == state && c["agreements"] == float64(agreements) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s's routine candidate = %v, want %s with %d agreements", name, c, state, agreements)
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
	}

	for i := 1; i < negotiateAfter; i++ {
		if r := sendNLTask(t, alice, target, "Paris", "2024-05-01"); r.Status != "success" || r.Path != "llm" || r.ProtocolHash != "" {
			t.Fatalf("NL send %d = %+v, want natural language", i, r)
		}
	}
	// The negotiation, then shadowCalls Sends under the agreed PD through
	// the LLMs, each compared with the candidates on both sides.
	for i := range shadowCalls {
		f := forecasts[i%len(forecasts)]
		r := sendNLTask(t, alice, target, f.location, f.date)
		if r.Status != "success" || r.Path != "llm" || r.ProtocolHash != weatherHex || (r.Negotiation != "") != (i == 0) {
			t.Fatalf("send %d under the agreed PD = %+v, want the LLMs speaking %s", i, r, weatherHex)
		}
		var out map[string]any
		if err := json.Unmarshal([]byte(r.ResultJSON), &out); err != nil || out["temperature"] != f.temperature || out["weatherCondition"] != f.condition {
			t.Fatalf("send %d result %s, want %+v", i, r.ResultJSON, f)
		}
		if i < shadowCalls-1 {
			waitCandidates(i+1, "ROUTINE_CANDIDATE_STATE_SHADOW")
			for name, u := range map[string]string{"alice": alice.URL("/v1/" + aliceAgent + "/routines/" + weatherHex), "bob": bob.URL("/v1/" + bobAgent + "/routines/" + weatherHex)} {
				if code, _ := api(t, "GET", u, ""); code != 404 {
					t.Fatalf("%s's routine answers %d during the shadow calls, want 404", name, code)
				}
			}
		}
	}
	waitCandidates(shadowCalls, "ROUTINE_CANDIDATE_STATE_PROMOTED")
	// Each dispatcher installs its routine right after the report that
	// promoted it, and counts the promotion once it is installed.
	deadline := time.Now().Add(30 * time.Second)
	for name, srv := range map[string]*parleytest.Server{"alice": alice, "bob": bob} {
		for {
			if n, _ := scrape(t, srv, `parley_dispatcher_shadow_runs_total{outcome="promoted"}`); n == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s installed no promoted routine", name)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	mustAPI(t, "GET", alice.URL("/v1/"+aliceAgent+"/routines/"+weatherHex), "")
	mustAPI(t, "GET", bob.URL("/v1/"+bobAgent+"/routines/"+weatherHex), "")

	ledA, ledB := ledgerTotals(t, alice), ledgerTotals(t, bob)
	for i := range 8 {
		f := forecasts[i%len(forecasts)]
		r := sendNLTask(t, alice, target, f.location, f.date)
		if r.Status != "success" || r.Path != "routine" || r.ProtocolHash != weatherHex {
			t.Fatalf("send %d after the promotion = %+v, want routines under %s", i, r, weatherHex)
		}
		var out map[string]any
		if err := json.Unmarshal([]byte(r.ResultJSON), &out); err != nil || out["temperature"] != f.temperature || out["weatherCondition"] != f.condition {
			t.Fatalf("send %d result %s, want %+v", i, r.ResultJSON, f)
		}
	}
	if got := ledgerTotals(t, alice); got != ledA {
		t.Errorf("Alice's ledger went from %+v to %+v with routines", ledA, got)
	}
	if got := ledgerTotals(t, bob); got != ledB {
		t.Errorf("Bob's ledger went from %+v to %+v with routines", ledB, got)
	}
	for name, srv := range map[string]*parleytest.Server{"alice": alice, "bob": bob} {
		if got := metric(t, srv, `parley_dispatcher_shadow_runs_total{outcome="agreed"}`); got != shadowCalls-1 {
			t.Errorf("%s's agreeing shadow runs before the promotion = %v, want %d", name, got, shadowCalls-1)
		}
	}
}

// TestNegotiation_llmMaxRounds: when the negotiation would need more
// messages than --negotiation-max-rounds allows, it ends REJECTED and the
// Send is answered in natural language.
func TestNegotiation_llmMaxRounds(t *testing.T) {
	fa, fb := startFake(t), startFake(t)
	alice := parleytest.Start(t, "", llmFlags(fa, "--send-allow-private", "--negotiation-thresholds", "*@*=1/1/10", "--negotiation-max-rounds", "2")...)
	bob := parleytest.Start(t, "", llmFlags(fb)...)
	target := setUpWeather(t, alice, bob)

	r := sendNLTask(t, alice, target, "Paris", "2024-05-01")
	if r.Status != "success" || r.Path != "llm" || r.Negotiation == "" || r.ProtocolHash != "" || !strings.Contains(r.ResultJSON, "sunny") {
		t.Fatalf("send = %+v, want a failed negotiation and a natural-language answer\n%s", r, alice.Log)
	}
	neg := decode(t, mustAPI(t, "GET", alice.URL("/v1/"+r.Negotiation), ""))
	if neg["state"] != "NEGOTIATION_STATE_REJECTED" || !strings.Contains(fmt.Sprint(neg["failureReason"]), "maximum rounds") {
		t.Fatalf("Alice's negotiation = %v, want REJECTED at the maximum rounds", neg)
	}
	if code, _ := api(t, "GET", alice.URL("/protocols/"+weatherHex), ""); code != 404 {
		t.Errorf("Alice's registry answers %d for the weather PD, want 404", code)
	}
	if code, _ := api(t, "GET", bob.URL("/v1/"+bobAgent+"/routines/"+weatherHex), ""); code != 404 {
		t.Errorf("Bob's routine answers %d, want 404 (nothing agreed)", code)
	}
	if got := metric(t, alice, `parley_dispatcher_negotiations_total{outcome="failed"}`); got != 1 {
		t.Errorf("Alice's failed negotiations = %v, want 1", got)
	}
	// The failure is remembered: the next Send does not renegotiate.
	if r := sendNLTask(t, alice, target, "Paris", "2024-05-01"); r.Status != "success" || r.Path != "llm" || r.Negotiation != "" {
		t.Errorf("next send = %+v, want natural language with no new negotiation", r)
	}
	if got := roleCalls(t, alice)["programming"]; got != 0 {
		t.Errorf("Alice's programming calls = %d, want 0", got)
	}
}

// ledgerEntries lists the negotiator's ledger for agent.
func ledgerEntries(t *testing.T, srv *parleytest.Server, agent string) []map[string]any {
	t.Helper()
	var l struct {
		Entries []map[string]any `json:"ledgerEntries"`
	}
	if err := json.Unmarshal([]byte(mustAPI(t, "GET", srv.URL("/v1/ledgerEntries?pageSize=1000&agent="+agent), "")), &l); err != nil {
		t.Fatal(err)
	}
	return l.Entries
}

func sendText(t *testing.T, a *parleytest.Server, target, text string) sendResult {
	t.Helper()
	raw := mustAPI(t, "POST", a.URL("/v1/"+aliceAgent+":send"), mustJSON(t, map[string]string{"targetUrl": target, "text": text}))
	var r sendResult
	if err := json.Unmarshal([]byte(raw), &r); err != nil {
		t.Fatal(err)
	}
	return r
}

// TestNegotiation_llmNaturalLanguageAndBudget: Bob has an LLM (the scripted
// fixture) with a small daily budget. Negotiation and structured queries
// still cost nothing; a natural-language envelope is answered by the LLM,
// which calls Bob's tool through the dispatcher, and the calls land in the
// ledger under Bob and the peer; once the budget is spent, natural-language
// envelopes get a clear failure while routines keep answering.
func TestNegotiation_llmNaturalLanguageAndBudget(t *testing.T) {
	llmURL := startFakeLLM(t)
	// Alice has an LLM too, so that her zero below could fail: her text
	// and structured sends need none.
	fa := startFake(t)
	alice := parleytest.Start(t, "", llmShadowFlags(fa, "--send-allow-private")...)
	bob := parleytest.Start(t, "", "--llm-provider", "openai", "--llm-base-url", llmURL, "--llm-model", "gpt-4o",
		"--llm-api-key", "test-key", "--llm-max-retries", "0", "--llm-budget-agent-usd", "0.02")
	target := setUpWeather(t, alice, bob)

	first := sendForecast(t, alice, target, "Paris", "2024-05-01")
	if first.Status != "success" || first.Path != "routine" || first.Negotiation == "" {
		t.Fatalf("first send = %+v", first)
	}
	if got := costCalls(t, bob, ""); got != 0 {
		t.Fatalf("Bob's LLM calls after a deterministic negotiation = %d, want 0", got)
	}

	// Natural language until the budget refuses.
	answered, refused := 0, ""
	for i := 0; i < 100 && refused == ""; i++ {
		r := sendText(t, alice, target, "What will the weather be in Paris on 1 May 2024?")
		switch {
		case r.Status == "success":
			if !strings.Contains(r.ResultJSON, "sunny") {
				t.Fatalf("NL reply %s does not quote the tool's result", r.ResultJSON)
			}
			answered++
		case r.Status == "failure" && strings.Contains(r.Error, "budget"):
			refused = r.Error
		default:
			t.Fatalf("NL send %d = %+v", i, r)
		}
	}
	if answered == 0 || refused == "" {
		t.Fatalf("answered %d NL envelopes, refusal %q; want some answers, then a budget failure", answered, refused)
	}
	t.Logf("%d NL envelopes answered by the LLM, then: %s", answered, refused)
	entries := ledgerEntries(t, bob, bobAgent)
	if len(entries) < 2*answered {
		t.Fatalf("ledger holds %d entries for %d answers (tool call + reply each)", len(entries), answered)
	}
	for _, e := range entries {
		if e["agent"] != bobAgent || e["peer"] == "" || e["peer"] == nil || e["operation"] != "ReplyNaturalLanguage" {
			t.Fatalf("ledger entry %v: want agent %s, a peer, ReplyNaturalLanguage", e, bobAgent)
		}
	}
	calls := costCalls(t, bob, "")

	// The budget stops LLM calls, not routines.
	for i := range 5 {
		if r := sendText(t, alice, target, "And in Rome?"); r.Status != "failure" || !strings.Contains(r.Error, "budget") {
			t.Fatalf("NL send after exhaustion %d = %+v, want a budget failure", i, r)
		}
		f := forecasts[i%len(forecasts)]
		if r := sendForecast(t, alice, target, f.location, f.date); r.Status != "success" || r.Path != "routine" || !strings.Contains(r.ResultJSON, f.condition) {
			t.Fatalf("structured send after exhaustion %d = %+v", i, r)
		}
	}
	if got := costCalls(t, bob, ""); got != calls {
		t.Errorf("Bob's LLM calls went from %d to %d after the budget was spent", calls, got)
	}
	fa.assertNoCalls(t, alice)
	assertLLMCounted(t, alice, fa, alice.URL("/agora/tours/alice"))
}

// TestNegotiation_referenceExchange: a peer speaking the reference library's
// "negotiation" exchange (protocolHash "negotiation", multiround, base64
// hashes and string bodies) ends it with a FINALPROTOCOL; Bob's side
// registers the PD and advertises it, with no LLM.
func TestNegotiation_referenceExchange(t *testing.T) {
	bob := parleytest.Start(t, "")
	createAgent(t, bob, "weather", "bob", "")
	body := "Let us use this protocol.\n<FINALPROTOCOL>\n" + weatherPD + "\n</FINALPROTOCOL>"
	env := mustJSON(t, map[string]any{"protocolHash": "negotiation", "protocolSources": nil, "body": body, "multiround": true})
	code, raw := api(t, "POST", bob.URL("/agora/weather/bob"), env)
	rep := decode(t, raw)
	if code != 200 || rep["status"] != "success" || rep["conversationId"] == nil {
		t.Fatalf("reference negotiation = %d %s", code, raw)
	}
	if got := mustAPI(t, "GET", bob.URL("/protocols/"+weatherHex), ""); got != weatherPD {
		t.Fatalf("Bob's registry holds %q, want the final PD", got)
	}
	if wk := mustAPI(t, "GET", bob.URL("/agora/weather/bob/.wellknown"), ""); !strings.Contains(wk, weatherHex) {
		t.Fatalf(".wellknown %s does not list the agreed PD", wk)
	}
	if code, _ := api(t, "DELETE", bob.URL("/agora/weather/bob/conversations/"+rep["conversationId"].(string)), ""); code != 200 {
		t.Fatalf("DELETE = %d", code)
	}
}

// TestDemoWeather_onServer: `parley demo weather --server` replays the story
// on a running `parley serve` whose LLM is a scripted fake: natural-language
// queries cost LLM calls, then one negotiated hash, and no LLM call in the
// negotiation, routines and structured phases.
func TestDemoWeather_onServer(t *testing.T) {
	const nlQueries, queries = 2, 4
	fake := startFake(t)
	srv := parleytest.Start(t, "", llmShadowFlags(fake, "--send-allow-private",
		"--negotiation-thresholds", fmt.Sprintf("*@*=1/%d/10", nlQueries+1))...)
	for run := range 2 { // a second run on the same server starts from fresh agents
		cmd := exec.Command(parleytest.Binary(t), "demo", "weather", "--json",
			"--nl-queries", fmt.Sprint(nlQueries), "--queries", fmt.Sprint(queries),
			"--server", srv.GRPCAddr, "--http", "http://"+srv.HTTPAddr)
		cmd.Env = append(os.Environ(), "PARLEY_TOKEN="+parleytest.OperatorToken(t))
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("run %d: parley demo weather: %v\n%s", run, err, out)
		}
		var s struct {
			Protocol struct {
				AliceSHA1, BobSHA1 string
				SameHash           bool
			}
			Phases []struct {
				Name     string
				Skipped  bool
				Queries  int
				LLMCalls int
				Correct  int
			}
		}
		if err := json.Unmarshal(out, &s); err != nil {
			t.Fatalf("run %d: summary %s: %v", run, out, err)
		}
		if !s.Protocol.SameHash || len(s.Protocol.AliceSHA1) != 40 || s.Protocol.AliceSHA1 != s.Protocol.BobSHA1 {
			t.Fatalf("run %d: protocol %+v", run, s.Protocol)
		}
		seen := map[string]bool{}
		for _, p := range s.Phases {
			seen[p.Name] = true
			switch p.Name {
			case "natural-language":
				if p.Skipped || p.Queries != nlQueries || p.LLMCalls == 0 {
					t.Errorf("run %d: phase %+v, want %d queries answered through LLM calls", run, p, nlQueries)
				}
			case "structured":
				if p.LLMCalls != 0 || p.Queries != queries || p.Correct != queries {
					t.Errorf("run %d: phase %+v, want %d correct queries and 0 LLM calls", run, p, queries)
				}
			default:
				if p.LLMCalls != 0 {
					t.Errorf("run %d: phase %+v, want 0 LLM calls", run, p)
				}
			}
		}
		for _, name := range []string{"natural-language", "negotiation", "routines", "structured"} {
			if !seen[name] {
				t.Errorf("run %d: the summary has no %q phase: %s", run, name, out)
			}
		}
	}
}
