package server

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
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
