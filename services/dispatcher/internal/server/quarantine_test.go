package server

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/grpcerr"
)

// flakyRoutine fails (a budget kill: the routine's own fault) when the
// query asks it to loop, and answers otherwise.
const flakyRoutine = `
def reply(q, m):
    if q["location"] == "loop":
        while True:
            pass
    return {"temperature": 1, "precipitation": 0, "weatherCondition": "sunny"}
`

func (e *testEnv) routine(agent, id string) *dispatcherv1.Routine {
	e.t.Helper()
	r, err := e.client.GetRoutine(e.t.Context(), &dispatcherv1.GetRoutineRequest{Name: agent + "/routines/" + id})
	if err != nil {
		e.t.Fatalf("GetRoutine(%s) = %v", id, err)
	}
	return r
}

func (e *testEnv) weatherQuery(location string) string {
	e.t.Helper()
	_, _, raw := e.do("POST", "/agora/acme/weather", `{"protocolHash":"`+weatherHex+`","body":{"date":"2026-12-01","location":"`+location+`"}}`)
	return raw
}

// TestRoutineSuccess_resetsItsFailureCount: quarantine needs consecutive
// failures; a success in between starts the count again.
func TestRoutineSuccess_resetsItsFailureCount(t *testing.T) {
	e := startWeather(t, registryv1.Dialect_DIALECT_UNSPECIFIED, Options{QuarantineAfter: 3})
	e.setRoutine(weatherAgent, weatherHex, flakyRoutine)
	e.weatherQuery("loop")
	e.weatherQuery("loop")
	if r := e.routine(weatherAgent, weatherHex); r.GetConsecutiveFailures() != 2 {
		t.Fatalf("after 2 failures: consecutive_failures = %d, want 2", r.GetConsecutiveFailures())
	}
	if raw := e.weatherQuery("Rome"); !strings.Contains(raw, "sunny") {
		t.Fatalf("POST valid query = %s, want the routine's answer", raw)
	}
	if r := e.routine(weatherAgent, weatherHex); r.GetConsecutiveFailures() != 0 || r.GetState() != dispatcherv1.Routine_STATE_ACTIVE {
		t.Errorf("after a success: state %v, consecutive_failures %d; want ACTIVE, 0", r.GetState(), r.GetConsecutiveFailures())
	}
	e.weatherQuery("loop")
	e.weatherQuery("loop")
	if r := e.routine(weatherAgent, weatherHex); r.GetState() != dispatcherv1.Routine_STATE_ACTIVE || r.GetConsecutiveFailures() != 2 {
		t.Errorf("fail, fail, success, fail, fail: state %v, consecutive_failures %d; want ACTIVE with 2", r.GetState(), r.GetConsecutiveFailures())
	}
}

// TestRoutineQuarantine_countsInTheMetric: the quarantine counter moves
// once, when the routine is quarantined, and the failure counter with
// every failure.
func TestRoutineQuarantine_countsInTheMetric(t *testing.T) {
	reg := prometheus.NewRegistry()
	e := startWeather(t, registryv1.Dialect_DIALECT_UNSPECIFIED, Options{QuarantineAfter: 2, Metrics: reg})
	e.setRoutine(weatherAgent, weatherHex, flakyRoutine)
	if got := counter(t, reg, "parley_dispatcher_routine_quarantines_total"); got != 0 {
		t.Fatalf("quarantines before any failure = %v, want 0", got)
	}
	e.weatherQuery("loop")
	e.weatherQuery("loop")
	if r := e.routine(weatherAgent, weatherHex); r.GetState() != dispatcherv1.Routine_STATE_QUARANTINED {
		t.Fatalf("after 2 failures: state %v, want QUARANTINED", r.GetState())
	}
	if got := counter(t, reg, "parley_dispatcher_routine_quarantines_total"); got != 1 {
		t.Errorf("parley_dispatcher_routine_quarantines_total = %v, want 1", got)
	}
	if got := counter(t, reg, "parley_dispatcher_routine_failures_total"); got != 2 {
		t.Errorf("parley_dispatcher_routine_failures_total = %v, want 2", got)
	}
}

