package server

import "github.com/prometheus/client_golang/prometheus"

// Collectors returns the server's metrics (the scheduler's and the event
// streams') for registration.
func (s *Server) Collectors() []prometheus.Collector {
	return append(s.sched.Collectors(),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "parley_tasks_event_streams",
			Help: "Open task event streams (SSE and WatchTask).",
		}, func() float64 {
			s.hub.mu.Lock()
			defer s.hub.mu.Unlock()
			return float64(s.hub.n)
		}),
	)
}
