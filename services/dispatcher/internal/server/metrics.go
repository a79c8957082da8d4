package server

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/parleyhq/parley/services/dispatcher/internal/routine"
)

// Paths an envelope can take, the label of the dispatcher's metrics.
const (
	pathRoutine  = "routine"
	pathHandler  = "handler"
	pathLLM      = "llm"
	pathRejected = "rejected"
	pathFailure  = "failure"
	// pathNegotiation: a negotiation message answered through the negotiator.
	pathNegotiation = "negotiation"
)

type metrics struct {
	envelopes       *prometheus.CounterVec   // by path
	envelopeSeconds *prometheus.HistogramVec // by path
	routineFailures prometheus.Counter
	routineStops    *prometheus.CounterVec // by kind
	quarantines     prometheus.Counter
	llmCalls        *prometheus.CounterVec // by purpose
	llmTokens       *prometheus.CounterVec // by direction
	sends           *prometheus.CounterVec // by path
	steps           *prometheus.CounterVec // by executor
	connected       prometheus.Gauge
	negotiations    *prometheus.CounterVec // by outcome
	shadowRuns      *prometheus.CounterVec // by outcome
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		envelopes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "parley_dispatcher_envelopes_total",
			Help: "Inbound Agora envelopes by the path that answered them: routine, handler, llm, rejected, failure or negotiation.",
		}, []string{"path"}),
		envelopeSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "parley_dispatcher_envelope_duration_seconds",
			Help:    "Time to answer an inbound envelope, by path.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"path"}),
		routineFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "parley_dispatcher_routine_failures_total",
			Help: "Routine runs that failed: errors, budget overruns and schema-invalid output.",
		}),
		routineStops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "parley_dispatcher_routine_kills_total",
			Help: "Routine runs (envelopes, steps, shadow and test runs) stopped by a budget or killed at the worker boundary, by kind: time, memory, output or steps.",
		}, []string{"kind"}),
		quarantines: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "parley_dispatcher_routine_quarantines_total",
			Help: "Routines quarantined after consecutive failures.",
		}),
		llmCalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "parley_dispatcher_llm_calls_total",
			Help: "LLM calls made by the dispatcher, by purpose.",
		}, []string{"purpose"}),
		llmTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "parley_dispatcher_llm_tokens_total",
			Help: "LLM tokens used by the dispatcher's calls, when the provider reports them, by direction (input, output).",
		}, []string{"direction"}),
		sends: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "parley_dispatcher_sends_total",
			Help: "Outbound queries by path: routine, llm or text.",
		}, []string{"path"}),
		steps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "parley_dispatcher_steps_total",
			Help: "Agent Protocol steps executed, by executor: handler, routine or llm.",
		}, []string{"executor"}),
		connected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "parley_dispatcher_connected_agents",
			Help: "SDK agent streams currently connected.",
		}),
		negotiations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "parley_dispatcher_negotiations_total",
			Help: "Negotiations this side started from Send, by outcome: accepted or failed.",
		}, []string{"outcome"}),
		shadowRuns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "parley_dispatcher_shadow_runs_total",
			Help: "Shadow runs of LLM-written routine candidates beside the LLM, by outcome: agreed, disagreed, promoted (agreed and installed), conflict (promoted but not installed: it clashes with the installed routine), skipped (every shadow worker busy) or error (not compared, or an install that may succeed later).",
		}, []string{"outcome"}),
	}
	if reg != nil {
		reg.MustRegister(m.envelopes, m.envelopeSeconds, m.routineFailures, m.routineStops, m.quarantines, m.llmCalls, m.llmTokens, m.sends, m.steps, m.connected, m.negotiations, m.shadowRuns)
	}
	for _, k := range []routine.Kind{routine.KindTime, routine.KindMemory, routine.KindOutput, routine.KindSteps} {
		m.routineStops.WithLabelValues(k.String())
	}
	for _, p := range []string{pathRoutine, pathHandler, pathLLM, pathRejected, pathFailure, pathNegotiation} {
		m.envelopes.WithLabelValues(p)
	}
	return m
}
