package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/parleyhq/parley/e2e/parleytest"
	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
)

// TestServe_customServiceProtocolRunsFromItsPD: a fourth service protocol
// needs only its PD. The haggle PD (buyer, seller; a quote window and a
// quote validity) is registered in a running `parley serve`; then one
// dialogue runs through counter and re-quote to an order that the seller
// delivers, a message from the wrong role is refused naming the rule, and
// in a second dialogue the seller's silence lapses the quote window: both
// agents get quote_timeout_expired and the late quote is refused naming it.
func TestServe_customServiceProtocolRunsFromItsPD(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs parley")
	}
	srv := parleytest.Start(t, t.TempDir())
	const alice, bob = "clients/acme/agents/alice", "clients/acme/agents/bob"
	createAgent(t, srv, "acme", "alice", "")
	createAgent(t, srv, "acme", "bob", "")
	mustAPI(t, "POST", srv.URL("/v1/"+alice+":joinClientGroup"), `{}`)
	mustAPI(t, "POST", srv.URL("/v1/"+bob+":joinClientGroup"), `{}`)

	content, err := os.ReadFile(filepath.Join(serviceProtocolDir, "testdata", "haggle.md"))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(srv.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(parleytest.Bearer(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	pd, err := registryv1.NewRegistryServiceClient(conn).CreateProtocol(t.Context(), &registryv1.CreateProtocolRequest{Protocol: &registryv1.Protocol{Content: content}})
	if err != nil {
		t.Fatalf("CreateProtocol(haggle) error = %v", err)
	}
	hash := pd.GetSha1Hex()
	c := receiver(t, srv.GRPCAddr)
	request := func(body string) *dispatcherv1.SendMessageResponse {
		t.Helper()
		res, err := c.NewRequest(t.Context(), &dispatcherv1.NewRequestRequest{
			Sender: alice, To: &dispatcherv1.DistributionList{Direct: []string{bob}}, Protocol: hash, TaskJson: `{"what":"lamp"}`, BodyJson: body,
		})
		if err != nil {
			t.Fatalf("NewRequest(haggle) error = %v\n%s", err, srv.Log)
		}
		return res
	}
	reply := func(sender, inReplyTo, typ, body string) (string, error) {
		res, err := c.ReplyMessage(t.Context(), &dispatcherv1.ReplyMessageRequest{Sender: sender, InReplyTo: inReplyTo, MessageType: typ, BodyJson: body})
		return res.GetMessageId(), err
	}
	must := func(sender, inReplyTo, typ, body string) string {
		t.Helper()
		id, err := reply(sender, inReplyTo, typ, body)
		if err != nil {
			t.Fatalf("ReplyMessage(%s from %s) error = %v", typ, sender, err)
		}
		return id
	}

	// To an order, delivered.
	open := request(`{"item":"lamp","quote_timeout":600}`)
	q1 := must(bob, open.GetMessageId(), "quote", `{"price":30,"quote_valid":600}`)
	counter := must(alice, q1, "counter", `{"price":20}`)
	q2 := must(bob, counter, "quote", `{"price":25,"quote_valid":600}`)
	if _, err := reply(bob, counter, "accept", `{}`); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("accept from the seller: error = %v, want FAILED_PRECONDITION", err)
	}
	ms := readUntil(t, c, bob, func(m *dispatcherv1.NetworkMessage) bool { return m.GetMessageType() == "protocol_error" })
	var pe struct{ Rule string }
	_ = json.Unmarshal(ms[len(ms)-1].GetBodyJson(), &pe)
	if pe.Rule != "WRONG_ROLE" {
		t.Errorf("bob's protocol_error = %s, want rule WRONG_ROLE", ms[len(ms)-1].GetBodyJson())
	}
	accept := must(alice, q2, "accept", `{}`)
	must(bob, accept, "deliver", `{"tracking":"x1"}`)
	list, err := c.ListOrders(t.Context(), &dispatcherv1.ListOrdersRequest{Parent: alice})
	if err != nil || len(list.GetOrders()) != 1 {
		t.Fatalf("ListOrders(alice) = %v, %v; want one order", list, err)
	}
	if o := list.GetOrders()[0]; o.GetState() != dispatcherv1.OrderState_ORDER_STATE_SUCCEEDED || o.GetSupplier() != bob || o.GetProtocol() != hash {
		t.Errorf("the haggle order = %v, want succeeded, with bob, under the haggle PD", o)
	}

	// The seller stays silent: the window lapses on the server.
	late := request(`{"item":"chair","quote_timeout":1}`)
	for _, agent := range []string{alice, bob} {
		ms := readUntil(t, c, agent, func(m *dispatcherv1.NetworkMessage) bool {
			return m.GetMessageType() == "quote_timeout_expired" && m.GetDialogueId() == late.GetDialogueId()
		})
		var body struct{ Deadline, Outcome string }
		if err := json.Unmarshal(ms[len(ms)-1].GetBodyJson(), &body); err != nil || body.Deadline != "quote_timeout" || body.Outcome != "failure" {
			t.Errorf("%s's expiry body = %s, want quote_timeout, failure", agent, ms[len(ms)-1].GetBodyJson())
		}
	}
	if _, err := reply(bob, late.GetMessageId(), "quote", `{"price":5}`); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "quote_timeout") {
		t.Errorf("the late quote: error = %v, want FAILED_PRECONDITION naming quote_timeout", err)
	}
}
