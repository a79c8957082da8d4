package e2e

import (
	"context"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/parleyhq/parley/e2e/parleytest"
	negotiatorv1 "github.com/parleyhq/parley/gen/parley/negotiator/v1"
	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	tasksv1 "github.com/parleyhq/parley/gen/parley/tasks/v1"
)

// TestSeparateProcesses_authOnByDefault runs the registry, the negotiator
// and the tasks service as their own binaries with no --auth flag, only the
// shared --operator-token-file: access control is on, and the negotiator
// and the tasks service accept an agent's key, checked at the registry,
// for that agent alone. A binary given no token file refuses to start and
// names the flag.
func TestSeparateProcesses_authOnByDefault(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts three binaries")
	}
	for _, svc := range []string{"registry", "negotiator", "dispatcher", "tasks"} {
		ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second) // generous: it exits at once
		out, err := exec.CommandContext(ctx, parleytest.Build(t, "github.com/parleyhq/parley/services/"+svc+"/cmd/"+svc),
			"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--data", t.TempDir()).CombinedOutput()
		cancel()
		if err == nil || !strings.Contains(string(out), "--operator-token-file") {
			t.Errorf("%s without --operator-token-file = %v, want it to refuse to start naming the flag:\n%s", svc, err, out)
		}
	}

	tokenFile := parleytest.OperatorTokenFile(t)
	start := func(svc string, args ...string) *parleytest.Server {
		return parleytest.StartProcess(t, parleytest.Build(t, "github.com/parleyhq/parley/services/"+svc+"/cmd/"+svc),
			append([]string{"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--data", t.TempDir(), "--operator-token-file", tokenFile}, args...)...)
	}
	reg := start("registry")
	neg := start("negotiator", "--registry-addr", reg.GRPCAddr)
	tasks := start("tasks", "--registry-addr", reg.GRPCAddr, "--dispatcher-addr", "127.0.0.1:1") // the dispatcher is not used here
	dial := func(addr string, opts ...grpc.DialOption) *grpc.ClientConn {
		t.Helper()
		conn, err := grpc.NewClient(addr, append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	ctx := t.Context()
	admin := registryv1.NewRegistryServiceClient(dial(reg.GRPCAddr, grpc.WithPerRPCCredentials(parleytest.Bearer(t))))
	bot, err := admin.CreateAgent(ctx, &registryv1.CreateAgentRequest{Parent: "clients/acme", AgentId: "bot", Agent: &registryv1.Agent{}})
	if err != nil {
		t.Fatal(err)
	}
	asBot := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+bot.GetInitialKey().GetSecret())
	other := "clients/acme/agents/other"

	if _, err := registryv1.NewRegistryServiceClient(dial(reg.GRPCAddr)).CreateAgent(ctx, &registryv1.CreateAgentRequest{Parent: "clients/acme", AgentId: "x", Agent: &registryv1.Agent{}}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("anonymous CreateAgent on the registry binary = %v, want UNAUTHENTICATED (auth on by default)", err)
	}

	ledger := negotiatorv1.NewNegotiatorServiceClient(dial(neg.GRPCAddr))
	if _, err := ledger.GetCostSummary(ctx, &negotiatorv1.GetCostSummaryRequest{Agent: bot.GetName()}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("anonymous GetCostSummary on the negotiator binary = %v, want UNAUTHENTICATED", err)
	}
	if _, err := ledger.GetCostSummary(asBot, &negotiatorv1.GetCostSummaryRequest{Agent: bot.GetName()}); err != nil {
		t.Errorf("GetCostSummary of its own agent with the agent's key on the negotiator binary: %v\n%s", err, neg.Log)
	}
	if _, err := ledger.GetCostSummary(asBot, &negotiatorv1.GetCostSummaryRequest{Agent: other}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("GetCostSummary of another agent with bot's key = %v, want PERMISSION_DENIED", err)
	}

	tc := tasksv1.NewTasksServiceClient(dial(tasks.GRPCAddr))
	if _, err := tc.ListTasks(ctx, &tasksv1.ListTasksRequest{Agent: bot.GetName()}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("anonymous ListTasks on the tasks binary = %v, want UNAUTHENTICATED", err)
	}
	if _, err := tc.ListTasks(asBot, &tasksv1.ListTasksRequest{Agent: bot.GetName()}); err != nil {
		t.Errorf("ListTasks of its own agent with the agent's key on the tasks binary: %v\n%s", err, tasks.Log)
	}
	if _, err := tc.ListTasks(asBot, &tasksv1.ListTasksRequest{Agent: other}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("ListTasks of another agent with bot's key = %v, want PERMISSION_DENIED", err)
	}
}

