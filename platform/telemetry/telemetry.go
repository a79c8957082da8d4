// Package telemetry holds the cross-cutting concerns applied to every call,
// on both transports: structured logging, Prometheus metrics and panic
// recovery. For gRPC they are interceptors; for HTTP (the in-process gateway
// and hand-written routes) they are one middleware. A metric or log line
// looks the same whichever path a call took.
package telemetry

import (
	"io"
	"log/slog"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// NewLogger returns a JSON slog logger tagged with service. level is one of
// debug, info, warn, error.
func NewLogger(w io.Writer, service, level string) *slog.Logger {
	var lv slog.Level
	switch strings.ToLower(level) {
	case "debug":
		lv = slog.LevelDebug
	case "warn":
		lv = slog.LevelWarn
	case "error":
		lv = slog.LevelError
	default:
		lv = slog.LevelInfo
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: lv})).With(slog.String("service", service))
}

// Metrics are the per-call metrics shared by the gRPC and HTTP paths.
type Metrics struct {
	rpcSeconds  *prometheus.HistogramVec
	httpSeconds *prometheus.HistogramVec
	panics      prometheus.Counter
}

// NewMetrics registers Parley's call metrics, plus the Go and process
// collectors, on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		rpcSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "parley_grpc_server_handling_seconds",
			Help:    "Latency of gRPC calls handled, by method and status code.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10),
		}, []string{"method", "code"}),
		httpSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "parley_http_server_request_seconds",
			Help:    "Latency of HTTP requests handled, by route pattern, method and status code.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10),
		}, []string{"route", "method", "code"}),
		panics: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "parley_server_panics_total",
			Help: "Panics recovered in handlers, on either transport.",
		}),
	}
	reg.MustRegister(m.rpcSeconds, m.httpSeconds, m.panics,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}
