package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/metadata"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/grpcclient"
	"github.com/parleyhq/parley/sdk"
)

// BenchmarkAuthUnary measures one unary RPC (GetAgent over loopback gRPC)
// on `parley serve` with access control off, and on, called with the
// agent's own key: the key is checked against the registry's store and the
// policy on every call. Compare the two in the same run (docs/benchmarks.md).
func BenchmarkAuthUnary(b *testing.B) {
	for _, mode := range []string{"off", "key"} {
		b.Run(mode, func(b *testing.B) {
			dir := b.TempDir()
			args := []string{"--data", dir, "--log-level", "error", "--auth=" + map[string]string{"off": "false", "key": "true"}[mode]}
			cfg, err := loadSuiteConfig(env{getenv: noEnv, stdout: io.Discard}, args)
			if err != nil {
				b.Fatal(err)
			}
			addr := runSuite(b, cfg)
			op, err := os.ReadFile(filepath.Join(dir, "operator.token"))
			if err != nil {
				b.Fatal(err)
			}
			admin, err := grpcclient.Dial(addr, grpcclient.Options{Token: strings.TrimSpace(string(op))})
			if err != nil {
				b.Fatal(err)
			}
			defer admin.Close()
			a, err := registryv1.NewRegistryServiceClient(admin).CreateAgent(b.Context(), &registryv1.CreateAgentRequest{Parent: "clients/acme", AgentId: "bot", Agent: &registryv1.Agent{}})
			if err != nil {
				b.Fatal(err)
			}
			conn, err := grpcclient.Dial(addr, grpcclient.Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			c := registryv1.NewRegistryServiceClient(conn)
			ctx := b.Context()
			if mode == "key" {
				ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+a.GetInitialKey().GetSecret())
			}
			req := &registryv1.GetAgentRequest{Name: a.GetName()}
			for b.Loop() {
				if _, err := c.GetAgent(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkAuthSDKRoundTrip measures one step through an SDK agent: an
// ExecuteStep call (the tasks service's, made here directly over loopback
// gRPC) that the dispatcher sends down the agent's Connect stream and
// whose result comes back up it. `off` runs with --auth=false; `key` with
// access control on, the agent connected with its own key (its stream
// re-verified every 2 s) and the call made with the operator token, as the
// tasks service makes it. Compare the two in the same run
// (docs/benchmarks.md).
func BenchmarkAuthSDKRoundTrip(b *testing.B) {
	for _, mode := range []string{"off", "key"} {
		b.Run(mode, func(b *testing.B) {
			dir := b.TempDir()
			args := []string{"--data", dir, "--log-level", "error", "--auth=" + map[string]string{"off": "false", "key": "true"}[mode]}
			cfg, err := loadSuiteConfig(env{getenv: noEnv, stdout: io.Discard}, args)
			if err != nil {
				b.Fatal(err)
			}
			addr := runSuite(b, cfg)
			op, err := os.ReadFile(filepath.Join(dir, "operator.token"))
			if err != nil {
				b.Fatal(err)
			}
			token := strings.TrimSpace(string(op))
			admin, err := grpcclient.Dial(addr, grpcclient.Options{Token: token})
			if err != nil {
				b.Fatal(err)
			}
			defer admin.Close()
			a, err := registryv1.NewRegistryServiceClient(admin).CreateAgent(b.Context(), &registryv1.CreateAgentRequest{Parent: "clients/acme", AgentId: "bot", Agent: &registryv1.Agent{}})
			if err != nil {
				b.Fatal(err)
			}
			conn, err := grpcclient.Dial(addr, grpcclient.Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			handlers := []sdk.Handler{sdk.Steps(func(_ context.Context, s sdk.Step) (sdk.StepResult, error) {
				return sdk.StepResult{Output: s.Input}, nil
			})}
			if mode == "key" {
				handlers = append(handlers, sdk.Key(a.GetInitialKey().GetSecret()))
			}
			ready := make(chan struct{})
			ctx, cancel := context.WithCancel(b.Context())
			done := make(chan error, 1)
			go func() {
				done <- sdk.Connect(ctx, conn, a.GetName(), append(handlers, sdk.OnReady(func() { close(ready) }))...)
			}()
			defer func() {
				cancel()
				if err := <-done; err != nil {
					b.Logf("Connect after cancel: %v", err)
				}
			}()
			select {
			case <-ready:
			case err := <-done:
				b.Fatalf("Connect ended before ready: %v", err)
			}
			disp := dispatcherv1.NewDispatcherServiceClient(admin)
			req := &dispatcherv1.ExecuteStepRequest{Agent: a.GetName(), TaskId: "t1", StepId: "s1", Input: "ping"}
			for b.Loop() {
				resp, err := disp.ExecuteStep(b.Context(), req)
				if err != nil || resp.GetOutput() != "ping" {
					b.Fatalf("ExecuteStep = %v, %v; want the echo", resp, err)
				}
			}
		})
	}
}
