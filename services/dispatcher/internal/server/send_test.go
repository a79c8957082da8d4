package server

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
)

const senderAgent = "clients/acme/agents/asker"

func TestSend_routineBothSides(t *testing.T) {
	e := startWeather(t, 0, Options{PublicURL: "https://parley.example.com"})
	// An LLM that answers, so that a call the routines should have saved
	// is counted (with no reply set the fake refuses uncounted).
	e.llm.reply = func(LLMRequest) (LLMResult, error) { return LLMResult{Output: json.RawMessage(`"llm"`)}, nil }
	e.reg.addAgent(agentRes(senderAgent, 0, 0))
	e.setRoutine(senderAgent, weatherHex, `
def send(task):
    return {"date": task["date"], "location": task["city"]}

def parse(reply):
    return reply["weatherCondition"]
`)
	// The target: our own weather agent, behind a well-known document that
	// lists the weather PD.
	var sawSources string
	target := http.NewServeMux()
	target.HandleFunc("GET /agent/.wellknown", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(`{"` + weatherHex + `":["https://example.com/weather.txt"]}`)) // a failed write shows as the client's error
	})
	target.HandleFunc("POST /agent", func(w http.ResponseWriter, r *http.Request) {
		r2, _ := http.NewRequestWithContext(r.Context(), http.MethodPost, e.url+"/agora/acme/weather", r.Body)
		resp, err := http.DefaultClient.Do(r2)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		w.WriteHeader(resp.StatusCode)
		buf := new(strings.Builder)
		_, _ = bufCopy(buf, resp)
		_, _ = w.Write([]byte(buf.String())) // a failed write shows as the client's error
	})
	target.HandleFunc("POST /spy", func(w http.ResponseWriter, r *http.Request) {
		buf := new(strings.Builder)
		_, _ = bufCopyReq(buf, r)
		sawSources = buf.String()
		_, _ = w.Write([]byte(`{"status":"success","body":"ok"}`)) // a failed write shows as the client's error
	})
	ts := httptest.NewServer(target)
	defer ts.Close()

	resp, err := e.client.Send(t.Context(), &dispatcherv1.SendRequest{Agent: senderAgent, TargetUrl: ts.URL + "/agent", Task: "weather", TaskDataJson: `{"date":"2026-12-01","city":"Paris"}`})
	if err != nil || resp.GetStatus() != "success" || resp.GetResultJson() != `"rainy"` || resp.GetPath() != "routine" || resp.GetProtocolHash() != weatherHex {
		t.Errorf("Send(weather) = %v, %v; want success \"rainy\" by routine", resp, err)
	}
	if e.llm.calls.Load() != 0 {
		t.Errorf("LLM calls = %d, want 0", e.llm.calls.Load())
	}

	// A forced protocol carries our /protocols URL in protocolSources.
	_, err = e.client.Send(t.Context(), &dispatcherv1.SendRequest{Agent: senderAgent, TargetUrl: ts.URL + "/spy", Task: "weather", TaskDataJson: `{"date":"d","city":"c"}`, ProtocolHash: weatherHex})
	if err != nil || !strings.Contains(sawSources, `"protocolSources":["https://parley.example.com/protocols/`+weatherHex+`"]`) {
		t.Errorf("Send(forced) sent %s, %v; want our protocol URL in protocolSources", sawSources, err)
	}

	// Natural-language text goes without a protocol.
	resp, err = e.client.Send(t.Context(), &dispatcherv1.SendRequest{Agent: senderAgent, TargetUrl: ts.URL + "/spy", Text: "hello"})
	if err != nil || resp.GetStatus() != "success" || resp.GetPath() != "text" || !strings.Contains(sawSources, `"protocolHash":null`) {
		t.Errorf("Send(text) = %v, %v (sent %s); want success without protocol", resp, err, sawSources)
	}

	counts, err := e.client.ListSendCounts(t.Context(), &dispatcherv1.ListSendCountsRequest{Parent: senderAgent})
	if err != nil || len(counts.GetCounts()) != 3 {
		t.Fatalf("ListSendCounts = %v, %v; want 3 entries", counts, err)
	}
	if c := counts.GetCounts()[1]; c.GetTask() != "weather" || c.GetConversations() != 1 || c.GetWithProtocol() != 1 {
		t.Errorf("ListSendCounts[1] = %v, want weather ×1 with protocol", c)
	}
}

func TestSend_errors(t *testing.T) {
	e := startWeather(t, 0, Options{SendRetries: 1})
	e.reg.addAgent(agentRes(senderAgent, 0, 0))
	tests := []struct {
		name string
		req  *dispatcherv1.SendRequest
		code codes.Code
	}{
		{"no task or text", &dispatcherv1.SendRequest{Agent: senderAgent, TargetUrl: "http://127.0.0.1:1/x"}, codes.InvalidArgument},
		{"bad url", &dispatcherv1.SendRequest{Agent: senderAgent, TargetUrl: "ftp://x", Text: "hi"}, codes.InvalidArgument},
		{"unknown agent", &dispatcherv1.SendRequest{Agent: "clients/acme/agents/ghost", TargetUrl: "http://127.0.0.1:1/x", Text: "hi"}, codes.FailedPrecondition},
		{"target down", &dispatcherv1.SendRequest{Agent: senderAgent, TargetUrl: "http://127.0.0.1:1/x", Text: "hi"}, codes.Unavailable},
		{"no sender and no LLM", &dispatcherv1.SendRequest{Agent: senderAgent, TargetUrl: "http://127.0.0.1:1/x", Task: "t", ProtocolHash: weatherHex}, codes.FailedPrecondition},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := e.client.Send(t.Context(), tt.req)
			if status.Code(err) != tt.code {
				t.Errorf("Send = %v, want %v", err, tt.code)
			}
		})
	}
}

