package serve

import (
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/parleyhq/parley/platform/telemetry"
)

// NewTestMetrics returns metrics on a throwaway registry.
func NewTestMetrics() *telemetry.Metrics { return telemetry.NewMetrics(prometheus.NewRegistry()) }

func telemetryOptions(m *telemetry.Metrics, logger *slog.Logger) []grpc.ServerOption {
	return telemetry.ServerOptions(m, logger)
}
