package server

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/resource"
	"github.com/parleyhq/parley/services/dispatcher/internal/agora"
	"github.com/parleyhq/parley/services/dispatcher/internal/inbound"
	"github.com/parleyhq/parley/services/dispatcher/internal/routine"
)

const weatherAgent = "clients/acme/agents/weather"

func startWeather(t *testing.T, dialect registryv1.Dialect, opts Options) *testEnv {
	t.Helper()
	reg := newFakeRegistry()
	reg.addProtocol(weatherPD)
	reg.addAgent(agentRes(weatherAgent, dialect, registryv1.SupportPolicy_SUPPORT_POLICY_EXPLICIT, weatherHex))
	e := startEnv(t, reg, "", opts)
	e.setTable(weatherAgent, "weather", weatherTable)
	e.setRoutine(weatherAgent, weatherHex, weatherRoutine)
	return e
}

func TestWeatherRoutine_answersThousandEnvelopesWithoutLLM(t *testing.T) {
	e := startWeather(t, registryv1.Dialect_DIALECT_UNSPECIFIED, Options{})
	e.llm.reply = func(LLMRequest) (LLMResult, error) { return LLMResult{Output: json.RawMessage(`"llm"`)}, nil }
	body := mustJSON(map[string]any{
		"protocolHash":    weatherHex,
		"protocolSources": []string{"https://example.com/weather.txt"},
		"body":            `{"date": "2026-12-01", "location": "Paris"}`,
	})
	// Three senders: the agent's fair share of the default four routine
	// workers. More would queue for a share and, on a loaded machine, wait
	// past the budget into the busy-to-LLM fallback, which is not what this
	// test is about (TestApp_oneAgentCannotStarveAnother covers shares).
	const n, workers = 1000, 3
	var wg sync.WaitGroup
	errs := make(chan string, n)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += workers {
				code, m, raw := e.do("POST", "/agora/acme/weather", body)
				if code != 200 || m["status"] != "success" {
					errs <- raw
					continue
				}
				var got map[string]any
				if err := json.Unmarshal([]byte(m["body"].(string)), &got); err != nil || got["weatherCondition"] != "rainy" {
					errs <- raw
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	bad := 0
	for raw := range errs {
		if bad == 0 {
			t.Errorf("POST weather envelope = %s, want success with the Paris forecast", raw)
		}
		bad++
	}
	if bad > 0 {
		t.Errorf("%d of %d envelopes failed", bad, n)
	}
	if c := e.llm.calls.Load(); c != 0 {
		t.Errorf("LLM calls = %d, want 0", c)
	}
	// Cached: the hot path must not call the registry per envelope.
	if c := e.reg.getAgentCalls.Load() + e.reg.resolveCalls.Load(); c > 20 {
		t.Errorf("registry calls for %d envelopes = %d, want a handful (cached)", n, c)
	}
}

func TestUnknownAgent_notFoundIsCachedBriefly(t *testing.T) {
	tests := []struct {
		name      string
		negTTL    time.Duration
		wantCalls int64
	}{
		{"negative TTL", 2 * time.Second, 1},
		{"disabled", 0, 50},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := newFakeRegistry()
			e := startEnv(t, reg, "", Options{NegativeCacheTTL: tt.negTTL})
			for range 50 {
				if code, _, raw := e.do("POST", "/agora/acme/ghost", `{"body":"hi"}`); code != 404 {
					t.Fatalf("POST to a missing agent = %d %s, want 404", code, raw)
				}
			}
			if got := reg.getAgentCalls.Load(); got != tt.wantCalls {
				t.Errorf("GetAgent calls for 50 envelopes = %d, want %d", got, tt.wantCalls)
			}
			// Once the agent exists and the negative entry has expired, it
			// is found.
			reg.addAgent(agentRes("clients/acme/agents/ghost", 0, 0))
			e.advance(tt.negTTL + time.Millisecond)
			if code, _, raw := e.do("POST", "/agora/acme/ghost", `{"body":"hi"}`); code == 404 {
				t.Errorf("POST after the agent was created = %d %s, want it found", code, raw)
			}
		})
	}
}

func TestUnknownLocation_isAPDLevelError(t *testing.T) {
	e := startWeather(t, registryv1.Dialect_DIALECT_UNSPECIFIED, Options{})
	_, m, raw := e.do("POST", "/agora/acme/weather/", `{"protocolHash":"`+weatherHex+`","protocolSources":null,"body":{"date":"2026-12-01","location":"Atlantis"}}`)
	b, _ := m["body"].(map[string]any)
	if m["status"] != "success" || b["error"] != "Unsupported location" {
		t.Errorf("POST Atlantis = %s, want success with body.error", raw)
	}
}

