package serve

import (
	"context"
	"fmt"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// PeerCheck returns a readiness check that asks a peer's grpc.health.v1
// whether the server holding service is up. It checks the server-wide ""
// entry, not the service's own entry: that one follows the peer's own
// readiness (see watchReadiness), so one store outage would otherwise
// take every caller down the chain out of service with it. service names
// the peer in errors.
func PeerCheck(conn grpc.ClientConnInterface, service string) func(context.Context) error {
	client := healthpb.NewHealthClient(conn)
	return func(ctx context.Context) error {
		resp, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			return fmt.Errorf("%s unreachable: %w", service, err)
		}
		if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			return fmt.Errorf("%s is %s", service, resp.GetStatus())
		}
		return nil
	}
}
