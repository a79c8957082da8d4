package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/auth"
	"github.com/parleyhq/parley/platform/envflag"
	"github.com/parleyhq/parley/platform/grpcclient"
	"github.com/parleyhq/parley/platform/serve"
	"github.com/parleyhq/parley/platform/telemetry"
	dispatcherapp "github.com/parleyhq/parley/services/dispatcher/app"
	dispatcherconfig "github.com/parleyhq/parley/services/dispatcher/config"
	negotiatorapp "github.com/parleyhq/parley/services/negotiator/app"
	registryapp "github.com/parleyhq/parley/services/registry/app"
	tasksapp "github.com/parleyhq/parley/services/tasks/app"
	tasksconfig "github.com/parleyhq/parley/services/tasks/config"
)

// gatewayDoc is the help of `parley gateway`.
var gatewayDoc = envflag.Doc{
	Usage:   "parley gateway [flags]",
	Summary: "Serve the REST gateway (the /v1 routes and the Agent Protocol) in front of services running as separate processes, reaching each over gRPC.",
	Prefix:  "PARLEY_",
	Examples: []string{
		"parley gateway --http-addr :8080 --operator-token-file ./operator.token --registry-addr 127.0.0.1:9091 --dispatcher-addr 127.0.0.1:9092 --negotiator-addr 127.0.0.1:9093 --tasks-addr 127.0.0.1:9094",
	},
}

// runGateway serves the REST gateway for services running as separate
// processes, reaching each over gRPC.
func runGateway(e env, args []string) error {
	var f serve.Flags
	var tasks tasksconfig.Config
	var dispatcher dispatcherconfig.Config
	addrs := map[string]*string{}
	fs := flag.NewFlagSet("parley gateway", flag.ContinueOnError)
	fs.SetOutput(e.stdout)
	f.Register(fs, "127.0.0.1:0", ":8080", "")
	for _, svc := range []string{"registry", "dispatcher", "negotiator", "tasks"} {
		addrs[svc] = fs.String(svc+"-addr", "dns:///"+svc+":9090", "gRPC `address` of the "+svc+" service")
	}
	tasks.RegisterGatewayFlags(fs)
	dispatcher.RegisterGatewayFlags(fs)
	if _, err := parseArgs(e, fs, args, gatewayDoc); err != nil {
		return err
	}
	logger := telemetry.NewLogger(os.Stderr, "gateway", f.LogLevel)
	// Two connections per service. The REST routes forward each caller's
	// own credential, which the service checks, so they send no token of
	// their own: the caller's must never be joined by the operator's. The
	// public routes (Agora envelopes, the Agent Protocol) call as the
	// gateway itself, with the operator token when access control is on,
	// after the gateway's own check (an agent's `token` access among it).
	asService, err := serve.PeerOptions(f)
	if err != nil {
		return err
	}
	forwarding := asService
	forwarding.Token = ""
	srv, err := serve.New(f.Options(logger))
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	var conns []*grpc.ClientConn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	dial := func(svc string, o grpcclient.Options) (*grpc.ClientConn, error) {
		conn, err := grpcclient.Dial(*addrs[svc], o)
		if err != nil {
			return nil, fmt.Errorf("--%s-addr: %w", svc, err)
		}
		conns = append(conns, conn)
		return conn, nil
	}
	direct, service := map[string]*grpc.ClientConn{}, map[string]*grpc.ClientConn{}
	for _, svc := range []string{"registry", "dispatcher", "negotiator", "tasks"} {
		if direct[svc], err = dial(svc, forwarding); err != nil {
			return err
		}
		if service[svc], err = dial(svc, asService); err != nil {
			return err
		}
	}
	reg := registryv1.NewRegistryServiceClient(service["registry"])
	srv.SetKeyVerifier(auth.Introspector(func(ctx context.Context, secret string) (proto.Message, error) {
		return reg.IntrospectKey(ctx, &registryv1.IntrospectKeyRequest{Secret: secret})
	}, auth.IntrospectionTTL, nil))
	if err := registryapp.RegisterGateway(ctx, srv, direct["registry"], service["registry"]); err != nil {
		return err
	}
	if err := dispatcherapp.RegisterGateway(ctx, srv, direct["dispatcher"], service["dispatcher"], dispatcher); err != nil {
		return err
	}
	if err := negotiatorapp.RegisterGateway(ctx, srv, direct["negotiator"]); err != nil {
		return err
	}
	if err := tasksapp.RegisterGateway(ctx, srv, tasksapp.GatewayPeers{Tasks: direct["tasks"], Service: service["tasks"], Registry: service["registry"]}, tasks); err != nil {
		return err
	}
	for svc, health := range map[string]string{"registry": registryapp.ServiceName, "dispatcher": dispatcherapp.ServiceName, "negotiator": negotiatorapp.ServiceName, "tasks": tasksapp.ServiceName} {
		srv.AddReadinessCheck(svc, serve.PeerCheck(direct[svc], health))
	}
	err = serve.ListenAndRun(ctx, srv, f)
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}
