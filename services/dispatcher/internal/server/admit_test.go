package server

import (
	"context"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/auth"
)

// principalStream stands in for platform/auth's interceptor: it puts the
// principal named by the test's x-test-principal header in the context.
func principalStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	md, _ := metadata.FromIncomingContext(ss.Context())
	p := auth.Principal{Kind: auth.Operator}
	if v := md.Get("x-test-principal"); len(v) > 0 {
		p = auth.Principal{Kind: auth.Agent, Agent: v[0]}
	}
	return h(srv, &ctxStream{ss, auth.WithPrincipal(ss.Context(), p)})
}

type ctxStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (c *ctxStream) Context() context.Context { return c.ctx }

func TestConnect_boundToTheKeysAgent(t *testing.T) {
	reg := newFakeRegistry()
	reg.addAgent(&registryv1.Agent{Name: weatherAgent})
	e := startEnv(t, reg, "", Options{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.StreamInterceptor(principalStream))
	dispatcherv1.RegisterDispatcherServiceServer(gs, e.srv)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	client := dispatcherv1.NewDispatcherServiceClient(conn)

	hello := func(as, agent string) error {
		ctx := t.Context()
		if as != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, "x-test-principal", as)
		}
		stream, err := client.Connect(ctx)
		if err != nil {
			return err
		}
		if err := stream.Send(&dispatcherv1.ConnectRequest{Kind: &dispatcherv1.ConnectRequest_Hello{Hello: &dispatcherv1.AgentHello{Agent: agent}}}); err != nil {
			return err
		}
		m, err := stream.Recv()
		if err == nil && m.GetReady() == nil {
			t.Errorf("first message = %v, want ready", m)
		}
		return err
	}
	missing := "clients/acme/agents/nobody"
	tests := []struct {
		name, as, agent string
		want            codes.Code
	}{
		{"own agent", weatherAgent, weatherAgent, codes.OK},
		{"another agent", "clients/acme/agents/other", weatherAgent, codes.PermissionDenied},
		{"own key, agent deleted", missing, missing, codes.PermissionDenied},
		{"operator, existing agent", "", weatherAgent, codes.OK},
		{"operator, missing agent", "", missing, codes.PermissionDenied},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := hello(tt.as, tt.agent); status.Code(err) != tt.want {
				t.Errorf("Connect(as %q, hello %q) = %v, want %v", tt.as, tt.agent, err, tt.want)
			}
		})
	}
}
