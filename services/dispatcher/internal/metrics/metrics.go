// Package metrics holds the dispatcher's Prometheus collectors and the
// labels they share (the path that answered an envelope, a send or a step).
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Paths an envelope can take, the label of the dispatcher's metrics.
const (
	PathRoutine  = "routine"
	PathHandler  = "handler"
	PathLLM      = "llm"
	PathRejected = "rejected"
	PathFailure  = "failure"
	// PathNegotiation: a negotiation message answered through the negotiator.
	PathNegotiation = "negotiation"
	// PathText: a Send of text, or of task data with no LLM to write it.
	PathText = "text"
)

// Metrics are the dispatcher's collectors.
type Metrics struct {
	Envelopes       *prometheus.CounterVec   // by path
	EnvelopeSeconds *prometheus.HistogramVec // by path
	RoutineFailures prometheus.Counter
	RoutineKills    *prometheus.CounterVec // by kind: time, memory, output, steps
	Quarantines     prometheus.Counter
	LLMCalls        *prometheus.CounterVec // by purpose
	LLMTokens       *prometheus.CounterVec // by direction
	Sends           *prometheus.CounterVec // by path
	Steps           *prometheus.CounterVec // by executor
	Connected       prometheus.Gauge
	Negotiations    *prometheus.CounterVec // by outcome
	ShadowRuns      *prometheus.CounterVec // by outcome
	// DeadlineFailures counts failures to fire a deadline's timer (each
	// failure of each timer; the timer stays stored and is retried).
	DeadlineFailures prometheus.Counter
}

// New returns the collectors, registered on reg unless it is nil.
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Envelopes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "parley_dispatcher_envelopes_total",
			Help: "Inbound Agora envelopes by the path that answered them: routine, handler, llm, rejected, failure or negotiation.",
		}, []string{"path"}),
		EnvelopeSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "parley_dispatcher_envelope_duration_seconds",
			Help:    "Time to answer an inbound envelope, by path.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"path"}),
		RoutineFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "parley_dispatcher_routine_failures_total",
			Help: "Routine runs that failed: errors, budget overruns and schema-invalid output.",
		}),
		RoutineKills: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "parley_dispatcher_routine_kills_total",
			Help: "Routine runs (envelopes, steps, shadow and test runs) stopped by a budget or killed at the worker boundary, by kind: time, memory, output or steps.",
		}, []string{"kind"}),
		Quarantines: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "parley_dispatcher_routine_quarantines_total",
			Help: "Routines quarantined after consecutive failures.",
		}),
		LLMCalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "parley_dispatcher_llm_calls_total",
			Help: "LLM calls made by the dispatcher, by purpose.",
		}, []string{"purpose"}),
		LLMTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "parley_dispatcher_llm_tokens_total",
			Help: "LLM tokens used by the dispatcher's calls, when the provider reports them, by direction (input, output).",
		}, []string{"direction"}),
		Sends: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "parley_dispatcher_sends_total",
			Help: "Outbound queries by path: routine, llm or text.",
		}, []string{"path"}),
		Steps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "parley_dispatcher_steps_total",
			Help: "Agent Protocol steps executed, by executor: handler, routine or llm.",
		}, []string{"executor"}),
		Connected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "parley_dispatcher_connected_agents",
			Help: "SDK agent streams currently connected.",
		}),
		Negotiations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "parley_dispatcher_negotiations_total",
			Help: "Negotiations this side started from Send, by outcome: accepted or failed.",
		}, []string{"outcome"}),
		DeadlineFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "parley_dispatcher_deadline_failures_total",
			Help: "Failures to fire a deadline's timer (its protocol unknown, its state unreadable, its expiry not recorded); the timer stays stored and is retried with back-off.",
		}),
		ShadowRuns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "parley_dispatcher_shadow_runs_total",
			Help: "Shadow runs of LLM-written routine candidates beside the LLM, by outcome: agreed, disagreed, promoted (agreed and installed), conflict (promoted but not installed: it clashes with the installed routine), skipped (every shadow worker busy) or error (not compared, or an install that may succeed later).",
		}, []string{"outcome"}),
	}
	if reg != nil {
		reg.MustRegister(m.Collectors()...)
	}
	for _, k := range []string{"time", "memory", "output", "steps"} {
		m.RoutineKills.WithLabelValues(k)
	}
	for _, p := range []string{PathRoutine, PathHandler, PathLLM, PathRejected, PathFailure, PathNegotiation} {
		m.Envelopes.WithLabelValues(p)
	}
	return m
}

// Collectors returns every collector, for a caller that registers them
// itself (the app, on the server it is mounted on).
func (m *Metrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.Envelopes, m.EnvelopeSeconds, m.RoutineFailures, m.RoutineKills, m.Quarantines, m.LLMCalls, m.LLMTokens, m.Sends, m.Steps, m.Connected, m.Negotiations, m.ShadowRuns, m.DeadlineFailures}
}
