package server

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	negotiatorv1 "github.com/parleyhq/parley/gen/parley/negotiator/v1"
	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/services/dispatcher/internal/hosted"
	"github.com/parleyhq/parley/services/dispatcher/internal/routine"
	"github.com/parleyhq/parley/services/dispatcher/internal/routine/routinetest"
	"github.com/parleyhq/parley/services/dispatcher/internal/shadow"
)

// shadowOutcome returns parley_dispatcher_shadow_runs_total{outcome}.
func shadowOutcome(t *testing.T, e *testEnv, outcome string) float64 {
	t.Helper()
	var m dto.Metric
	if err := e.srv.metrics.ShadowRuns.WithLabelValues(outcome).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// waitOutcome polls until the shadow runs with outcome reach n.
func waitOutcome(t *testing.T, e *testEnv, outcome string, n float64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for shadowOutcome(t, e, outcome) < n {
		if time.Now().After(deadline) {
			t.Fatalf("shadow runs %s = %v, want %v", outcome, shadowOutcome(t, e, outcome), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

const sendCandidate = "def send(task):\n    return json.encode({\"location\": task[\"location\"], \"date\": task[\"date\"]})\n"

// startSenderShadow runs the weather agent with its receiver routine
// (routine, if not "") and a SHADOW sender candidate src for the weather PD
// needing one agreement; the LLM composes Send bodies.
func startSenderShadow(t *testing.T, routine, src string) (*testEnv, *fakeShadowNegotiator) {
	t.Helper()
	neg := &fakeShadowNegotiator{candidates: map[string]*negotiatorv1.RoutineCandidate{}}
	name := shadow.CandidateName(weatherAgent, weatherHex, shadow.Sender)
	neg.candidates[name] = &negotiatorv1.RoutineCandidate{Name: name, Source: src,
		State: negotiatorv1.RoutineCandidateState_ROUTINE_CANDIDATE_STATE_SHADOW, ShadowCallsRequired: 1}
	reg := newFakeRegistry()
	reg.addProtocol(weatherPD)
	reg.addAgent(agentRes(weatherAgent, registryv1.Dialect_DIALECT_UNSPECIFIED, registryv1.SupportPolicy_SUPPORT_POLICY_EXPLICIT, weatherHex))
	e := startEnv(t, reg, "", Options{Negotiator: neg})
	e.setTable(weatherAgent, "weather", weatherTable)
	if routine != "" {
		e.setRoutine(weatherAgent, weatherHex, routine)
	}
	e.llm.reply = func(req LLMRequest) (LLMResult, error) {
		if req.Purpose != PurposeSend {
			return LLMResult{}, fmt.Errorf("unexpected LLM purpose %s", req.Purpose)
		}
		return LLMResult{Output: req.Input}, nil
	}
	return e, neg
}

func (e *testEnv) sendForecast(t *testing.T) *dispatcherv1.SendResponse {
	t.Helper()
	r, err := e.client.Send(t.Context(), &dispatcherv1.SendRequest{Agent: weatherAgent, TargetUrl: e.url + "/agora/acme/weather",
		Task: "forecast", ProtocolHash: weatherHex, TaskDataJson: `{"date":"2026-12-01","location":"Paris"}`})
	if err != nil || r.GetStatus() != "success" || !strings.Contains(r.GetResultJson(), "rainy") {
		t.Fatalf("Send = %v, %v; want the Paris forecast", r, err)
	}
	return r
}

func (e *testEnv) weatherRoutineSource(t *testing.T) string {
	t.Helper()
	r, err := e.client.GetRoutine(t.Context(), &dispatcherv1.GetRoutineRequest{Name: hosted.Name(weatherAgent, weatherHex)})
	if err != nil {
		t.Fatalf("GetRoutine = %v", err)
	}
	return r.GetSource()
}

// A promoted sender candidate joins the agent's receiver routine for the
// PD instead of replacing it: both reply and send keep working.
func TestShadow_promotedSenderIsMergedWithTheReceiverRoutine(t *testing.T) {
	e, neg := startSenderShadow(t, weatherRoutine, sendCandidate)
	if r := e.sendForecast(t); r.GetPath() != pathLLM {
		t.Fatalf("Send path = %s, want llm while the candidate shadows", r.GetPath())
	}
	if r := waitReports(t, neg, 1)[0]; !r.GetAgreed() {
		t.Fatalf("report = %v, want agreed", r)
	}
	waitPromoted(t, e)
	src := e.weatherRoutineSource(t)
	if !strings.Contains(src, "def reply(") || !strings.Contains(src, "def send(") {
		t.Fatalf("routine after promotion = %q, want reply and send", src)
	}
	if r := e.sendForecast(t); r.GetPath() != pathRoutine {
		t.Errorf("Send after promotion path = %s, want routine", r.GetPath())
	}
	_, m, raw := e.do("POST", "/agora/acme/weather", parisEnvelope)
	if b, _ := m["body"].(map[string]any); m["status"] != "success" || b["weatherCondition"] != "rainy" {
		t.Errorf("envelope after promotion = %s, want the receiver routine's forecast", raw)
	}
	if got := e.llm.calls.Load(); got != 1 {
		t.Errorf("LLM calls = %d, want 1", got)
	}
}

// A candidate whose top-level names clash with the installed routine is
// not installed: the routine is kept and the outcome is a conflict.
func TestShadow_promotedCandidateClashingWithTheRoutineIsNotInstalled(t *testing.T) {
	receiver := "LIMIT = 2\n" + weatherRoutine
	e, neg := startSenderShadow(t, receiver, "LIMIT = 1\n"+sendCandidate)
	e.sendForecast(t)
	waitReports(t, neg, 1)
	waitOutcome(t, e, shadowConflict, 1)
	if src := e.weatherRoutineSource(t); src != receiver {
		t.Errorf("routine after a conflicting promotion = %q, want the receiver routine unchanged", src)
	}
	if got := shadowOutcome(t, e, shadowPromoted); got != 0 {
		t.Errorf("promoted = %v, want 0", got)
	}
}

// A user-written routine that already defines the candidate's functions is
// never replaced: the promotion installs nothing.
func TestShadow_promotedCandidateNeverReplacesAUserRoutine(t *testing.T) {
	user := weatherRoutine + "\ndef send(task):\n    return {\"location\": task[\"location\"], \"date\": task[\"date\"], \"by\": \"user\"}\n"
	e, neg := startSenderShadow(t, user, sendCandidate)
	if r := e.sendForecast(t); r.GetPath() != pathRoutine {
		t.Fatalf("Send path = %s, want the user's routine", r.GetPath())
	}
	// As when a lookup finds the candidate PROMOTED: the user's routine
	// already defines send.
	name := shadow.CandidateName(weatherAgent, weatherHex, shadow.Sender)
	c := neg.candidates[name]
	c.State = negotiatorv1.RoutineCandidateState_ROUTINE_CANDIDATE_STATE_PROMOTED
	e.srv.shadows.InstallPromoted(t.Context(), weatherAgent, weatherHex, fromCandidate(c))
	if src := e.weatherRoutineSource(t); src != user {
		t.Errorf("routine after the promotion = %q, want the user's unchanged", src)
	}
	for _, o := range []string{shadowPromoted, shadowConflict, shadowError} {
		if got := shadowOutcome(t, e, o); got != 0 {
			t.Errorf("shadow runs %s = %v, want 0", o, got)
		}
	}
}

// A candidate found PROMOTED but not installed (the install after the
// promotion failed) is installed by the next call's lookup.
func TestShadow_promotedButUninstalledCandidateIsInstalledOnLookup(t *testing.T) {
	e, neg := startShadowWeather(t, weatherRoutine, 1)
	name := shadow.CandidateName(weatherAgent, weatherHex, shadow.Receiver)
	neg.candidates[name].State = negotiatorv1.RoutineCandidateState_ROUTINE_CANDIDATE_STATE_PROMOTED
	e.llm.reply = weatherLLM(0)
	e.do("POST", "/agora/acme/weather", parisEnvelope)
	waitPromoted(t, e)
	if src := e.weatherRoutineSource(t); src != weatherRoutine {
		t.Fatalf("routine = %q, want the candidate's", src)
	}
	e.do("POST", "/agora/acme/weather", parisEnvelope)
	if got := e.llm.calls.Load(); got != 1 {
		t.Errorf("LLM calls = %d, want 1 (the routine answers after the install)", got)
	}
	if _, reports := neg.counts(); len(reports) != 0 {
		t.Errorf("reports = %d, want 0", len(reports))
	}
}

// busyNegotiator fills the routine pool while it answers a report, so the
// install that follows the promotion finds every worker busy.
type busyNegotiator struct {
	*fakeShadowNegotiator
	pool *routine.Pool
	done chan struct{}
}

func (b *busyNegotiator) ReportShadowResult(ctx context.Context, req *negotiatorv1.ReportShadowResultRequest, opts ...grpc.CallOption) (*negotiatorv1.RoutineCandidate, error) {
	go func() {
		defer close(b.done)
		_, _ = routine.Compile(context.Background(), "busy", "n = 0\nfor i in range(1000000000):\n    n += 1\n", nil,
			routinetest.Limits(routine.Limits{Pool: b.pool, Timeout: time.Second, MaxSteps: 1 << 50}))
	}()
	for {
		_, err := routine.Compile(ctx, "probe", "x = 1\n", nil, routinetest.Limits(routine.Limits{Pool: b.pool, Timeout: time.Millisecond}))
		if errors.Is(err, routine.ErrBusy) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	return b.fakeShadowNegotiator.ReportShadowResult(ctx, req, opts...)
}

// The reviewer's lost promotion: the install after the promotion fails (a
// transient busy pool); the next call installs it.
func TestShadow_failedInstallOfAPromotionIsRetried(t *testing.T) {
	name := shadow.CandidateName(weatherAgent, weatherHex, shadow.Receiver)
	fake := &fakeShadowNegotiator{candidates: map[string]*negotiatorv1.RoutineCandidate{name: {Name: name, Source: weatherRoutine,
		State: negotiatorv1.RoutineCandidateState_ROUTINE_CANDIDATE_STATE_SHADOW, ShadowCallsRequired: 1}}}
	pool := testPool(1)
	neg := &busyNegotiator{fakeShadowNegotiator: fake, pool: pool, done: make(chan struct{})}
	reg := newFakeRegistry()
	reg.addProtocol(weatherPD)
	reg.addAgent(agentRes(weatherAgent, registryv1.Dialect_DIALECT_UNSPECIFIED, registryv1.SupportPolicy_SUPPORT_POLICY_EXPLICIT, weatherHex))
	e := startEnv(t, reg, "", Options{Negotiator: neg, RoutineLimits: routine.Limits{Pool: pool, Timeout: 100 * time.Millisecond}})
	e.setTable(weatherAgent, "weather", weatherTable)
	e.llm.reply = weatherLLM(0)
	e.do("POST", "/agora/acme/weather", parisEnvelope)
	waitOutcome(t, e, shadowError, 1)
	if _, err := e.client.GetRoutine(t.Context(), &dispatcherv1.GetRoutineRequest{Name: hosted.Name(weatherAgent, weatherHex)}); err == nil {
		t.Fatal("routine installed although every worker was busy")
	}
	<-neg.done
	e.do("POST", "/agora/acme/weather", parisEnvelope)
	waitPromoted(t, e)
	if src := e.weatherRoutineSource(t); src != weatherRoutine {
		t.Errorf("routine = %q, want the candidate's", src)
	}
}

// A candidate run that overruns its wall-time budget (a late result under
// load) is not compared: nothing is reported, the candidate stays SHADOW.
func TestShadow_timeBudgetOverrunIsNotADisagreement(t *testing.T) {
	slow := "def reply(query, memory):\n    n = 0\n    for i in range(1000000000):\n        n += 1\n    return n\n"
	name := shadow.CandidateName(weatherAgent, weatherHex, shadow.Receiver)
	neg := &fakeShadowNegotiator{candidates: map[string]*negotiatorv1.RoutineCandidate{name: {Name: name, Source: slow,
		State: negotiatorv1.RoutineCandidateState_ROUTINE_CANDIDATE_STATE_SHADOW, ShadowCallsRequired: 1}}}
	reg := newFakeRegistry()
	reg.addProtocol(weatherPD)
	reg.addAgent(agentRes(weatherAgent, registryv1.Dialect_DIALECT_UNSPECIFIED, registryv1.SupportPolicy_SUPPORT_POLICY_EXPLICIT, weatherHex))
	e := startEnv(t, reg, "", Options{Negotiator: neg, RoutineLimits: routine.Limits{Timeout: 50 * time.Millisecond, MaxSteps: 1 << 50}})
	e.setTable(weatherAgent, "weather", weatherTable)
	e.llm.reply = weatherLLM(0)
	e.do("POST", "/agora/acme/weather", parisEnvelope)
	waitOutcome(t, e, shadowError, 1)
	if _, reports := neg.counts(); len(reports) != 0 {
		t.Errorf("reports = %v, want none (a time overrun is not a verdict)", reports)
	}
	if st := neg.candidates[name].GetState(); st != negotiatorv1.RoutineCandidateState_ROUTINE_CANDIDATE_STATE_SHADOW {
		t.Errorf("candidate state = %v, want SHADOW", st)
	}
}
