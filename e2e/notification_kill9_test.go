package e2e

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/parleyhq/parley/e2e/parleytest"
	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
)

// TestServe_kill9KeepsAWaitingNotification: alice's mailbox holds one
// message at most; bob's follow fills it, so carol's follow notification
// is refused and waits for a retry, stored in the dispatcher's bbolt
// file. `parley serve` is SIGKILLed and restarted on the same data.
// Alice acknowledges bob's notification, and then gets carol's, once.
func TestServe_kill9KeepsAWaitingNotification(t *testing.T) {
	if testing.Short() {
		t.Skip("builds parley and runs it twice")
	}
	bin := parleytest.Binary(t)
	dataDir := t.TempDir()
	const alice = "clients/acme/agents/alice"
	flags := []string{"--mailbox-max-messages", "1"}

	first := startGroup(t, bin, dataDir, flags...)
	srv := first.server
	createAgent(t, srv, "acme", "alice", "")
	createAgent(t, srv, "beta", "bob", "")
	createAgent(t, srv, "gamma", "carol", "")
	mustAPI(t, "POST", srv.URL("/v1/clients/beta/agents/bob:follow"), `{"agent":"`+alice+`"}`)
	mustAPI(t, "POST", srv.URL("/v1/clients/gamma/agents/carol:follow"), `{"agent":"`+alice+`"}`)
	// A retried attempt is counted after the notification is stored.
	deadline := time.Now().Add(time.Minute) // bounds a broken run only
	for {
		if n, _ := scrape(t, srv, `parley_dispatcher_notifications_total{outcome="retried"}`); n >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("carol's follow notification was not refused within a minute\n%s", srv.Log)
		}
		time.Sleep(20 * time.Millisecond) // polling the relay's progress
	}
	first.kill(t)

	second := startGroup(t, bin, dataDir, flags...)
	srv = second.server
	rx := receiver(t, srv.GRPCAddr)
	stream, err := rx.ReceiveMessages(t.Context(), &dispatcherv1.ReceiveMessagesRequest{Agent: alice})
	if err != nil {
		t.Fatal(err)
	}
	var got []*dispatcherv1.NetworkMessage
	for len(got) < 2 {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("Recv after restart: %v\n%s", err, srv.Log)
		}
		got = append(got, resp.GetMessages()...)
		if len(got) == 1 {
			// Room for carol's: the relay retries it from the store.
			if _, err := rx.AcknowledgeMessages(t.Context(), &dispatcherv1.AcknowledgeMessagesRequest{Agent: alice, Cursor: got[0].GetCursor()}); err != nil {
				t.Fatal(err)
			}
		}
	}
	var followers []string
	for _, m := range got {
		var body struct{ Agent string }
		if err := json.Unmarshal(m.GetBodyJson(), &body); err != nil || m.GetMessageType() != "followed" {
			t.Fatalf("alice received %v (%v), want followed notifications", m, err)
		}
		followers = append(followers, body.Agent)
	}
	if len(followers) != 2 || followers[0] != "clients/beta/agents/bob" || followers[1] != "clients/gamma/agents/carol" {
		t.Errorf("alice's notifications after the restart: followed by %v, want bob then carol, once each", followers)
	}
}
