package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/parleyhq/parley/platform/envflag"
	"github.com/parleyhq/parley/platform/grpcclient"
)

// healthDoc is the help of `parley health`.
var healthDoc = envflag.Doc{
	Usage:   "parley health [flags]",
	Summary: "Check a server's gRPC health (grpc.health.v1) or an HTTP URL; print the status and exit 0 when serving, 1 otherwise. Container health checks use it, since the images have no shell or curl.",
	Prefix:  "PARLEY_HEALTH_",
	Examples: []string{
		"parley health --server 127.0.0.1:9090",
		"parley health --url http://127.0.0.1:8080/readyz",
	},
}

// runHealth checks a server: over gRPC (grpc.health.v1, service "" by
// default) or over HTTP (any 2xx). Container health checks use it, since
// the images have no shell or curl.
func runHealth(e env, args []string) error {
	fs := flag.NewFlagSet("parley health", flag.ContinueOnError)
	fs.SetOutput(e.stdout)
	server := fs.String("server", "", "gRPC `address` to check")
	url := fs.String("url", "", "HTTP `URL` to check instead, e.g. http://127.0.0.1:8080/readyz")
	service := fs.String("service", "", "gRPC service `name` to check; empty means the whole server")
	timeout := fs.Duration("timeout", 3*time.Second, "how long to wait for an answer")
	if _, err := parseArgs(e, fs, args, healthDoc); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	switch {
	case *url != "":
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, *url, nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return fmt.Errorf("cannot reach %s (%s): check that the server runs, or change --url (or PARLEY_HEALTH_URL)", *url, reachCause(err.Error()))
		}
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			return fmt.Errorf("%s answered %s", *url, resp.Status)
		}
		fmt.Fprintln(e.stdout, "SERVING")
		return nil
	case *server != "":
		conn, err := grpcclient.Dial(*server, grpcclient.Options{})
		if err != nil {
			return err
		}
		defer conn.Close()
		resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: *service})
		if err != nil {
			if st, ok := status.FromError(err); ok && st.Code() == codes.Unavailable {
				return fmt.Errorf("cannot reach a server at %s (%s): check that it runs, or change --server (or PARLEY_HEALTH_SERVER)", *server, reachCause(st.Message()))
			}
			return fmt.Errorf("health check of %s: %w", *server, err)
		}
		fmt.Fprintln(e.stdout, resp.GetStatus())
		if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			return fmt.Errorf("%s is %s", *server, resp.GetStatus())
		}
		return nil
	default:
		return usageErrorf("parley health needs --server or --url")
	}
}
