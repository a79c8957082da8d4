package serve

import (
	"context"
	"fmt"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// PeerCheck returns a readiness check that asks a peer's grpc.health.v1
// service whether service is SERVING.
func PeerCheck(conn grpc.ClientConnInterface, service string) func(context.Context) error {
	client := healthpb.NewHealthClient(conn)
	return func(ctx context.Context) error {
		resp, err := client.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
		if err != nil {
			return fmt.Errorf("%s unreachable: %w", service, err)
		}
		if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			return fmt.Errorf("%s is %s", service, resp.GetStatus())
		}
		return nil
	}
}
