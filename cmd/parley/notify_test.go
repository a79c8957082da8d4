package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/platform/grpcclient"
)

// TestNotifications_reachMailboxesThroughTheRelay: in `parley serve`, a
// follow and a group invite made with the CLI arrive on the notified
// agents' ReceiveMessages streams, category notifications, sent by the
// network: the registry's outbox, relayed by the dispatcher.
func TestNotifications_reachMailboxesThroughTheRelay(t *testing.T) {
	s := startCLISuite(t)
	addr, must, operator := s.addr, s.must(t), s.operator
	aliceKey := must(must(operator, "client", "create", "acme"), "agent", "create", "acme:alice")
	bobKey := must(must(operator, "client", "create", "beta"), "agent", "create", "beta:bob")

	// next returns the agent's next notification from its stream; the
	// 30 s bound is generous for a loaded machine (it takes milliseconds).
	stream := func(token, agent string) func() *dispatcherv1.NetworkMessage {
		conn, err := grpcclient.Dial(addr, grpcclient.Options{Token: token})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		t.Cleanup(cancel)
		s, err := dispatcherv1.NewDispatcherServiceClient(conn).ReceiveMessages(ctx, &dispatcherv1.ReceiveMessagesRequest{Agent: agent})
		if err != nil {
			t.Fatal(err)
		}
		var pending []*dispatcherv1.NetworkMessage
		return func() *dispatcherv1.NetworkMessage {
			t.Helper()
			for len(pending) == 0 {
				batch, err := s.Recv()
				if err != nil {
					t.Fatalf("ReceiveMessages(%s): %v", agent, err)
				}
				pending = batch.GetMessages()
			}
			m := pending[0]
			pending = pending[1:]
			return m
		}
	}
	aliceNext := stream(aliceKey, "clients/acme/agents/alice")
	bobNext := stream(bobKey, "clients/beta/agents/bob")

	must(bobKey, "follow", "acme:alice")
	m := aliceNext()
	var body struct{ Agent, Recipient string }
	if err := json.Unmarshal(m.GetBodyJson(), &body); err != nil {
		t.Fatal(err)
	}
	if m.GetCategory() != dispatcherv1.MessageCategory_MESSAGE_CATEGORY_NOTIFICATIONS || m.GetMessageType() != "followed" || m.GetSender() != "" || body.Agent != "clients/beta/agents/bob" {
		t.Errorf("alice's notification = %v (body %s), want followed by bob, category notifications, no sender", m, m.GetBodyJson())
	}

	must(aliceKey, "group", "create", "acme/club", "--access", "restricted_private", "--category", "message")
	must(aliceKey, "group", "invite", "acme/club", "beta:bob", "--conditions", "5 EUR")
	if m := bobNext(); m.GetMessageType() != "invite_to_group" || !strings.Contains(string(m.GetBodyJson()), "5 EUR") {
		t.Errorf("bob's notification = %v (body %s), want the invite with its conditions", m, m.GetBodyJson())
	}
	must(bobKey, "group", "accept-invite", "acme/club")
	if m := aliceNext(); m.GetMessageType() != "invite_to_group_response" || !strings.Contains(string(m.GetBodyJson()), "accepted") {
		t.Errorf("alice's notification = %v (body %s), want bob's acceptance", m, m.GetBodyJson())
	}
}
