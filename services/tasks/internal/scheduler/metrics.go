package scheduler

import "github.com/prometheus/client_golang/prometheus"

// metrics are the scheduler's own Prometheus collectors.
type metrics struct {
	attempts *prometheus.CounterVec
}

func newMetrics() *metrics {
	return &metrics{
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "parley_tasks_step_attempts_total",
			Help: "Step executions handed to the agent, by result: completed, waiting (the agent, dispatcher or LLM is down; retried), retrying (the step failed; retried) or failed (given up).",
		}, []string{"result"}),
	}
}

// Collectors returns the scheduler's metrics for registration.
func (s *Scheduler) Collectors() []prometheus.Collector {
	return []prometheus.Collector{
		s.metrics.attempts,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "parley_tasks_waiting_steps",
			Help: "Steps stored as created and not running: queued for an attempt, on their agent's waiting list, or backing off after a failure.",
		}, func() float64 {
			s.mu.Lock()
			defer s.mu.Unlock()
			return float64(len(s.queued) - len(s.running))
		}),
	}
}
