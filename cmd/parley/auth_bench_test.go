package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	negotiatorv1 "github.com/parleyhq/parley/gen/parley/negotiator/v1"
	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/auth"
	"github.com/parleyhq/parley/platform/grpcclient"
	"github.com/parleyhq/parley/platform/serve"
	"github.com/parleyhq/parley/sdk"
	negotiatorapp "github.com/parleyhq/parley/services/negotiator/app"
	negotiatorconfig "github.com/parleyhq/parley/services/negotiator/config"
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

// BenchmarkKeyCheckCache measures checking an agent's key at a registry in
// another server, as the dispatcher, the negotiator, the tasks service and
// `parley gateway` do when run as their own processes: IntrospectKey over
// loopback gRPC to a `parley serve`, with the answer cached for
// auth.IntrospectionTTL (`cached`) or asked on every call (`uncached`).
// `check/...` is the key check alone; `rpc/...` is one authenticated
// unary RPC (GetCostSummary) on a negotiator that checks the caller's key
// that way. Compare cached with uncached in the same run
// (docs/benchmarks.md).
func BenchmarkKeyCheckCache(b *testing.B) {
	dir := b.TempDir()
	cfg, err := loadSuiteConfig(env{getenv: noEnv, stdout: io.Discard}, []string{"--data", dir, "--log-level", "error"})
	if err != nil {
		b.Fatal(err)
	}
	addr := runSuite(b, cfg)
	op, err := os.ReadFile(filepath.Join(dir, "operator.token"))
	if err != nil {
		b.Fatal(err)
	}
	asService, err := grpcclient.Dial(addr, grpcclient.Options{Token: strings.TrimSpace(string(op))})
	if err != nil {
		b.Fatal(err)
	}
	defer asService.Close()
	reg := registryv1.NewRegistryServiceClient(asService)
	a, err := reg.CreateAgent(b.Context(), &registryv1.CreateAgentRequest{Parent: "clients/acme", AgentId: "bot", Agent: &registryv1.Agent{}})
	if err != nil {
		b.Fatal(err)
	}
	key := a.GetInitialKey().GetSecret()
	introspect := func(ctx context.Context, secret string) (proto.Message, error) {
		return reg.IntrospectKey(ctx, &registryv1.IntrospectKeyRequest{Secret: secret})
	}
	ttls := []struct {
		name string
		ttl  time.Duration
	}{{"uncached", 0}, {"cached", auth.IntrospectionTTL}}
	for _, tc := range ttls {
		b.Run("check/"+tc.name, func(b *testing.B) {
			v := auth.Introspector(introspect, tc.ttl, nil)
			for b.Loop() {
				if p, err := v.VerifyKey(b.Context(), key); err != nil || p.Agent != a.GetName() {
					b.Fatalf("VerifyKey = %+v, %v; want %s", p, err, a.GetName())
				}
			}
		})
	}
	for _, tc := range ttls {
		b.Run("rpc/"+tc.name, func(b *testing.B) {
			negAddr := startKeyCheckingNegotiator(b, auth.Introspector(introspect, tc.ttl, nil))
			conn, err := grpcclient.Dial(negAddr, grpcclient.Options{Token: key})
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			neg := negotiatorv1.NewNegotiatorServiceClient(conn)
			req := &negotiatorv1.GetCostSummaryRequest{Agent: a.GetName()}
			for b.Loop() {
				if _, err := neg.GetCostSummary(b.Context(), req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// startKeyCheckingNegotiator runs a negotiator with access control on,
// checking keys with v, on loopback, and returns its gRPC address.
func startKeyCheckingNegotiator(b *testing.B, v auth.Verifier) string {
	b.Helper()
	dir := b.TempDir()
	cfg, err := negotiatorconfig.Load([]string{"--data", dir, "--registry-addr", ""}, noEnv)
	if err != nil {
		b.Fatal(err)
	}
	logger := slog.New(slog.DiscardHandler)
	a, err := negotiatorapp.New(cfg, logger)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { a.Close() })
	srv, err := serve.New(serve.Options{Logger: logger, Policy: auth.ParleyPolicy(), DataDir: dir})
	if err != nil {
		b.Fatal(err)
	}
	srv.SetKeyVerifier(v)
	ctx, cancel := context.WithCancel(context.Background())
	if err := a.Register(ctx, srv); err != nil {
		b.Fatal(err)
	}
	grpcLis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	httpLis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, grpcLis, httpLis) }()
	b.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			b.Errorf("Run: %v", err)
		}
	})
	return grpcLis.Addr().String()
}
