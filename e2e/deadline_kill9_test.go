package e2e

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/parleyhq/parley/e2e/parleytest"
	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
)

// TestServe_kill9DeadlineFiresOnce: a consumer opens an allocate request
// with a 5 s offer window; the shipped `parley serve` is SIGKILLed while
// the window is open and restarted on the same data. The deadline fires
// after the restart: both agents get invite_offer_timeout_expired. The
// server is killed again and restarted: the deadline does not fire a second
// time, and the supplier's late offer is refused naming the deadline.
func TestServe_kill9DeadlineFiresOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("builds parley and runs it three times")
	}
	bin := parleytest.Binary(t)
	dataDir := t.TempDir()
	const alice, bob = "clients/acme/agents/alice", "clients/acme/agents/bob"

	first := startGroup(t, bin, dataDir)
	createAgent(t, first.server, "acme", "alice", "")
	createAgent(t, first.server, "acme", "bob", "")
	mustAPI(t, "POST", first.server.URL("/v1/"+alice+":joinClientGroup"), `{}`)
	mustAPI(t, "POST", first.server.URL("/v1/"+bob+":joinClientGroup"), `{}`)

	c := receiver(t, first.server.GRPCAddr)
	var (
		req *dispatcherv1.SendMessageResponse
		err error
	)
	// The built-in PDs are stored in the registry in the background at
	// start; until then the protocol is unknown. The bound only ends a
	// broken run.
	for until := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		req, err = c.NewRequest(t.Context(), &dispatcherv1.NewRequestRequest{
			Sender: alice, To: &dispatcherv1.DistributionList{Direct: []string{bob}}, Protocol: "allocate",
			TaskJson: `{"what":"ship"}`, InviteOfferTimeout: durationpb.New(5 * time.Second),
		})
		if err == nil || time.Now().After(until) {
			break
		}
	}
	if err != nil {
		t.Fatalf("NewRequest: %v\n%s", err, first.server.Log)
	}
	sent := time.Now()
	first.kill(t)
	if elapsed := time.Since(sent); elapsed >= 5*time.Second {
		t.Skipf("the kill took %v, past the deadline: the run proves nothing", elapsed) // a starved machine only
	}

	// After the restart the deadline fires: both agents are told.
	second := startGroup(t, bin, dataDir)
	c = receiver(t, second.server.GRPCAddr)
	for _, agent := range []string{alice, bob} {
		ms := readUntil(t, c, agent, func(m *dispatcherv1.NetworkMessage) bool { return m.GetMessageType() == "invite_offer_timeout_expired" })
		x := ms[len(ms)-1]
		var body struct{ Deadline, Outcome string }
		if err := json.Unmarshal(x.GetBodyJson(), &body); err != nil || x.GetDialogueId() != req.GetDialogueId() ||
			body.Deadline != "invite_offer_timeout" || body.Outcome != "failure" ||
			x.GetCategory() != dispatcherv1.MessageCategory_MESSAGE_CATEGORY_SERVICE {
			t.Errorf("%s's expiry = %v, want invite_offer_timeout of the dialogue, failed, category service", agent, x)
		}
	}
	second.kill(t)

	// Once: after another kill and restart, the late offer is refused
	// naming the deadline, and each mailbox, read up to a message sent
	// after the restart, holds the expiry once.
	third := startGroup(t, bin, dataDir)
	c = receiver(t, third.server.GRPCAddr)
	_, err = c.ReplyMessage(t.Context(), &dispatcherv1.ReplyMessageRequest{
		Sender: bob, InReplyTo: req.GetMessageId(), MessageType: "offer", BodyJson: `{"offer":{"price":5}}`,
	})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "invite_offer_timeout") {
		t.Errorf("the late offer: error = %v, want FAILED_PRECONDITION naming invite_offer_timeout", err)
	}
	if _, err := c.SendMessage(t.Context(), &dispatcherv1.SendMessageRequest{
		Sender: bob, To: &dispatcherv1.DistributionList{Direct: []string{alice}}, MessageType: "new_message", BodyJson: `"after"`,
	}); err != nil {
		t.Fatal(err)
	}
	for agent, last := range map[string]string{bob: "protocol_error", alice: "new_message"} {
		ms := readUntil(t, c, agent, func(m *dispatcherv1.NetworkMessage) bool { return m.GetMessageType() == last })
		n := 0
		for _, m := range ms {
			if m.GetMessageType() == "invite_offer_timeout_expired" {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%s's mailbox holds the expiry %d times, want once", agent, n)
		}
	}
}

// readUntil reads agent's mailbox from its start until a message matching
// last, and returns every message read.
func readUntil(t *testing.T, c dispatcherv1.DispatcherServiceClient, agent string, last func(*dispatcherv1.NetworkMessage) bool) []*dispatcherv1.NetworkMessage {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute) // bounds a broken run only
	defer cancel()
	stream, err := c.ReceiveMessages(ctx, &dispatcherv1.ReceiveMessagesRequest{Agent: agent})
	if err != nil {
		t.Fatal(err)
	}
	var out []*dispatcherv1.NetworkMessage
	for {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("%s: Recv: %v (read %d messages)", agent, err, len(out))
		}
		for _, m := range resp.GetMessages() {
			out = append(out, m)
			if last(m) {
				return out
			}
		}
	}
}
