package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/metadata"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/grpcclient"
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
