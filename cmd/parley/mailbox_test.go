package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/platform/grpcclient"
)

// TestMailbox_anAgentKeyReachesOnlyItsOwnMailbox: ReceiveMessages,
// AcknowledgeMessages and the SSE route refuse another agent's mailbox,
// a client key and no key, in `parley serve` with real keys.
func TestMailbox_anAgentKeyReachesOnlyItsOwnMailbox(t *testing.T) {
	dir := t.TempDir()
	cfg, err := loadSuiteConfig(env{getenv: noEnv, stdout: io.Discard}, []string{"--data", dir})
	if err != nil {
		t.Fatal(err)
	}
	_, addr, base := startSuite(t, cfg)
	op, err := os.ReadFile(filepath.Join(dir, "operator.token"))
	if err != nil {
		t.Fatal(err)
	}
	must := func(token string, args ...string) string {
		t.Helper()
		var stdout bytes.Buffer
		getenv := func(k string) string { return map[string]string{"PARLEY_SERVER": addr, "PARLEY_TOKEN": token}[k] }
		if err := run(args, getenv, &stdout, io.Discard); err != nil {
			t.Fatalf("parley %q: %v", args, err)
		}
		return strings.TrimSpace(stdout.String())
	}
	acmeKey := must(strings.TrimSpace(string(op)), "client", "create", "acme")
	aliceKey := must(acmeKey, "agent", "create", "acme:alice")
	must(acmeKey, "agent", "create", "acme:bob")
	const alice, bob = "clients/acme/agents/alice", "clients/acme/agents/bob"

	dispatcher := func(token string) dispatcherv1.DispatcherServiceClient {
		conn, err := grpcclient.Dial(addr, grpcclient.Options{Token: token})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return dispatcherv1.NewDispatcherServiceClient(conn)
	}
	receive := func(c dispatcherv1.DispatcherServiceClient, agent string) error {
		s, err := c.ReceiveMessages(t.Context(), &dispatcherv1.ReceiveMessagesRequest{Agent: agent})
		if err != nil {
			return err
		}
		_, err = s.Recv() // the first (empty) batch, or the refusal
		return err
	}
	acknowledge := func(c dispatcherv1.DispatcherServiceClient, agent string) error {
		_, err := c.AcknowledgeMessages(t.Context(), &dispatcherv1.AcknowledgeMessagesRequest{Agent: agent, ClearBacklog: true})
		return err
	}
	sse := func(token, agent string) int {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, base+"/v1/"+agent+"/messages:stream", nil)
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		resp, err := http.DefaultClient.Do(req.WithContext(ctx))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		return resp.StatusCode
	}
	asAlice, asClient, asNobody := dispatcher(aliceKey), dispatcher(acmeKey), dispatcher("")
	grpcCases := []struct {
		name string
		err  error
		want codes.Code
	}{
		{"receive own", receive(asAlice, alice), codes.OK},
		{"receive another agent's", receive(asAlice, bob), codes.PermissionDenied},
		{"receive with the client's key", receive(asClient, alice), codes.PermissionDenied},
		{"receive with no key", receive(asNobody, alice), codes.Unauthenticated},
		{"acknowledge own", acknowledge(asAlice, alice), codes.OK},
		{"acknowledge another agent's", acknowledge(asAlice, bob), codes.PermissionDenied},
		{"acknowledge with the client's key", acknowledge(asClient, alice), codes.PermissionDenied},
	}
	for _, tt := range grpcCases {
		if status.Code(tt.err) != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, tt.err, tt.want)
		}
	}
	httpCases := []struct {
		name, token, agent string
		want               int
	}{
		{"SSE own", aliceKey, alice, http.StatusOK},
		{"SSE another agent's", aliceKey, bob, http.StatusForbidden},
		{"SSE with the client's key", acmeKey, alice, http.StatusForbidden},
		{"SSE with no key", "", alice, http.StatusUnauthorized},
	}
	for _, tt := range httpCases {
		if got := sse(tt.token, tt.agent); got != tt.want {
			t.Errorf("%s: GET stream = %d, want %d", tt.name, got, tt.want)
		}
	}
}