func TestUnsupportedProtocol_dialects(t *testing.T) {
	other := sha1Hex([]byte("another protocol"))
	otherB64 := base64.StdEncoding.EncodeToString(mustHex(other))
	tests := []struct {
		name    string
		dialect registryv1.Dialect
		hash    string
		want    string
	}{
		{"default spec2024", registryv1.Dialect_DIALECT_UNSPECIFIED, other, `{"status":"rejected"}`},
		{"agent set to std", registryv1.Dialect_DIALECT_STD, other, `{"status":"failure","error":"Unsupported protocol"}`},
		{"base64 hash gets pylib", registryv1.Dialect_DIALECT_UNSPECIFIED, otherB64,
			`{"status":"error","body":null,"error":"` + otherB64 + ` is not suitable for execution","message":"` + otherB64 + ` is not suitable for execution"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := startWeather(t, tt.dialect, Options{})
			e.reg.addProtocol("another protocol") // known to the registry, not supported by the agent
			code, _, raw := e.do("POST", "/agora/acme/weather", `{"protocolHash":"`+tt.hash+`","protocolSources":[null],"body":"hi"}`)
			if code != 200 || raw != tt.want {
				t.Errorf("POST unsupported = %d %s, want 200 %s", code, raw, tt.want)
			}
		})
	}
}

func TestUnknownHash_noSourceVerifies_isRejected(t *testing.T) {
	e := startWeather(t, registryv1.Dialect_DIALECT_UNSPECIFIED, Options{})
	h := sha1Hex([]byte("nobody has this"))
	_, _, raw := e.do("POST", "/agora/acme/weather", `{"protocolHash":"`+h+`","protocolSources":["data:text/plain;charset=utf-8,wrong"],"body":"x"}`)
	if raw != `{"status":"rejected"}` {
		t.Errorf("POST unknown hash = %s, want {\"status\":\"rejected\"}", raw)
	}
}

func mustHex(h string) []byte {
	b := make([]byte, 20)
	for i := range b {
		var v byte
		for _, c := range h[2*i : 2*i+2] {
			v <<= 4
			switch {
			case c >= '0' && c <= '9':
				v |= byte(c - '0')
			default:
				v |= byte(c-'a') + 10
			}
		}
		b[i] = v
	}
	return b
}

// A PD that arrives only as a data: URI, with non-ASCII text, is resolved
// (the registry verifies it), supported by policy because a routine exists,
// and answered.
func TestDataURIProtocol_nonASCII(t *testing.T) {
	pd := "---\nname: Température\ndescription: Météo en °C, naïve façade — ünïcödé\nmultiround: false\n---\n\nLe client envoie {\"ville\": string}; réponse {\"t\": number}."
	h := sha1Hex([]byte(pd))
	const agent = "clients/acme/agents/meteo"
	forms := map[string]string{
		"base64":  "data:text/plain;charset=utf-8;base64," + base64.StdEncoding.EncodeToString([]byte(pd)),
		"percent": "data:text/plain;charset=utf-8," + strings.ReplaceAll(url.PathEscape(pd), "+", "%2B"),
	}
	for name, src := range forms {
		t.Run(name, func(t *testing.T) {
			reg := newFakeRegistry()
			reg.addAgent(agentRes(agent, 0, registryv1.SupportPolicy_SUPPORT_POLICY_IMPLEMENTED))
			e := startEnv(t, reg, "", Options{})
			e.setRoutine(agent, h, `def reply(q, m):
    return {"t": 21, "ville": q["ville"]}`)
			_, m, raw := e.do("POST", "/agora/acme/meteo", mustJSON(map[string]any{
				"protocolHash": h, "protocolSources": []string{src}, "body": map[string]any{"ville": "Zürich"},
			}))
			b, _ := m["body"].(map[string]any)
			if m["status"] != "success" || b["ville"] != "Zürich" {
				t.Errorf("POST data: URI PD = %s, want success from the routine", raw)
			}
		})
	}
}

func TestRunawayRoutine_isStoppedAndServerStaysHealthy(t *testing.T) {
	e := startWeather(t, registryv1.Dialect_DIALECT_UNSPECIFIED, Options{
		RoutineLimits:   routine.Limits{MaxSteps: 200_000, Timeout: time.Minute}, // the step budget stops it
		QuarantineAfter: 2,
	})
	loopPD := "---\nname: Loop\ndescription: loops\nmultiround: false\n---\nAnything."
	loopHex := e.reg.addProtocol(loopPD)
	e.reg.addAgent(agentRes(weatherAgent, 0, 0, weatherHex, loopHex))
	e.setRoutine(weatherAgent, loopHex, "def reply(q, m):\n    while True:\n        pass\n")

	for i := range 2 {
		_, m, raw := e.do("POST", "/agora/acme/weather", `{"protocolHash":"`+loopHex+`","body":"go"}`)
		if m["status"] != "failure" || !strings.Contains(raw, "budget") {
			t.Errorf("POST loop #%d = %s, want failure naming the budget", i, raw)
		}
	}
	r, err := e.client.GetRoutine(t.Context(), &dispatcherv1.GetRoutineRequest{Name: weatherAgent + "/routines/" + loopHex})
	if err != nil {
		t.Fatalf("GetRoutine = %v", err)
	}
	if r.GetState() != dispatcherv1.Routine_STATE_QUARANTINED || r.GetConsecutiveFailures() != 2 {
		t.Errorf("GetRoutine = state %v failures %d, want QUARANTINED after 2", r.GetState(), r.GetConsecutiveFailures())
	}
	_, m, raw := e.do("POST", "/agora/acme/weather", `{"protocolHash":"`+weatherHex+`","body":{"date":"2026-12-01","location":"Rome"}}`)
	if b, _ := m["body"].(map[string]any); m["status"] != "success" || b["weatherCondition"] != "sunny" {
		t.Errorf("POST weather after runaway = %s, want success", raw)
	}
	// A new version lifts the quarantine.
	e.setRoutine(weatherAgent, loopHex, "def reply(q, m):\n    return 'fixed'\n")
	_, m, raw = e.do("POST", "/agora/acme/weather", `{"protocolHash":"`+loopHex+`","body":"go"}`)
	if m["status"] != "success" || m["body"] != "fixed" {
		t.Errorf("POST loop after fix = %s, want success \"fixed\"", raw)
	}
}

func TestRoutineFailure_fallsBackToLLM(t *testing.T) {
	e := startWeather(t, registryv1.Dialect_DIALECT_UNSPECIFIED, Options{})
	e.setRoutine(weatherAgent, weatherHex, "def reply(q, m):\n    return q['missing']\n")
	e.llm.reply = func(req LLMRequest) (LLMResult, error) {
		if req.Protocol == nil {
			t.Errorf("LLM request without the PD")
		}
		return LLMResult{Output: json.RawMessage(`{"temperature":1,"precipitation":0,"weatherCondition":"snowy"}`), InputTokens: 10, OutputTokens: 5}, nil
	}
	_, m, raw := e.do("POST", "/agora/acme/weather", `{"protocolHash":"`+weatherHex+`","body":{"date":"x","location":"y"}}`)
	if b, _ := m["body"].(map[string]any); m["status"] != "success" || b["weatherCondition"] != "snowy" {
		t.Errorf("POST with broken routine = %s, want the LLM's answer", raw)
	}
	if e.llm.calls.Load() != 1 {
		t.Errorf("LLM calls = %d, want 1", e.llm.calls.Load())
	}
}

func TestNaturalLanguage_withoutHandlerOrLLM_fails(t *testing.T) {
	e := startWeather(t, registryv1.Dialect_DIALECT_UNSPECIFIED, Options{})
	for _, body := range []string{
		`{"body":"What is the weather?"}`,
		`{"protocolHash":null,"protocolSources":null,"body":"What is the weather?","extra":1}`,
		`{"protocolHash":null,"protocolSources":[],"body":"What is the weather?"}`,
	} {
		code, m, raw := e.do("POST", "/agora/acme/weather", body)
		if code != 200 || m["status"] != "failure" || !strings.Contains(m["error"].(string), "no LLM is configured") {
			t.Errorf("POST %s = %d %s, want 200 failure naming the missing LLM", body, code, raw)
		}
	}
}

func TestMalformed(t *testing.T) {
	e := startWeather(t, registryv1.Dialect_DIALECT_UNSPECIFIED, Options{})
	for _, body := range []string{`not json`, `[1]`, `{"protocolHash":"xyz"}`, `{"protocolHash":5}`, `{"multiround":"yes"}`} {
		code, m, raw := e.do("POST", "/agora/acme/weather", body)
		if code != 400 || m["status"] != "failure" {
			t.Errorf("POST %s = %d %s, want 400 failure", body, code, raw)
		}
	}
	if code, _, raw := e.do("POST", "/agora/acme/nobody", `{"body":"x"}`); code != 404 {
		t.Errorf("POST to unknown agent = %d %s, want 404", code, raw)
	}
}

func TestSchemas_validateRequestsAndRoutineOutput(t *testing.T) {
	const agent = "clients/acme/agents/calc"
	reg := newFakeRegistry()
	h := reg.addProtocolSchemas("---\nname: Add\n---\nSend {a, b}; get a+b.",
		`{"type":"object","required":["a","b"],"properties":{"a":{"type":"integer"},"b":{"type":"integer"}}}`,
		`{"type":"integer"}`)
	broken := reg.addProtocolSchemas("---\nname: Broken\n---\n", `{"type":5}`, "")
	reg.addAgent(agentRes(agent, 0, 0, h, broken))
	e := startEnv(t, reg, "", Options{QuarantineAfter: 10})
	e.setRoutine(agent, h, "def reply(q, m):\n    if q['a'] == 0:\n        return 'zero'\n    return q['a'] + q['b']\n")
	e.setRoutine(agent, broken, "def reply(q, m):\n    return q\n")
	tests := []struct {
		name, hash, body, want string
	}{
		{"valid", h, `{"a":2,"b":3}`, `"body":5`},
		{"invalid request", h, `{"a":"two"}`, `"status":"failure"`},
		{"routine output invalid", h, `{"a":0,"b":1}`, `"status":"failure"`},
		{"schema that does not compile", broken, `{"a":1}`, `{"status":"rejected"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, raw := e.do("POST", "/agora/acme/calc", `{"protocolHash":"`+tt.hash+`","body":`+tt.body+`}`)
			if !strings.Contains(raw, tt.want) {
				t.Errorf("POST %s = %s, want it to contain %s", tt.body, raw, tt.want)
			}
		})
	}
	_, _, raw := e.do("POST", "/agora/acme/calc", `{"protocolHash":"`+h+`","body":{"a":"two"}}`)
	if !strings.Contains(raw, "schema") {
		t.Errorf("invalid request reply = %s, want it to name the schema", raw)
	}
	_, _, raw = e.do("POST", "/agora/acme/calc", `{"protocolHash":"`+h+`","body":{"a":0,"b":1}}`)
	if !strings.Contains(raw, "routine") {
		t.Errorf("invalid routine output reply = %s, want it to name the routine", raw)
	}
}

