package e2e

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/parleyhq/parley/e2e/parleytest"
	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
)

// TestSeparateProcesses_gatewayServesMailboxSSE runs the registry, the
// dispatcher and `parley gateway` as three processes, all with access
// control on. An agent reads its mailbox over server-sent events through
// the gateway with its own key, which the gateway checks and forwards (the
// dispatcher checks it again); another agent's key is refused, and so is
// no key.
func TestSeparateProcesses_gatewayServesMailboxSSE(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts three binaries")
	}
	tokenFile := parleytest.OperatorTokenFile(t)
	reg := parleytest.StartProcess(t, parleytest.Build(t, "github.com/parleyhq/parley/services/registry/cmd/registry"),
		"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--data", t.TempDir(),
		"--auth", "--operator-token-file", tokenFile)
	disp := parleytest.StartProcess(t, parleytest.Build(t, "github.com/parleyhq/parley/services/dispatcher/cmd/dispatcher"),
		"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--data", t.TempDir(),
		"--auth", "--operator-token-file", tokenFile,
		"--registry-addr", reg.GRPCAddr, "--negotiator-addr", "127.0.0.1:1") // the negotiator is not used here
	gw := parleytest.StartProcess(t, parleytest.Binary(t), "gateway",
		"--http-addr", "127.0.0.1:0", "--registry-addr", reg.GRPCAddr, "--dispatcher-addr", disp.GRPCAddr,
		"--negotiator-addr", "127.0.0.1:1", "--tasks-addr", "127.0.0.1:1",
		"--operator-token-file", tokenFile)

	dial := func(addr string) *grpc.ClientConn {
		t.Helper()
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(parleytest.Bearer(t)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	ctx := t.Context()
	admin := registryv1.NewRegistryServiceClient(dial(reg.GRPCAddr))
	keys := map[string]string{}
	for _, id := range []string{"alice", "bob"} {
		a, err := admin.CreateAgent(ctx, &registryv1.CreateAgentRequest{Parent: "clients/acme", AgentId: id, Agent: &registryv1.Agent{}})
		if err != nil {
			t.Fatal(err)
		}
		keys[id] = a.GetInitialKey().GetSecret()
		if _, err := admin.JoinClientGroup(ctx, &registryv1.JoinClientGroupRequest{Name: a.GetName()}); err != nil {
			t.Fatal(err)
		}
	}
	// The operator sends as alice; the dispatcher may still be reaching
	// the registry, so the send is retried for a bounded while.
	send := dispatcherv1.NewDispatcherServiceClient(dial(disp.GRPCAddr))
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := send.SendMessage(ctx, &dispatcherv1.SendMessageRequest{
			Sender: "clients/acme/agents/alice", To: &dispatcherv1.DistributionList{Direct: []string{"clients/acme/agents/bob"}},
			MessageType: "new_message", BodyJson: `"over the gateway"`,
		})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("SendMessage on the dispatcher process: %v\n%s", err, disp.Log)
		}
		time.Sleep(200 * time.Millisecond)
	}

	stream := gw.URL("/v1/clients/acme/agents/bob/messages:stream")
	get := func(key string) *http.Response {
		t.Helper()
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		t.Cleanup(cancel)
		req, err := http.NewRequestWithContext(rctx, http.MethodGet, stream, nil)
		if err != nil {
			t.Fatal(err)
		}
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	for _, c := range []struct {
		name, key string
		want      int
	}{
		{"another agent's key", keys["alice"], http.StatusForbidden},
		{"no key", "", http.StatusUnauthorized},
	} {
		if resp := get(c.key); resp.StatusCode != c.want {
			t.Errorf("GET bob's stream via the gateway with %s = %d, want %d", c.name, resp.StatusCode, c.want)
		}
	}
	resp := get(keys["bob"])
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET bob's stream via the gateway with bob's key = %d, want 200\n%s", resp.StatusCode, gw.Log)
	}
	r := bufio.NewReader(resp.Body)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("reading bob's stream via the gateway: %v", err)
		}
		if strings.HasPrefix(line, "data: ") {
			if !strings.Contains(line, `"body":"over the gateway"`) || !strings.Contains(line, `"sender":"clients/acme/agents/alice"`) {
				t.Errorf("bob's first event via the gateway = %s, want alice's message", line)
			}
			break
		}
	}
}
