package e2e

import (
	"crypto/sha1"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/parleyhq/parley/e2e/parleytest"
)

// The Agora tests drive the dispatcher and the registry together through a
// real `parley serve`: PDs are fetched and verified by the real registry,
// agents and routines are set through the REST API (or the CLI), and
// envelopes travel over real HTTP.

// weatherPD is the canonical weather PD of specs/agora.md (464 bytes, no
// final newline).
const weatherPD = "---\nname: Weather Forecast Query Protocol\ndescription: Query the weather forecast for a given date and location.\nmultiround: false\n---\n\nThe sender sends a JSON object {\"date\": \"YYYY-MM-DD\", \"location\": string}.\nThe receiver replies with a JSON object {\"temperature\": number (degrees C), \"precipitation\": number (mm), \"weatherCondition\": one of \"sunny\", \"cloudy\", \"rainy\", \"snowy\"}.\nIf the location is unknown the receiver replies {\"error\": \"Unsupported location\"}."

const (
	weatherHex = "3a732bde0e63d2e838d1a722feebf3d67b52b211"
	weatherB64 = "OnMr3g5j0ug40aci/uvz1ntSshE="
)

const weatherRoutine = `
def reply(query, memory):
    w = forecasts(query["location"] + "/" + query["date"])
    if w == None:
        return {"error": "Unsupported location"}
    return w
`

const counterPD = "---\nname: Compteur\ndescription: compte les messages d'une conversation\nmultiround: true\n---\n\nChaque message reçoit le nombre de messages jusqu'ici."

const counterRoutine = `
def reply(query, memory):
    memory["n"] = memory.get("n", 0) + 1
    return {"n": memory["n"]}
`

// api sends a JSON request and returns the status code and raw body.
func api(t *testing.T, method, url, body string) (int, string) {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, url, r)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+parleytest.OperatorToken(t))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(raw)
}

// mustAPI is api that fails the test unless the answer is 200.
func mustAPI(t *testing.T, method, url, body string) string {
	t.Helper()
	code, raw := api(t, method, url, body)
	if code != http.StatusOK {
		t.Fatalf("%s %s = %d %s, want 200", method, url, code, raw)
	}
	return raw
}

// createAgent creates clients/{client}/agents/{id} with extra Agent fields
// (JSON members, may be empty).
func createAgent(t *testing.T, srv *parleytest.Server, client, id, fields string) {
	t.Helper()
	body := `{"displayName":"` + id + `"` + fields + `}`
	mustAPI(t, "POST", srv.URL("/v1/clients/"+client+"/agents?agent_id="+id), body)
}

func setRoutine(t *testing.T, srv *parleytest.Server, agent, hash, src string) {
	t.Helper()
	mustAPI(t, "PUT", srv.URL("/v1/"+agent+"/routines/"+hash), mustJSON(t, map[string]any{"source": src}))
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func decode(t *testing.T, raw string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(raw), &m); err != nil {
		t.Fatalf("reply %q is not a JSON object: %v", raw, err)
	}
	return m
}

func sha1Hex(b []byte) string {
	h := sha1.Sum(b)
	return hex.EncodeToString(h[:])
}

// percentEncode escapes every byte but the RFC 3986 unreserved ones, as
// Python's urllib.parse.quote(s, safe="") does.
func percentEncode(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("-._~", c) >= 0 {
			b.WriteByte(c)
			continue
		}
		fmt.Fprintf(&b, "%%%02X", c)
	}
	return b.String()
}

// scrape returns the sum of the samples of a metric from /metrics, and
// whether there was any. name is the metric's name, optionally with its
// labels exactly as exposed (`name{path="routine"}`); without labels every
// labelled sample of name counts.
func scrape(t *testing.T, srv *parleytest.Server, name string) (sum float64, found bool) {
	t.Helper()
	raw := mustAPI(t, "GET", srv.URL("/metrics"), "")
	for _, l := range strings.Split(raw, "\n") {
		rest, ok := strings.CutPrefix(l, name)
		if !ok || rest == "" || !(rest[0] == ' ' || rest[0] == '{' && !strings.HasSuffix(name, "}")) {
			continue
		}
		var v float64
		if _, err := fmt.Sscan(l[strings.LastIndexByte(l, ' ')+1:], &v); err != nil {
			t.Fatalf("/metrics line %q: %v", l, err)
		}
		sum, found = sum+v, true
	}
	return sum, found
}

// metric is scrape for a metric that must exist: a missing one (a typo, a
// renamed metric, or a labelled counter never incremented) fails the test
// rather than reading as 0.
func metric(t *testing.T, srv *parleytest.Server, name string) float64 {
	t.Helper()
	sum, found := scrape(t, srv, name)
	if !found {
		t.Fatalf("/metrics of %s has no sample of %s", srv.HTTPAddr, name)
	}
	return sum
}