// TestSend_manyListedProtocolsCostBounded: a target whose well-known
// document lists 300 PDs gets at most --send-max-listed-protocols registry
// resolutions and --send-max-judge-calls LLM judgements per Send; misses are
// remembered, and no PD is judged twice for the same task.
func TestSend_manyListedProtocolsCostBounded(t *testing.T) {
	e := startWeather(t, 0, Options{SendMaxJudge: 2}) // the flag default
	e.reg.addAgent(agentRes(senderAgent, 0, 0))
	var mu sync.Mutex
	judged := map[string]int{}
	e.llm.reply = func(req LLMRequest) (LLMResult, error) {
		if req.Purpose == PurposeJudge {
			mu.Lock()
			judged[sha1Hex(req.Protocol)]++
			mu.Unlock()
			return LLMResult{Output: json.RawMessage(`false`)}, nil
		}
		return LLMResult{Output: json.RawMessage(`"what is the forecast?"`)}, nil
	}
	doc := map[string][]string{}
	for i := range 300 {
		pd := fmt.Sprintf("---\nname: Forecast for weather, variant %d\n---\nAsk for it.", i)
		src := pd
		if i%2 == 1 {
			src = "not the PD" // does not verify
		}
		doc[sha1Hex([]byte(pd))] = []string{"data:text/plain;charset=utf-8;base64," + base64.StdEncoding.EncodeToString([]byte(src))}
	}
	// A PD that fits the task, listed after the first five: not resolved
	// until we hold it for another reason.
	sorted := slices.Sorted(maps.Keys(doc))
	var fitPD, fitHash string
	for i := 0; fitHash == "" || fitHash < sorted[4]; i++ {
		fitPD = fmt.Sprintf("---\nname: weather forecast %d\n---\nAsk for it.", i)
		fitHash = sha1Hex([]byte(fitPD))
	}
	fitSources := []string{"data:text/plain;charset=utf-8;base64," + base64.StdEncoding.EncodeToString([]byte(fitPD))}
	doc[fitHash] = fitSources
	target := http.NewServeMux()
	target.HandleFunc("GET /agent/.wellknown", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(mustJSON(doc))) })
	target.HandleFunc("POST /agent", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(`{"status":"success","body":"sunny"}`))
	})
	ts := httptest.NewServer(target)
	defer ts.Close()

	judgeCalls := func() int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for h, c := range judged {
			if c > 1 {
				t.Errorf("PD %s judged %d times for one task", h, c)
			}
			n += c
		}
		return n
	}
	send := func() {
		resp, err := e.client.Send(t.Context(), &dispatcherv1.SendRequest{Agent: senderAgent, TargetUrl: ts.URL + "/agent", Task: "weather-forecast", TaskDataJson: `{"city":"Paris"}`})
		if err != nil || resp.GetStatus() != "success" || resp.GetProtocolHash() != "" {
			t.Fatalf("Send = %v, %v; want success in natural language (nothing fits)", resp, err)
		}
	}
	send()
	if got := e.reg.resolveCalls.Load(); got > 5 {
		t.Errorf("registry resolutions after one Send = %d, want at most 5", got)
	}
	if got := judgeCalls(); got > 2 || got == 0 {
		t.Errorf("LLM judgements after one Send = %d, want 1 or 2", got)
	}
	before := e.reg.resolveCalls.Load()
	send()
	if got := e.reg.resolveCalls.Load() - before; got != 0 {
		t.Errorf("registry resolutions in a second Send = %d, want 0 (resolved PDs cached, failures remembered)", got)
	}
	if got := judgeCalls(); got > 4 {
		t.Errorf("LLM judgements after two Sends = %d, want at most 4", got)
	}

	// Once we hold the fitting PD (say an envelope brought it), it is free
	// to read and is picked.
	if _, err := e.srv.dir.Protocol(t.Context(), fitHash, fitSources); err != nil {
		t.Fatal(err)
	}
	before = e.reg.resolveCalls.Load()
	resp, err := e.client.Send(t.Context(), &dispatcherv1.SendRequest{Agent: senderAgent, TargetUrl: ts.URL + "/agent", Task: "weather-forecast", TaskDataJson: `{"city":"Paris"}`})
	if err != nil || resp.GetProtocolHash() != fitHash || e.reg.resolveCalls.Load() != before {
		t.Errorf("Send with the fitting PD held = %v, %v (%d registry calls); want it picked with no registry call", resp, err, e.reg.resolveCalls.Load()-before)
	}
}
