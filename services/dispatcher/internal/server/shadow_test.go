package server

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	negotiatorv1 "github.com/parleyhq/parley/gen/parley/negotiator/v1"
	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/services/dispatcher/internal/hosted"
	"github.com/parleyhq/parley/services/dispatcher/internal/shadow"
)

// fakeShadowNegotiator holds routine candidates and applies the
// negotiator's shadow rule: promoted after required agreements, rejected
// on a disagreement.
type fakeShadowNegotiator struct {
	negotiatorv1.NegotiatorServiceClient

	mu         sync.Mutex
	candidates map[string]*negotiatorv1.RoutineCandidate
	lookups    int
	reports    []*negotiatorv1.ReportShadowResultRequest
}

func (f *fakeShadowNegotiator) GetRoutineCandidate(_ context.Context, req *negotiatorv1.GetRoutineCandidateRequest, _ ...grpc.CallOption) (*negotiatorv1.RoutineCandidate, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lookups++
	c, ok := f.candidates[req.GetName()]
	if !ok {
		return nil, status.Error(codes.NotFound, "no candidate")
	}
	return cloneCandidate(c), nil
}

func (f *fakeShadowNegotiator) ReportShadowResult(_ context.Context, req *negotiatorv1.ReportShadowResultRequest, _ ...grpc.CallOption) (*negotiatorv1.RoutineCandidate, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reports = append(f.reports, req)
	c, ok := f.candidates[req.GetName()]
	if !ok {
		return nil, status.Error(codes.NotFound, "no candidate")
	}
	if req.GetCheckFailed() {
		c.State, c.RejectionReason = negotiatorv1.RoutineCandidateState_ROUTINE_CANDIDATE_STATE_REJECTED, req.GetDetail()
		return cloneCandidate(c), nil
	}
	if c.GetState() != negotiatorv1.RoutineCandidateState_ROUTINE_CANDIDATE_STATE_SHADOW {
		return nil, status.Error(codes.FailedPrecondition, "not in shadow")
	}
	switch {
	case !req.GetAgreed():
		c.State, c.RejectionReason = negotiatorv1.RoutineCandidateState_ROUTINE_CANDIDATE_STATE_REJECTED, req.GetDetail()
	default:
		c.Agreements++
		if c.GetAgreements() >= c.GetShadowCallsRequired() {
			c.State = negotiatorv1.RoutineCandidateState_ROUTINE_CANDIDATE_STATE_PROMOTED
		}
	}
	return cloneCandidate(c), nil
}

func cloneCandidate(c *negotiatorv1.RoutineCandidate) *negotiatorv1.RoutineCandidate {
	return &negotiatorv1.RoutineCandidate{Name: c.GetName(), Source: c.GetSource(), State: c.GetState(), ShadowCallsRequired: c.GetShadowCallsRequired(), Agreements: c.GetAgreements(), RejectionReason: c.GetRejectionReason(), Check: c.GetCheck()}
}

func (f *fakeShadowNegotiator) counts() (lookups int, reports []*negotiatorv1.ReportShadowResultRequest) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lookups, append([]*negotiatorv1.ReportShadowResultRequest(nil), f.reports...)
}

// startShadowWeather runs the weather agent with its tool but no routine,
// and a negotiator holding (when candidate is not "") a SHADOW receiver
// candidate for the weather PD needing required agreements.
func startShadowWeather(t *testing.T, candidate string, required int32) (*testEnv, *fakeShadowNegotiator) {
	t.Helper()
	neg := &fakeShadowNegotiator{candidates: map[string]*negotiatorv1.RoutineCandidate{}}
	if candidate != "" {
		name := shadow.CandidateName(weatherAgent, weatherHex, shadow.Receiver)
		neg.candidates[name] = &negotiatorv1.RoutineCandidate{Name: name, Source: candidate,
			State: negotiatorv1.RoutineCandidateState_ROUTINE_CANDIDATE_STATE_SHADOW, ShadowCallsRequired: required}
	}
	reg := newFakeRegistry()
	reg.addProtocol(weatherPD)
	reg.addAgent(agentRes(weatherAgent, registryv1.Dialect_DIALECT_UNSPECIFIED, registryv1.SupportPolicy_SUPPORT_POLICY_EXPLICIT, weatherHex))
	e := startEnv(t, reg, "", Options{Negotiator: neg})
	e.setTable(weatherAgent, "weather", weatherTable)
	return e, neg
}