func TestAgora_dataURIProtocolVerifiedAnsweredAndServed(t *testing.T) {
	srv := parleytest.Start(t, "")
	createAgent(t, srv, "acme", "echo", `,"supportPolicy":"SUPPORT_POLICY_IMPLEMENTED"`)
	const routine = "def reply(query, memory):\n    return {\"reçu\": query, \"note\": \"café ☕\"}\n"
	tests := []struct {
		name   string
		pd     string
		source func(pd string) string
		viaCLI bool
	}{
		{"base64 data: URI", "---\nname: Écho\ndescription: renvoie le corps, façon « perroquet »\nmultiround: false\n---\n\nRéponds {\"reçu\": <corps>} — 日本語も可。",
			func(pd string) string {
				return "data:text/plain;charset=utf-8;base64," + base64.StdEncoding.EncodeToString([]byte(pd))
			}, false},
		{"percent data: URI", "---\nname: Écho 2\ndescription: même chose, 100% + espaces\nmultiround: false\n---\n\nRéponds {\"reçu\": <corps>} — ünïcødé ✓",
			func(pd string) string { return "data:text/plain;charset=utf-8," + percentEncode(pd) }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := sha1Hex([]byte(tt.pd))
			// Not known before the envelope brings it.
			if code, raw := api(t, "GET", srv.URL("/protocols/"+h), ""); code != http.StatusNotFound {
				t.Fatalf("GET /protocols/%s before any envelope = %d %s, want 404", h, code, raw)
			}
			if tt.viaCLI {
				file := filepath.Join(t.TempDir(), "echo.star")
				if err := os.WriteFile(file, []byte(routine), 0o600); err != nil {
					t.Fatal(err)
				}
				cmd := exec.Command(parleytest.Binary(t), "routine", "set", "acme:echo", h, file, "--server", srv.GRPCAddr)
				cmd.Env = append(os.Environ(), "PARLEY_TOKEN="+parleytest.OperatorToken(t))
				out, err := cmd.CombinedOutput()
				if err != nil || !strings.Contains(string(out), "v1") {
					t.Fatalf("parley routine set = %q, %v; want version 1", out, err)
				}
			} else {
				setRoutine(t, srv, "clients/acme/agents/echo", h, routine)
			}

			env := mustJSON(t, map[string]any{"protocolHash": h, "protocolSources": []string{tt.source(tt.pd)}, "body": map[string]any{"mot": "déjà vu"}})
			code, raw := api(t, "POST", srv.URL("/agora/acme/echo"), env)
			want := `{"status":"success","body":{"note":"café ☕","reçu":{"mot":"déjà vu"}}}`
			if code != http.StatusOK || raw != want {
				t.Errorf("POST envelope = %d %s, want 200 %s", code, raw, want)
			}

			code, served := api(t, "GET", srv.URL("/protocols/"+h), "")
			if code != http.StatusOK || served != tt.pd {
				t.Errorf("GET /protocols/%s = %d %q, want 200 and the exact PD bytes %q", h, code, served, tt.pd)
			}

			// A data: URI whose bytes do not hash to the claimed hash is not
			// verified: rejected, and nothing is stored under it.
			forged := sha1Hex([]byte(tt.pd + "x"))
			env = mustJSON(t, map[string]any{"protocolHash": forged, "protocolSources": []string{tt.source(tt.pd)}, "body": "x"})
			if code, raw := api(t, "POST", srv.URL("/agora/acme/echo"), env); code != http.StatusOK || raw != `{"status":"rejected"}` {
				t.Errorf("POST with a source that does not match its hash = %d %s, want 200 {\"status\":\"rejected\"}", code, raw)
			}
			if code, _ := api(t, "GET", srv.URL("/protocols/"+forged), ""); code != http.StatusNotFound {
				t.Errorf("GET /protocols/%s (forged) = %d, want 404", forged, code)
			}
		})
	}
}

