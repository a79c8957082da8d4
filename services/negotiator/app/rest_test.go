package app_test

import (
	"bytes"
	"io"
	"net/http"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	negotiatorv1 "github.com/parleyhq/parley/gen/parley/negotiator/v1"
)

// postREST posts a request message as the gateway's JSON and decodes the
// answer into out.
func postREST(t *testing.T, url string, in, out proto.Message) {
	t.Helper()
	body, err := protojson.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, url, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s = %d %s", url, resp.StatusCode, raw)
	}
	if err := protojson.Unmarshal(raw, out); err != nil {
		t.Fatalf("decode %s: %v", raw, err)
	}
}

// TestNegotiation_overREST relays a negotiation between two negotiators
// through their HTTP gateways only, as two separate servers would be
// reached.
func TestNegotiation_overREST(t *testing.T) {
	a := startNegotiator(t, nil)
	b := startNegotiator(t, nil)
	sender := &negotiatorv1.Negotiation{}
	postREST(t, a.url+"/v1/negotiations:start", &negotiatorv1.StartNegotiationRequest{Agent: alice, Peer: bob, Task: weatherTask}, sender)
	receiver := &negotiatorv1.Negotiation{}
	postREST(t, b.url+"/v1/negotiations:receive", &negotiatorv1.ReceiveNegotiationMessageRequest{Agent: bob, Peer: alice, BodyJson: sender.GetOutboundMessageJson(), Tools: []*negotiatorv1.ToolSpec{bobTool}}, receiver)
	postREST(t, a.url+"/v1/negotiations:receive", &negotiatorv1.ReceiveNegotiationMessageRequest{Name: sender.GetName(), BodyJson: receiver.GetOutboundMessageJson()}, sender)
	accepted := negotiatorv1.NegotiationState_NEGOTIATION_STATE_ACCEPTED
	if sender.GetState() != accepted || receiver.GetState() != accepted {
		t.Fatalf("states %v/%v, want ACCEPTED", sender.GetState(), receiver.GetState())
	}
	if sender.GetProtocolSha1Hex() != receiver.GetProtocolSha1Hex() || len(sender.GetProtocolSha1Hex()) != 40 {
		t.Errorf("hashes %q/%q, want equal", sender.GetProtocolSha1Hex(), receiver.GetProtocolSha1Hex())
	}
	meta := &negotiatorv1.GetNegotiationProtocolResponse{}
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, b.url+"/v1/negotiationProtocol", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err := protojson.Unmarshal(raw, meta); err != nil || meta.GetProtocolSha1Hex() != "9ec699d26addfb295aeb7c7b7b014102cab38c6c" {
		t.Errorf("GET negotiationProtocol = %s, %v", raw, err)
	}
}