func TestRoutineAPI(t *testing.T) {
	e := startWeather(t, registryv1.Dialect_DIALECT_UNSPECIFIED, Options{})
	_, err := e.client.SetRoutine(t.Context(), &dispatcherv1.SetRoutineRequest{Routine: &dispatcherv1.Routine{Name: weatherAgent + "/routines/" + weatherHex, Source: "def reply(q, m:"}})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("SetRoutine(syntax error) = %v, want InvalidArgument", err)
	}
	_, err = e.client.SetRoutine(t.Context(), &dispatcherv1.SetRoutineRequest{Routine: &dispatcherv1.Routine{Name: weatherAgent + "/routines/nothex", Source: "x = 1"}})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("SetRoutine(bad name) = %v, want InvalidArgument", err)
	}
	e.setRoutine(weatherAgent, weatherHex, weatherRoutine)
	r, err := e.client.GetRoutine(t.Context(), &dispatcherv1.GetRoutineRequest{Name: weatherAgent + "/routines/" + weatherHex})
	if err != nil || r.GetVersion() != 2 || r.GetState() != dispatcherv1.Routine_STATE_ACTIVE {
		t.Errorf("GetRoutine = %v, %v; want version 2, active", r, err)
	}
	e.setRoutine(weatherAgent, "steps", "def step(t, i, a):\n    return i\n")
	var names []string
	tok := ""
	for {
		resp, err := e.client.ListRoutines(t.Context(), &dispatcherv1.ListRoutinesRequest{Parent: weatherAgent, PageSize: 1, PageToken: tok})
		if err != nil {
			t.Fatalf("ListRoutines = %v", err)
		}
		for _, r := range resp.GetRoutines() {
			names = append(names, resource.ID(r.GetName()))
		}
		if tok = resp.GetNextPageToken(); tok == "" {
			break
		}
	}
	if strings.Join(names, ",") != weatherHex+",steps" {
		t.Errorf("ListRoutines pages = %v, want [%s steps]", names, weatherHex)
	}
	if _, err := e.client.GetRoutine(t.Context(), &dispatcherv1.GetRoutineRequest{Name: weatherAgent + "/routines/" + sha1Hex(nil)}); status.Code(err) != codes.NotFound {
		t.Errorf("GetRoutine(missing) = %v, want NotFound", err)
	}
}