// startWeather runs parley serve (with extra flags) with acme:weather
// supporting the weather PD, answered by a routine over a table tool.
func startWeather(t *testing.T, dialect string, extra ...string) *parleytest.Server {
	t.Helper()
	srv := parleytest.Start(t, "", extra...)
	fields := ""
	if dialect != "" {
		fields = `,"dialect":"` + dialect + `"`
	}
	createAgent(t, srv, "acme", "weather", fields)
	created := decode(t, mustAPI(t, "POST", srv.URL("/v1/protocols"), mustJSON(t, map[string]any{"content": []byte(weatherPD)})))
	if created["sha1Hex"] != weatherHex {
		t.Fatalf("POST /v1/protocols(weather) = %v, want sha1Hex %s", created, weatherHex)
	}
	mustAPI(t, "POST", srv.URL("/v1/clients/acme/agents/weather:addSupportedProtocol"), `{"protocol":"`+weatherHex+`"}`)
	table := `{"Paris/2026-12-01": {"temperature": 7, "precipitation": 1.5, "weatherCondition": "rainy"}, "Rome/2026-12-01": {"temperature": 14, "precipitation": 0, "weatherCondition": "sunny"}}`
	mustAPI(t, "PUT", srv.URL("/v1/clients/acme/agents/weather/tools/forecasts"), mustJSON(t, map[string]any{"table": map[string]any{"entriesJson": table}}))
	setRoutine(t, srv, "clients/acme/agents/weather", weatherHex, weatherRoutine)
	return srv
}

