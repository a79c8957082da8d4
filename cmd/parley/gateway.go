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
		"parley gateway --http-addr :8080 --registry-addr 127.0.0.1:9091 --dispatcher-addr 127.0.0.1:9092 --negotiator-addr 127.0.0.1:9093 --tasks-addr 127.0.0.1:9094",
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
	srv, err := serve.New(f.Options(logger))
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	// The gateway forwards each caller's own credential and sends no
	// token of its own, so only the TLS side of PeerOptions applies.
	tlsOnly := f
	tlsOnly.Auth = false
	peer, err := serve.PeerOptions(tlsOnly)
	if err != nil {
		return err
	}
	mounts := []struct {
		svc, health string
		register    func(context.Context, *serve.Server, *grpc.ClientConn) error
	}{
		{"registry", registryapp.ServiceName, registryapp.RegisterGateway},
		{"dispatcher", dispatcherapp.ServiceName, func(ctx context.Context, s *serve.Server, conn *grpc.ClientConn) error {
			return dispatcherapp.RegisterGateway(ctx, s, conn, dispatcher)
		}},
		{"negotiator", negotiatorapp.ServiceName, negotiatorapp.RegisterGateway},
		{"tasks", tasksapp.ServiceName, func(ctx context.Context, s *serve.Server, conn *grpc.ClientConn) error {
			return tasksapp.RegisterGateway(ctx, s, conn, tasks)
		}},
	}
	var conns []*grpc.ClientConn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for _, m := range mounts {
		conn, err := grpcclient.Dial(*addrs[m.svc], peer)
		if err != nil {
			return fmt.Errorf("--%s-addr: %w", m.svc, err)
		}
		conns = append(conns, conn)
		if err := m.register(ctx, srv, conn); err != nil {
			return err
		}
		srv.AddReadinessCheck(m.svc, serve.PeerCheck(conn, m.health))
	}
	err = serve.ListenAndRun(ctx, srv, f)
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}