// fakeDeliverer fails every Deliver with err.
type fakeDeliverer struct{ err error }

func (f fakeDeliverer) Deliver(context.Context, inbound.Envelope) (inbound.Reply, error) {
	return inbound.Reply{}, f.err
}

// TestAgoraHTTP_deliverErrors: the Agora routes map a DeliverEnvelope error
// by its gRPC code, not all to "dispatcher unavailable".
func TestAgoraHTTP_deliverErrors(t *testing.T) {
	tests := []struct {
		code codes.Code
		http int
		want string
	}{
		{codes.InvalidArgument, 400, "malformed request"},
		{codes.NotFound, 404, "not found"},
		{codes.Unavailable, 503, "the dispatcher is unavailable"},
		{codes.Internal, 500, "internal error"},
		{codes.DeadlineExceeded, 504, "the dispatcher did not answer in time"},
		{codes.ResourceExhausted, 429, "too many requests; retry later"},
	}
	for _, tt := range tests {
		t.Run(tt.code.String(), func(t *testing.T) {
			mux := http.NewServeMux()
			for p, h := range AgoraRoutes(fakeDeliverer{status.Error(tt.code, "secret detail")}, testHTTPOptions) {
				mux.Handle(p, h)
			}
			rec := httptest.NewRecorder()
			mux.ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), "POST", "/agora/acme/weather", strings.NewReader(`{"body":"hi"}`)))
			var m map[string]any
			if err := json.Unmarshal(rec.Body.Bytes(), &m); err != nil || rec.Code != tt.http || m["error"] != tt.want || m["status"] != "failure" {
				t.Errorf("reply = %d %s, want %d failure %q", rec.Code, rec.Body, tt.http, tt.want)
			}
		})
	}
}