func TestAgora_weatherAnsweredByRoutineWithZeroLLM(t *testing.T) {
	// The scripted LLM is configured, so an envelope the routine did not
	// answer would reach it and be counted.
	fake := startFake(t)
	srv := startWeather(t, "", llmShadowFlags(fake)...)
	const n, workers = 1000, 8 // the "Done when": 1,000 envelopes
	tests := []struct{ body, want string }{
		{`{"date":"2026-12-01","location":"Paris"}`, `{"status":"success","body":{"precipitation":1.5,"temperature":7,"weatherCondition":"rainy"}}`},
		{`{"date":"2026-12-01","location":"Rome"}`, `{"status":"success","body":{"precipitation":0,"temperature":14,"weatherCondition":"sunny"}}`},
		{`{"date":"2026-12-01","location":"Atlantis"}`, `{"status":"success","body":{"error":"Unsupported location"}}`},
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		bad  int
		last string
	)
	client := &http.Client{Timeout: 30 * time.Second}
	for w := range workers {
		wg.Go(func() {
			for i := w; i < n; i += workers {
				tt := tests[i%len(tests)]
				env := `{"protocolHash":"` + weatherHex + `","protocolSources":["http://unused.invalid/"],"body":` + tt.body + `}`
				resp, err := client.Post(srv.URL("/agora/acme/weather"), "application/json", strings.NewReader(env))
				var raw []byte
				if err == nil {
					raw, _ = io.ReadAll(resp.Body)
					resp.Body.Close()
				}
				if err != nil || resp.StatusCode != http.StatusOK || string(raw) != tt.want {
					mu.Lock()
					bad++
					last = fmt.Sprintf("%s → %s %v, want %s", tt.body, raw, err, tt.want)
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if bad > 0 {
		t.Errorf("%d of %d envelopes got a wrong reply; last: %s", bad, n, last)
	}
	if got := metric(t, srv, `parley_dispatcher_envelopes_total{path="routine"}`); got != n {
		t.Errorf("envelopes answered by the routine = %v, want %d", got, n)
	}
	fake.assertNoCalls(t, srv)
	assertLLMCounted(t, srv, fake, srv.URL("/agora/acme/weather"))
}

func TestAgora_unsupportedProtocolPerDialect(t *testing.T) {
	other := "---\nname: Other\ndescription: not for this agent\nmultiround: false\n---\n\nAnything."
	otherHex := sha1Hex([]byte(other))
	raw, _ := hex.DecodeString(otherHex)
	otherB64 := base64.StdEncoding.EncodeToString(raw)
	source := "data:text/plain;charset=utf-8;base64," + base64.StdEncoding.EncodeToString([]byte(other))
	tests := []struct {
		name, dialect, hash, want string
	}{
		{"default spec2024", "", otherHex, `{"status":"rejected"}`},
		{"agent set to std", "DIALECT_STD", otherHex, `{"status":"failure","error":"Unsupported protocol"}`},
		{"base64 hash gets pylib", "", otherB64,
			`{"status":"error","body":null,"error":"` + otherB64 + ` is not suitable for execution","message":"` + otherB64 + ` is not suitable for execution"}`},
		// Also when the registry cannot find the PD at all.
		{"unresolvable, spec2024", "", sha1Hex([]byte("nowhere")), `{"status":"rejected"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := startWeather(t, tt.dialect)
			env := mustJSON(t, map[string]any{"protocolHash": tt.hash, "protocolSources": []any{source, nil}, "body": "hi", "unknownField": 1})
			code, raw := api(t, "POST", srv.URL("/agora/acme/weather"), env)
			if code != http.StatusOK || raw != tt.want {
				t.Errorf("POST unsupported = %d %s, want 200 %s", code, raw, tt.want)
			}
		})
	}
}

// pylibEnvelope is shaped exactly like the Python library's requests: both
// keys, the base64 hash, the data: URI on every message, a string body.
func pylibEnvelope(t *testing.T, body string) string {
	t.Helper()
	raw, _ := hex.DecodeString(sha1Hex([]byte(counterPD)))
	return mustJSON(t, map[string]any{
		"protocolHash":    base64.StdEncoding.EncodeToString(raw),
		"protocolSources": []string{"data:text/plain;charset=utf-8;base64," + base64.StdEncoding.EncodeToString([]byte(counterPD))},
		"body":            body,
		"multiround":      true,
	})
}

// pylibPost posts a pylib-shaped envelope and checks the reply is what the
// library accepts: 200, status success, a string body holding {"n": wantN},
// and a conversationId. It returns the id.
func pylibPost(t *testing.T, url string, wantN int) string {
	t.Helper()
	code, raw := api(t, "POST", url, pylibEnvelope(t, `{"q": "ça va ?"}`))
	m := decode(t, raw)
	id, _ := m["conversationId"].(string)
	body, isString := m["body"].(string)
	exp, _ := m["conversationExpires"].(float64)
	if code != http.StatusOK || m["status"] != "success" || id == "" || !isString || exp <= float64(time.Now().Unix()) {
		t.Fatalf("POST %s = %d %s, want 200 success with a string body, conversationId and a future conversationExpires", url, code, raw)
	}
	if want := fmt.Sprintf(`{"n":%d}`, wantN); body != want {
		t.Errorf("POST %s body = %q, want %q", url, body, want)
	}
	return id
}

func startCounter(t *testing.T, dataDir string, extra ...string) *parleytest.Server {
	t.Helper()
	srv := parleytest.Start(t, dataDir, extra...)
	createAgent(t, srv, "acme", "counter", `,"supportPolicy":"SUPPORT_POLICY_IMPLEMENTED"`)
	setRoutine(t, srv, "clients/acme/agents/counter", sha1Hex([]byte(counterPD)), counterRoutine)
	return srv
}

func TestAgora_pylibShapedMultiroundConversation(t *testing.T) {
	fake := startFake(t) // configured: a call would be counted
	srv := startCounter(t, "", llmShadowFlags(fake)...)
	id := pylibPost(t, srv.URL("/agora/acme/counter"), 1)
	conv := srv.URL("/agora/acme/counter/conversations/" + id)
	for n := 2; n <= 4; n++ {
		if got := pylibPost(t, conv, n); got != id {
			t.Errorf("follow-up %d conversationId = %q, want %q", n, got, id)
		}
	}
	if code, raw := api(t, "DELETE", conv, ""); code != http.StatusOK || decode(t, raw)["status"] != "success" {
		t.Errorf("DELETE %s = %d %s, want 200 success", conv, code, raw)
	}
	// Ended: a pylib follow-up gets the library's error shape, still 200.
	code, raw := api(t, "POST", conv, pylibEnvelope(t, `{"q": "encore"}`))
	if m := decode(t, raw); code != http.StatusOK || m["status"] != "error" {
		t.Errorf("POST after DELETE = %d %s, want 200 status error", code, raw)
	}
	fake.assertNoCalls(t, srv)
	assertLLMCounted(t, srv, fake, srv.URL("/agora/acme/counter"))
}

func TestAgora_conversationsSurviveRestart(t *testing.T) {
	dir := t.TempDir()
	first := startCounter(t, dir)
	id := pylibPost(t, first.URL("/agora/acme/counter"), 1)
	pylibPost(t, first.URL("/agora/acme/counter/conversations/"+id), 2)
	if err := first.Stop(10 * time.Second); err != nil {
		t.Fatalf("stopping the first parley serve: %v\n%s", err, first.Log)
	}

	second := parleytest.Start(t, dir)
	// The memory came back with the conversation: the count goes on.
	pylibPost(t, second.URL("/agora/acme/counter/conversations/"+id), 3)
	if code, raw := api(t, "DELETE", second.URL("/agora/acme/counter/conversations/"+id), ""); code != http.StatusOK {
		t.Errorf("DELETE after restart = %d %s, want 200", code, raw)
	}
	// A spec2024 peer asking for it now gets 404.
	hexEnv := `{"protocolHash":"` + sha1Hex([]byte(counterPD)) + `","body":{"q":1},"multiround":true}`
	if code, raw := api(t, "POST", second.URL("/agora/acme/counter/conversations/"+id), hexEnv); code != http.StatusNotFound {
		t.Errorf("POST to the deleted conversation = %d %s, want 404", code, raw)
	}
}