// weatherLLM answers the weather PD as the routine would, its keys in
// another order and its numbers spelled differently; off changes the
// temperature it reports.
func weatherLLM(off float64) func(LLMRequest) (LLMResult, error) {
	return func(req LLMRequest) (LLMResult, error) {
		var q struct{ Location string }
		_ = json.Unmarshal(req.Input, &q)
		out := fmt.Sprintf(`{"weatherCondition":"rainy","precipitation":1.50,"temperature":%.1f}`, 7+off)
		if q.Location != "Paris" {
			out = `{"error":"Unsupported location"}`
		}
		return LLMResult{Output: json.RawMessage(out)}, nil
	}
}

const parisEnvelope = `{"protocolHash":"` + weatherHex + `","body":{"date":"2026-12-01","location":"Paris"}}`

// waitReports polls until the negotiator has n shadow reports.
func waitReports(t *testing.T, neg *fakeShadowNegotiator, n int) []*negotiatorv1.ReportShadowResultRequest {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, reports := neg.counts()
		if len(reports) >= n {
			return reports
		}
		if time.Now().After(deadline) {
			t.Fatalf("shadow reports = %d, want %d", len(reports), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitPromoted polls until the dispatcher has installed one promoted
// candidate (the metric counts it after SetRoutine returned).
func waitPromoted(t *testing.T, e *testEnv) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var m dto.Metric
		if err := e.srv.metrics.ShadowRuns.WithLabelValues(shadowPromoted).Write(&m); err != nil {
			t.Fatal(err)
		}
		if m.GetCounter().GetValue() == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("promoted shadow runs = %v, want 1", m.GetCounter().GetValue())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestShadow_agreeingCandidateIsInstalledAndReplacesTheLLM(t *testing.T) {
	const required = 3
	e, neg := startShadowWeather(t, weatherRoutine, required)
	e.llm.reply = weatherLLM(0)
	for i := range required {
		_, m, raw := e.do("POST", "/agora/acme/weather", parisEnvelope)
		if b, _ := m["body"].(map[string]any); m["status"] != "success" || b["weatherCondition"] != "rainy" {
			t.Fatalf("envelope %d = %s, want the LLM's forecast", i, raw)
		}
		reports := waitReports(t, neg, i+1)
		if r := reports[i]; !r.GetAgreed() {
			t.Fatalf("report %d = %v, want agreed", i, r)
		}
	}
	// The promotion installs the routine after the report is answered.
	waitPromoted(t, e)
	r, err := e.client.GetRoutine(t.Context(), &dispatcherv1.GetRoutineRequest{Name: hosted.Name(weatherAgent, weatherHex)})
	if err != nil || r.GetSource() != weatherRoutine {
		t.Fatalf("GetRoutine after promotion = %v, %v; want the candidate's source", r, err)
	}
	llmCalls := e.llm.calls.Load()
	if llmCalls != required {
		t.Errorf("LLM calls during shadow = %d, want %d", llmCalls, required)
	}
	for i := range 5 {
		_, m, raw := e.do("POST", "/agora/acme/weather", parisEnvelope)
		if b, _ := m["body"].(map[string]any); m["status"] != "success" || b["weatherCondition"] != "rainy" {
			t.Fatalf("envelope %d after promotion = %s, want the routine's forecast", i, raw)
		}
	}
	if got := e.llm.calls.Load(); got != llmCalls {
		t.Errorf("LLM calls after promotion = %d, want still %d", got, llmCalls)
	}
	lookups, reports := neg.counts()
	if lookups != 1 || len(reports) != required {
		t.Errorf("negotiator saw %d candidate lookups and %d reports, want 1 (cached) and %d", lookups, len(reports), required)
	}
}

// TestShadow_candidateThatFailsItsCheckIsRejected: the dispatcher runs the
// check the negotiator wrote before shadowing or installing a candidate
// (the negotiator runs no routine); one that fails is reported, rejected
// and never run beside the LLM, whatever its state.
func TestShadow_candidateThatFailsItsCheckIsRejected(t *testing.T) {
	for _, state := range []negotiatorv1.RoutineCandidateState{
		negotiatorv1.RoutineCandidateState_ROUTINE_CANDIDATE_STATE_SHADOW,
		negotiatorv1.RoutineCandidateState_ROUTINE_CANDIDATE_STATE_PROMOTED,
	} {
		t.Run(state.String(), func(t *testing.T) {
			e, neg := startShadowWeather(t, weatherRoutine, 1)
			c := neg.candidates[shadow.CandidateName(weatherAgent, weatherHex, shadow.Receiver)]
			c.State = state
			// The check's stand-in for the weather tool answers a forecast
			// without weatherCondition, which the output schema requires.
			c.Check = &negotiatorv1.RoutineCheck{
				Functions: []string{"reply"},
				Tools:     []*negotiatorv1.RoutineCheckTool{{Name: "weather", ResultJson: []byte(`{"temperature":1}`)}},
				Calls: []*negotiatorv1.RoutineCheckCall{{Function: "reply", ArgsJson: [][]byte{[]byte(`[{"date":"2026-12-01","location":"Oslo"},{}]`)},
					OutputSchemaJson: []byte(`{"type":"object","required":["weatherCondition"]}`)}},
			}
			e.llm.reply = weatherLLM(0)
			for i := range 3 {
				if _, m, raw := e.do("POST", "/agora/acme/weather", parisEnvelope); m["status"] != "success" {
					t.Fatalf("envelope %d = %s, want the LLM's forecast", i, raw)
				}
				if i == 0 {
					r := waitReports(t, neg, 1)[0]
					if !r.GetCheckFailed() || !strings.Contains(r.GetDetail(), "weatherCondition") {
						t.Fatalf("report = %v, want a failed check naming the missing field", r)
					}
				}
			}
			if _, reports := neg.counts(); len(reports) != 1 {
				t.Errorf("reports = %v, want only the failed check", reports)
			}
			if got := e.llm.calls.Load(); got != 3 {
				t.Errorf("LLM calls = %d, want 3 (the candidate is never used)", got)
			}
			_, err := e.client.GetRoutine(t.Context(), &dispatcherv1.GetRoutineRequest{Name: hosted.Name(weatherAgent, weatherHex)})
			if status.Code(err) != codes.NotFound {
				t.Errorf("GetRoutine = %v, want NotFound: nothing installed", err)
			}
		})
	}
}

func TestShadow_disagreeingCandidateIsNotInstalled(t *testing.T) {
	e, neg := startShadowWeather(t, weatherRoutine, 3)
	e.llm.reply = weatherLLM(1)
	for i := range 4 {
		_, m, raw := e.do("POST", "/agora/acme/weather", parisEnvelope)
		if b, _ := m["body"].(map[string]any); m["status"] != "success" || b["temperature"] != 8.0 {
			t.Fatalf("envelope %d = %s, want the LLM's forecast", i, raw)
		}
		if i == 0 {
			reports := waitReports(t, neg, 1)
			if r := reports[0]; r.GetAgreed() || !strings.Contains(r.GetDetail(), "temperature") {
				t.Fatalf("report = %v, want a disagreement naming the results", r)
			}
		}
	}
	if got := e.llm.calls.Load(); got != 4 {
		t.Errorf("LLM calls = %d, want 4 (the candidate is not used)", got)
	}
	_, err := e.client.GetRoutine(t.Context(), &dispatcherv1.GetRoutineRequest{Name: hosted.Name(weatherAgent, weatherHex)})
	if status.Code(err) != codes.NotFound {
		t.Errorf("GetRoutine = %v, want NOT_FOUND (the rejected candidate is not installed)", err)
	}
	if _, reports := neg.counts(); len(reports) != 1 {
		t.Errorf("reports = %d, want 1 (a rejected candidate is not run again)", len(reports))
	}
}

func TestShadow_noCandidateIsLookedUpOncePerTTL(t *testing.T) {
	e, neg := startShadowWeather(t, "", 0)
	e.llm.reply = weatherLLM(0)
	// Each envelope's shadow run is awaited before the next, so that every
	// one of them has looked (or not) by the time lookups are counted; a
	// poll that stopped at the first lookup would pass with no cache.
	for range 5 {
		e.do("POST", "/agora/acme/weather", parisEnvelope)
		e.waitShadowRuns()
	}
	if lookups, _ := neg.counts(); lookups != 1 {
		t.Fatalf("candidate lookups after 5 envelopes = %d, want 1", lookups)
	}
	if n := shadowOutcome(t, e, shadowSkipped); n != 0 {
		t.Fatalf("skipped shadow runs = %v, want 0 (each envelope's run is awaited)", n)
	}
	e.advance(time.Minute) // past the cache TTL
	e.do("POST", "/agora/acme/weather", parisEnvelope)
	e.waitShadowRuns()
	if lookups, _ := neg.counts(); lookups != 2 {
		t.Fatalf("candidate lookups after the TTL = %d, want 2", lookups)
	}
}

// waitShadowRuns waits until every shadow run started so far has ended.
// Call it between requests only: no shadow run may start while it waits.
func (e *testEnv) waitShadowRuns() {
	e.srv.shadows.Wait()
}

// TestShadow_senderCandidateReplacesTheLLMComposer: on the sending side,
// the LLM writes each Send's body under the PD while the SHADOW sender
// candidate's send(task) is compared with it; once promoted, Send uses it.
func TestShadow_senderCandidateReplacesTheLLMComposer(t *testing.T) {
	const required = 2
	neg := &fakeShadowNegotiator{candidates: map[string]*negotiatorv1.RoutineCandidate{}}
	name := shadow.CandidateName(senderAgent, weatherHex, shadow.Sender)
	src := "def send(task):\n    return json.encode({\"location\": task[\"location\"], \"date\": task[\"date\"]})\n"
	neg.candidates[name] = &negotiatorv1.RoutineCandidate{Name: name, Source: src,
		State: negotiatorv1.RoutineCandidateState_ROUTINE_CANDIDATE_STATE_SHADOW, ShadowCallsRequired: required}
	e := startWeather(t, registryv1.Dialect_DIALECT_UNSPECIFIED, Options{Negotiator: neg})
	e.reg.addAgent(agentRes(senderAgent, 0, 0))
	e.llm.reply = func(req LLMRequest) (LLMResult, error) {
		if req.Purpose != PurposeSend {
			return LLMResult{}, fmt.Errorf("unexpected LLM purpose %s", req.Purpose)
		}
		return LLMResult{Output: req.Input}, nil // the task data is the PD's query
	}
	send := func() *dispatcherv1.SendResponse {
		t.Helper()
		r, err := e.client.Send(t.Context(), &dispatcherv1.SendRequest{Agent: senderAgent, TargetUrl: e.url + "/agora/acme/weather",
			Task: "forecast", ProtocolHash: weatherHex, TaskDataJson: `{"date":"2026-12-01","location":"Paris"}`})
		if err != nil || r.GetStatus() != "success" || !strings.Contains(r.GetResultJson(), "rainy") {
			t.Fatalf("Send = %v, %v; want the Paris forecast", r, err)
		}
		return r
	}
	for i := range required {
		if r := send(); r.GetPath() != pathLLM {
			t.Fatalf("Send %d path = %s, want llm while the candidate shadows", i, r.GetPath())
		}
		if r := waitReports(t, neg, i+1)[i]; !r.GetAgreed() {
			t.Fatalf("report %d = %v, want agreed", i, r)
		}
	}
	waitPromoted(t, e)
	if _, err := e.client.GetRoutine(t.Context(), &dispatcherv1.GetRoutineRequest{Name: hosted.Name(senderAgent, weatherHex)}); err != nil {
		t.Fatalf("GetRoutine after promotion = %v, want the sender routine installed", err)
	}
	if r := send(); r.GetPath() != pathRoutine {
		t.Errorf("Send after promotion path = %s, want routine", r.GetPath())
	}
	if got := e.llm.calls.Load(); got != required {
		t.Errorf("LLM calls = %d, want %d", got, required)
	}
}
