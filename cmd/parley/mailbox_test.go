package main

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/grpcclient"
)

// TestMailbox_anAgentKeyReachesOnlyItsOwnMailbox: ReceiveMessages,
// AcknowledgeMessages and the SSE route refuse another agent's mailbox,
// a client key and no key, in `parley serve` with real keys.
func TestMailbox_anAgentKeyReachesOnlyItsOwnMailbox(t *testing.T) {
	s := startCLISuite(t)
	addr, base, must := s.addr, s.base, s.must(t)
	acmeKey := must(s.operator, "client", "create", "acme")
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

// TestListen: alice sends bob messages; `parley listen` with bob's key
// prints them as JSON lines and acknowledges them, so the next listen
// resumes after them; --count with a --timeout that passes first fails.
func TestListen(t *testing.T) {
	s := startCLISuite(t)
	addr, call, must := s.addr, s.call, s.must(t)
	acmeKey := must(s.operator, "client", "create", "acme")
	aliceKey := must(acmeKey, "agent", "create", "acme:alice")
	bobKey := must(acmeKey, "agent", "create", "acme:bob")
	const alice, bob = "clients/acme/agents/alice", "clients/acme/agents/bob"
	for name, key := range map[string]string{alice: aliceKey, bob: bobKey} {
		conn, err := grpcclient.Dial(addr, grpcclient.Options{Token: key})
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if _, err := registryv1.NewRegistryServiceClient(conn).JoinClientGroup(t.Context(), &registryv1.JoinClientGroupRequest{Name: name}); err != nil {
			t.Fatalf("JoinClientGroup(%s): %v", name, err)
		}
	}
	conn, err := grpcclient.Dial(addr, grpcclient.Options{Token: aliceKey})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	disp := dispatcherv1.NewDispatcherServiceClient(conn)
	send := func(text string) string {
		t.Helper()
		resp, err := disp.SendMessage(t.Context(), &dispatcherv1.SendMessageRequest{
			Sender: alice, To: &dispatcherv1.DistributionList{Direct: []string{bob}}, MessageType: "new_message", BodyJson: `{"text":"` + text + `"}`,
		})
		if err != nil {
			t.Fatalf("SendMessage(%s): %v", text, err)
		}
		return resp.GetMessageId()
	}
	first, second := send("one"), send("two")

	out := must(bobKey, "listen", "--count", "2", "--timeout", "30s")
	lines := strings.Split(out, "\n")
	if len(lines) != 2 {
		t.Fatalf("parley listen --count 2 printed %d lines, want 2:\n%s", len(lines), out)
	}
	var m struct {
		Cursor              uint64
		MessageID, Sender   string
		Category, Recipient string
		Body                json.RawMessage
	}
	if err := json.Unmarshal([]byte(lines[0]), &m); err != nil {
		t.Fatalf("line %q: %v", lines[0], err)
	}
	if m.Cursor != 1 || m.MessageID != first || m.Sender != alice || m.Recipient != bob || m.Category != "message" || string(m.Body) != `{"text":"one"}` {
		t.Errorf("first line = %s, want message %s from alice with its JSON body", lines[0], first)
	}
	if !strings.Contains(lines[1], second) {
		t.Errorf("second line = %s, want message %s", lines[1], second)
	}

	third := send("three")
	if out := must(bobKey, "listen", "--count", "1", "--timeout", "30s"); !strings.Contains(out, third) {
		t.Errorf("the next listen printed %s, want only message %s (the first two were acknowledged)", out, third)
	}
	// Nothing is waiting now: a count the timeout cuts short is an error.
	if _, err := call(bobKey, "listen", "--count", "1", "--timeout", "100ms"); err == nil || !strings.Contains(err.Error(), "0 of 1") {
		t.Errorf("parley listen on an empty mailbox with --count 1 --timeout 100ms: %v, want a timeout after 0 of 1", err)
	}
	if _, err := call(acmeKey, "listen", "--count", "1"); err == nil || !strings.Contains(err.Error(), "agent key") {
		t.Errorf("parley listen with a client key: %v, want a usage error asking for an agent key", err)
	}
}