// counter reads an unlabelled counter from reg; a counter that is not
// registered fails the test rather than reading 0.
func counter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatalf("Gather = %v", err)
	}
	for _, f := range families {
		if f.GetName() == name && len(f.GetMetric()) == 1 {
			return f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("metric %s is not registered", name)
	return 0
}

// TestRoutine_sendersBadInputDoesNotQuarantine: any caller could once
// quarantine the README's weather routine with three bodies it cannot use
// (issue 11, item 4). Such a request gets a one-sentence failure with no
// traceback (item 5) and does not count; a valid query still works.
func TestRoutine_sendersBadInputDoesNotQuarantine(t *testing.T) {
	e := startWeather(t, registryv1.Dialect_DIALECT_UNSPECIFIED, Options{QuarantineAfter: 3})
	for i, body := range []string{`[1]`, `"garbage"`, `[1]`, `"garbage"`, `{"date": 5}`} {
		_, m, raw := e.do("POST", "/agora/acme/weather", `{"protocolHash":"`+weatherHex+`","body":`+body+`}`)
		if m["status"] != "failure" {
			t.Fatalf("POST #%d %s = %s, want failure", i, body, raw)
		}
		msg, _ := m["error"].(string)
		if strings.Count(msg, ".") > 1 || strings.Contains(msg, "Traceback") || strings.Contains(msg, weatherHex) || strings.Contains(msg, "line ") {
			t.Errorf("POST #%d failure %q: want one sentence with no traceback or routine path", i, msg)
		}
	}
	if r := e.routine(weatherAgent, weatherHex); r.GetState() != dispatcherv1.Routine_STATE_ACTIVE || r.GetConsecutiveFailures() != 0 {
		t.Errorf("after 5 bad requests: state %v, failures %d; want ACTIVE, 0", r.GetState(), r.GetConsecutiveFailures())
	}
	if raw := e.weatherQuery("Paris"); !strings.Contains(raw, "rainy") {
		t.Errorf("POST valid query after bad ones = %s, want the forecast", raw)
	}
}

// TestRoutine_quarantinedReplySaysSo: with no LLM to fall back on, a
// quarantined routine's protocol answers that the routine is quarantined,
// not that the agent has none (issue 11, item 4).
func TestRoutine_quarantinedReplySaysSo(t *testing.T) {
	e := startWeather(t, registryv1.Dialect_DIALECT_UNSPECIFIED, Options{QuarantineAfter: 2})
	e.setRoutine(weatherAgent, weatherHex, flakyRoutine)
	e.weatherQuery("loop")
	e.weatherQuery("loop")
	raw := e.weatherQuery("Rome")
	if !strings.Contains(raw, "quarantined") || strings.Contains(raw, "no routine") {
		t.Errorf("POST to a quarantined routine = %s, want a failure saying it is quarantined", raw)
	}
	r := e.routine(weatherAgent, weatherHex)
	if !strings.Contains(r.GetLastError(), "budget") {
		t.Errorf("Routine.last_error = %q, want the detail for the owner", r.GetLastError())
	}
}

// TestSetRoutine_unknownAgentIsNotFound: routines and tools are set only
// for agents the registry knows, as `agent get` reports (issue 11, item 6).
func TestSetRoutine_unknownAgentIsNotFound(t *testing.T) {
	e := startWeather(t, registryv1.Dialect_DIALECT_UNSPECIFIED, Options{})
	const ghost = "clients/acme/agents/ghost"
	_, err := e.client.SetRoutine(t.Context(), &dispatcherv1.SetRoutineRequest{Routine: &dispatcherv1.Routine{Name: ghost + "/routines/" + weatherHex, Source: weatherRoutine}})
	if status.Code(err) != codes.NotFound || grpcerr.Reason(err) != "AGENT_NOT_FOUND" || !strings.Contains(status.Convert(err).Message(), ghost) {
		t.Errorf("SetRoutine(unknown agent) = %v, want NOT_FOUND AGENT_NOT_FOUND naming the agent", err)
	}
	_, err = e.client.SetTool(t.Context(), &dispatcherv1.SetToolRequest{Tool: &dispatcherv1.Tool{
		Name: ghost + "/tools/weather", Kind: &dispatcherv1.Tool_Table{Table: &dispatcherv1.TableTool{EntriesJson: weatherTable}},
	}})
	if status.Code(err) != codes.NotFound || grpcerr.Reason(err) != "AGENT_NOT_FOUND" {
		t.Errorf("SetTool(unknown agent) = %v, want NOT_FOUND AGENT_NOT_FOUND", err)
	}
}