// TestSeparateProcesses_gatewayTokenMode: `parley gateway` in front of the
// registry and tasks processes applies an agent's Agent Protocol access as
// `parley serve` does. A `token` agent's routes refuse a call without a
// key (401) and with another agent's key (403), and accept its own key; a
// public agent's accept anyone. The gateway calls the tasks service as
// itself for these routes, and checks keys at the registry.
func TestSeparateProcesses_gatewayTokenMode(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts three binaries")
	}
	tokenFile := parleytest.OperatorTokenFile(t)
	start := func(svc string, args ...string) *parleytest.Server {
		return parleytest.StartProcess(t, parleytest.Build(t, "github.com/parleyhq/parley/services/"+svc+"/cmd/"+svc),
			append([]string{"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--data", t.TempDir(), "--operator-token-file", tokenFile}, args...)...)
	}
	reg := start("registry")
	tasks := start("tasks", "--registry-addr", reg.GRPCAddr, "--dispatcher-addr", "127.0.0.1:1") // creating a task needs no dispatcher
	gw := parleytest.StartProcess(t, parleytest.Binary(t), "gateway", "--http-addr", "127.0.0.1:0", "--operator-token-file", tokenFile,
		"--registry-addr", reg.GRPCAddr, "--tasks-addr", tasks.GRPCAddr, "--dispatcher-addr", "127.0.0.1:1", "--negotiator-addr", "127.0.0.1:1")

	conn, err := grpc.NewClient(reg.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(parleytest.Bearer(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	admin := registryv1.NewRegistryServiceClient(conn)
	ctx := t.Context()
	keys := map[string]string{}
	for _, id := range []string{"locked", "public", "other"} {
		a, err := admin.CreateAgent(ctx, &registryv1.CreateAgentRequest{Parent: "clients/acme", AgentId: id, Agent: &registryv1.Agent{}})
		if err != nil {
			t.Fatal(err)
		}
		keys[id] = a.GetInitialKey().GetSecret()
	}
	if _, err := admin.UpdateAgent(ctx, &registryv1.UpdateAgentRequest{Agent: &registryv1.Agent{Name: "clients/acme/agents/locked", AgentProtocolAccess: registryv1.AgentProtocolAccess_AGENT_PROTOCOL_ACCESS_TOKEN}}); err != nil {
		t.Fatal(err)
	}
	post := func(agent, key string) int {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, "POST", gw.URL("/agents/acme/"+agent+"/ap/v1/agent/tasks"), strings.NewReader(`{"input":"hi"}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, c := range []struct {
		name, agent, key string
		want             int
	}{
		{"token agent, no key", "locked", "", http.StatusUnauthorized},
		{"token agent, another agent's key", "locked", keys["other"], http.StatusForbidden},
		{"token agent, a forged key", "locked", keys["locked"][:len(keys["locked"])-2] + "xx", http.StatusUnauthorized},
		{"token agent, its own key", "locked", keys["locked"], http.StatusOK},
		{"public agent, no key", "public", "", http.StatusOK},
	} {
		if got := post(c.agent, c.key); got != c.want {
			t.Errorf("POST a task through the gateway, %s = %d, want %d\n%s", c.name, got, c.want, gw.Log)
		}
	}
}