// TestDeliver_faultStatus: with the registry down, std answers 500, pylib
// 200 error on POST / (and 500 on a follow-up), spec2024 503.
func TestDeliver_faultStatus(t *testing.T) {
	reg := newFakeRegistry()
	reg.addAgent(agentRes(weatherAgent, registryv1.Dialect_DIALECT_STD, registryv1.SupportPolicy_SUPPORT_POLICY_EXPLICIT, weatherHex))
	reg.resolveErr = status.Error(codes.Unavailable, "registry down")
	e := startEnv(t, reg, "", Options{})
	body := mustJSON(map[string]any{"protocolHash": weatherHex, "body": map[string]any{}})
	if code, m, raw := e.do("POST", "/agora/acme/weather", body); code != 500 || m["status"] != "failure" {
		t.Errorf("std fault = %d %s, want 500 failure", code, raw)
	}
	b64 := mustJSON(map[string]any{"protocolHash": weatherB64, "body": "{}"})
	if code, m, raw := e.do("POST", "/agora/acme/weather", b64); code != 200 || m["status"] != "error" {
		t.Errorf("pylib fault on POST / = %d %s, want 200 error", code, raw)
	}

	reg2 := newFakeRegistry()
	reg2.getAgentErr = status.Error(codes.Unavailable, "registry down")
	e2 := startEnv(t, reg2, "", Options{PeerDialects: map[string]agora.Dialect{"127.0.0.1": agora.Pylib}})
	if code, m, raw := e2.do("POST", "/agora/acme/weather/conversations/abc", `{"body":"hi"}`); code != 500 || m["status"] != "error" {
		t.Errorf("pylib fault in a follow-up = %d %s, want 500 error", code, raw)
	}
	if code, m, raw := e2.do("POST", "/agora/acme/weather", `{"body":"hi"}`); code != 200 || m["status"] != "error" {
		t.Errorf("pylib fault on POST / = %d %s, want 200 error", code, raw)
	}
}

// TestUnsupportedProtocol_isNeverResolved proves the dispatcher rejects a
// protocol its agent does not support without asking the registry to fetch
// it, so outsiders cannot make the registry fetch their URLs through an
// agent.
func TestUnsupportedProtocol_isNeverResolved(t *testing.T) {
	e := startWeather(t, registryv1.Dialect_DIALECT_UNSPECIFIED, Options{})
	before := e.reg.resolveCalls.Load()
	other := strings.Repeat("ab", 20)
	_, m, raw := e.do("POST", "/agora/acme/weather", `{"protocolHash":"`+other+`","protocolSources":["https://attacker.example/pd.txt"],"body":"x"}`)
	if m["status"] != "rejected" {
		t.Errorf("unsupported protocol = %s, want rejected", raw)
	}
	if got := e.reg.resolveCalls.Load() - before; got != 0 {
		t.Errorf("ResolveProtocol calls for an unsupported protocol = %d, want 0", got)
	}
}
