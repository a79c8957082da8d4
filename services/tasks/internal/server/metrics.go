package server

import "github.com/prometheus/client_golang/prometheus"

// metrics are the server's own Prometheus collectors; app registers them on
// the serving registry.
type metrics struct {
	attempts *prometheus.CounterVec
}

func newMetrics() *metrics {
	return &metrics{
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "parley_tasks_step_attempts_total",
			Help: "Step executions handed to the dispatcher, by result: completed, or waiting (no executor, dispatcher down, ...; retried).",
		}, []string{"result"}),
	}
}

// Collectors returns the server's metrics for registration.
func (s *Server) Collectors() []prometheus.Collector {
	return []prometheus.Collector{
		s.metrics.attempts,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "parley_tasks_waiting_steps",
			Help: "Steps waiting for an executor (stored as created, on their agent's waiting list).",
		}, func() float64 {
			s.exec.mu.Lock()
			defer s.exec.mu.Unlock()
			n := 0
			for _, w := range s.exec.agents {
				n += len(w.steps)
			}
			return float64(n)
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "parley_tasks_event_streams",
			Help: "Open task event streams (SSE and WatchTask).",
		}, func() float64 {
			s.hub.mu.Lock()
			defer s.hub.mu.Unlock()
			return float64(s.hub.n)
		}),
	}
}
