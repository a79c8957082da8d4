package server

import (
	"context"

	"google.golang.org/grpc/codes"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/auth"
	"github.com/parleyhq/parley/platform/grpcerr"
)

const reasonNoAccessControl = "ACCESS_CONTROL_OFF"

// GetCaller implements RegistryService. The policy refuses anonymous
// callers before it runs; without access control no principal exists to
// describe, which is FAILED_PRECONDITION rather than a made-up identity.
func (s *Server) GetCaller(ctx context.Context, _ *registryv1.GetCallerRequest) (*registryv1.Caller, error) {
	p, ok := auth.FromContext(ctx)
	if !ok || p.Kind == auth.Anonymous {
		return nil, grpcerr.New(codes.FailedPrecondition, "this server runs without access control (--auth=false), so a call has no caller identity", reasonNoAccessControl, Domain, nil)
	}
	c := &registryv1.Caller{Client: p.Client, Agent: p.Agent, Key: p.Key}
	switch p.Kind {
	case auth.Agent:
		c.Kind = registryv1.PrincipalKind_PRINCIPAL_KIND_AGENT
	case auth.Client:
		c.Kind = registryv1.PrincipalKind_PRINCIPAL_KIND_CLIENT
	case auth.Operator:
		c.Kind = registryv1.PrincipalKind_PRINCIPAL_KIND_OPERATOR
	}
	return c, nil
}
