package server

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
	"github.com/parleyhq/parley/services/dispatcher/internal/store/boltstore"
)

const (
	netAlice = "clients/acme/agents/alice"
	netBob   = "clients/beta/agents/bob"
	netCarol = "clients/gamma/agents/carol"
)

// followRegistry is the fake registry plus a ResolveRecipients over direct
// agents and a set of follows (follower → followed); it knows no group.
// The real rules are the registry's (cmd/parley tests them together).
type followRegistry struct {
	*fakeRegistry
	mu      sync.Mutex
	follows map[[2]string]bool
}

func (f *followRegistry) follow(follower, followed string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.follows[[2]string{follower, followed}] = true
}

func (f *followRegistry) ResolveRecipients(_ context.Context, req *registryv1.ResolveRecipientsRequest) (*registryv1.ResolveRecipientsResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := &registryv1.ResolveRecipientsResponse{}
	for _, a := range req.GetDirect() {
		switch {
		case a == req.GetSender():
		case f.agents[a] == nil:
			out.Refusals = append(out.Refusals, &registryv1.RecipientRefusal{Agent: a, Reason: "AGENT_NOT_FOUND", Message: a + " does not exist"})
		case f.follows[[2]string{a, req.GetSender()}]:
			out.Recipients = append(out.Recipients, &registryv1.Recipient{Agent: a, Basis: registryv1.DialogueBasis_DIALOGUE_BASIS_FOLLOW})
		default:
			out.Refusals = append(out.Refusals, &registryv1.RecipientRefusal{Agent: a, Reason: "NOT_CONNECTED", Message: a + " does not follow the sender"})
		}
	}
	for _, g := range req.GetGroups() {
		out.Refusals = append(out.Refusals, &registryv1.RecipientRefusal{Group: g.GetGroup(), Reason: "GROUP_NOT_FOUND", Message: "no group " + g.GetGroup()})
	}
	return out, nil
}

type netEnv struct {
	t      *testing.T
	reg    *followRegistry
	client dispatcherv1.DispatcherServiceClient
	mail   *mailbox.Mailboxes
	url    string // the gateway
}

// startNetwork runs a dispatcher with the agent network on loopback (gRPC
// and the REST gateway) over bbolt and real mailboxes, and a fake registry
// knowing alice, bob and carol, where bob follows alice.
func startNetwork(t *testing.T) *netEnv {
	t.Helper()
	reg := &followRegistry{fakeRegistry: newFakeRegistry(), follows: map[[2]string]bool{}}
	for _, a := range []string{netAlice, netBob, netCarol} {
		reg.addAgent(&registryv1.Agent{Name: a})
	}
	reg.follow(netBob, netAlice)
	regConn := serveGRPC(t, func(s *grpc.Server) { registryv1.RegisterRegistryServiceServer(s, reg) })

	st, err := boltstore.Open(t.TempDir(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	mb := mailbox.New(st, mailbox.Options{Bound: mailbox.Bound{MaxMessages: 100, MaxBytes: 1 << 20}})
	srv := New(st, slog.New(slog.DiscardHandler), registryv1.NewRegistryServiceClient(regConn), Options{
		Dialogues: st, Mailboxes: mb, MessageMaxBodyBytes: 100,
	})

	conn := serveGRPC(t, func(s *grpc.Server) { dispatcherv1.RegisterDispatcherServiceServer(s, srv) })
	gw := runtime.NewServeMux()
	if err := dispatcherv1.RegisterDispatcherServiceHandlerServer(t.Context(), gw, srv); err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(gw)
	t.Cleanup(hs.Close)
	return &netEnv{t: t, reg: reg, client: dispatcherv1.NewDispatcherServiceClient(conn), mail: mb, url: hs.URL}
}

// inbox returns every message in agent's mailbox.
func (e *netEnv) inbox(agent string) []mailbox.Message {
	e.t.Helper()
	ds, err := e.mail.Read(e.t.Context(), agent, 0, 1000)
	if err != nil {
		e.t.Fatal(err)
	}
	out := make([]mailbox.Message, len(ds))
	for i, d := range ds {
		out[i] = d.Message
	}
	return out
}

func (e *netEnv) post(path, body string) (int, string) {
	e.t.Helper()
	resp, err := http.Post(e.url+path, "application/json", strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(raw)
}

func (e *netEnv) send(sender string, to ...string) *dispatcherv1.SendMessageResponse {
	e.t.Helper()
	res, err := e.client.SendMessage(e.t.Context(), &dispatcherv1.SendMessageRequest{
		Sender: sender, To: &dispatcherv1.DistributionList{Direct: to}, MessageType: "new_message", BodyJson: `"hi"`,
	})
	if err != nil {
		e.t.Fatalf("SendMessage(%s → %v): %v", sender, to, err)
	}
	return res
}

func TestSendMessage_overRESTThenReplyOverGRPC(t *testing.T) {
	e := startNetwork(t)
	code, body := e.post("/v1/"+netAlice+"/messages:send",
		`{"to":{"direct":["`+netBob+`","`+netCarol+`","clients/x/agents/nobody"]},"messageType":"new_message","bodyJson":"{\"text\":\"hello\"}","category":"MESSAGE_CATEGORY_SERVICE"}`)
	if code != http.StatusOK {
		t.Fatalf("POST messages:send = %d %s, want 200", code, body)
	}
	var res struct {
		DialogueID string   `json:"dialogueId"`
		MessageID  string   `json:"messageId"`
		Category   string   `json:"category"`
		Recipients []string `json:"recipients"`
		Refusals   []struct {
			Agent, Reason, Detail string
		} `json:"refusals"`
	}
	if err := json.Unmarshal([]byte(body), &res); err != nil {
		t.Fatal(err)
	}
	if res.DialogueID == "" || res.MessageID == "" || res.Category != "MESSAGE_CATEGORY_MESSAGE" || len(res.Recipients) != 1 || res.Recipients[0] != netBob {
		t.Errorf("send result = %s; want ids, category message, recipients [bob]", body)
	}
	if len(res.Refusals) != 2 || res.Refusals[0].Reason != "REFUSAL_REASON_PERMISSION_DENIED" || res.Refusals[1].Reason != "REFUSAL_REASON_UNKNOWN_AGENT" {
		t.Errorf("refusals = %+v; want carol (permission) and nobody (unknown)", res.Refusals)
	}
	got := e.inbox(netBob)
	if len(got) != 1 || got[0].Sender != netAlice || got[0].ID != res.MessageID || string(got[0].Body) != `{"text":"hello"}` || got[0].Category != mailbox.CategoryMessage {
		t.Fatalf("bob's mailbox = %+v, want alice's message as sent", got)
	}
	if n := len(e.inbox(netCarol)); n != 0 {
		t.Errorf("carol, who does not follow alice, holds %d messages", n)
	}

	rep, err := e.client.ReplyMessage(t.Context(), &dispatcherv1.ReplyMessageRequest{
		Sender: netBob, InReplyTo: res.MessageID, MessageType: "message_response", BodyJson: `"hi alice"`,
	})
	if err != nil || rep.GetDialogueId() != res.DialogueID || len(rep.GetRecipients()) != 1 || rep.GetRecipients()[0] != netAlice {
		t.Fatalf("ReplyMessage(bob) = %v, %v; want alice in the same dialogue", rep, err)
	}
	if got := e.inbox(netAlice); len(got) != 1 || got[0].InReplyTo != res.MessageID || got[0].Sender != netBob {
		t.Errorf("alice's mailbox = %+v, want bob's reply", got)
	}
}

// TestDialogues_refusalsChangeNothing: every refused operation leaves
// every mailbox as it was, and the status names what was refused.
func TestDialogues_refusalsChangeNothing(t *testing.T) {
	e := startNetwork(t)
	ctx := t.Context()
	opener := e.send(netAlice, netBob)
	bc, err := e.client.BroadcastMessage(ctx, &dispatcherv1.BroadcastMessageRequest{
		Sender: netAlice, To: &dispatcherv1.DistributionList{Direct: []string{netBob}}, BodyJson: `"news"`,
	})
	if err != nil || bc.GetCategory() != dispatcherv1.MessageCategory_MESSAGE_CATEGORY_SUBSCRIPTION {
		t.Fatalf("BroadcastMessage = %v, %v", bc, err)
	}
	direct := func(to ...string) *dispatcherv1.DistributionList { return &dispatcherv1.DistributionList{Direct: to} }
	group := func(path string, scope dispatcherv1.GroupScope) *dispatcherv1.DistributionList {
		return &dispatcherv1.DistributionList{Groups: []*dispatcherv1.GroupAddress{{Path: path, Scope: scope}}}
	}
	sendReq := func(mutate func(*dispatcherv1.SendMessageRequest)) func() error {
		return func() error {
			r := &dispatcherv1.SendMessageRequest{Sender: netAlice, To: direct(netBob), MessageType: "new_message", BodyJson: `"x"`}
			mutate(r)
			_, err := e.client.SendMessage(ctx, r)
			return err
		}
	}
	reply := func(sender, inReplyTo string) func() error {
		return func() error {
			_, err := e.client.ReplyMessage(ctx, &dispatcherv1.ReplyMessageRequest{Sender: sender, InReplyTo: inReplyTo, MessageType: "message_response", BodyJson: `"x"`})
			return err
		}
	}
	cases := []struct {
		name   string
		call   func() error
		code   codes.Code
		reason string
		field  string // the BadRequest field, for INVALID_ARGUMENT
	}{
		{"recipient does not follow", sendReq(func(r *dispatcherv1.SendMessageRequest) { r.To = direct(netCarol) }), codes.PermissionDenied, "RECIPIENTS_REFUSED", ""},
		{"only unknown agents", sendReq(func(r *dispatcherv1.SendMessageRequest) { r.To = direct("clients/x/agents/nobody") }), codes.NotFound, "AGENT_NOT_FOUND", ""},
		{"answering a broadcast", reply(netBob, bc.GetMessageId()), codes.PermissionDenied, "BROADCAST_NOT_ANSWERABLE", ""},
		{"replying to a message not received", reply(netCarol, opener.GetMessageId()), codes.PermissionDenied, "MESSAGE_NOT_RECEIVED", ""},
		{"replying to an unknown message", reply(netBob, "AAAAAAAAAAAAAAAAAAAAAA"), codes.PermissionDenied, "MESSAGE_NOT_RECEIVED", ""},
		{"over-size body", sendReq(func(r *dispatcherv1.SendMessageRequest) { r.BodyJson = `"` + strings.Repeat("x", 100) + `"` }), codes.InvalidArgument, "INVALID_ARGUMENT", "body_json"},
		{"body not JSON", sendReq(func(r *dispatcherv1.SendMessageRequest) { r.BodyJson = `{` }), codes.InvalidArgument, "INVALID_ARGUMENT", "body_json"},
		{"empty type", sendReq(func(r *dispatcherv1.SendMessageRequest) { r.MessageType = "" }), codes.InvalidArgument, "INVALID_ARGUMENT", "message_type"},
		{"reserved type", sendReq(func(r *dispatcherv1.SendMessageRequest) { r.MessageType = "protocol_error" }), codes.InvalidArgument, "INVALID_ARGUMENT", "message_type"},
		{"unknown scope", sendReq(func(r *dispatcherv1.SendMessageRequest) { r.To = group("acme/travel", 99) }), codes.InvalidArgument, "INVALID_ARGUMENT", "to.groups[0].scope"},
		{"no scope", sendReq(func(r *dispatcherv1.SendMessageRequest) { r.To = group("acme/travel", 0) }), codes.InvalidArgument, "INVALID_ARGUMENT", "to.groups[0].scope"},
		{"unknown group", sendReq(func(r *dispatcherv1.SendMessageRequest) {
			r.To = group("acme/nothing", dispatcherv1.GroupScope_GROUP_SCOPE_LOCAL)
		}), codes.NotFound, "GROUP_NOT_FOUND", ""},
		{"neither direct nor groups", sendReq(func(r *dispatcherv1.SendMessageRequest) { r.To = &dispatcherv1.DistributionList{} }), codes.InvalidArgument, "INVALID_ARGUMENT", "to"},
		{"bad direct name", sendReq(func(r *dispatcherv1.SendMessageRequest) { r.To = direct("bob") }), codes.InvalidArgument, "INVALID_ARGUMENT", "to.direct[0]"},
		{"bad protocol", sendReq(func(r *dispatcherv1.SendMessageRequest) { r.Protocol = "xyz" }), codes.InvalidArgument, "INVALID_ARGUMENT", "protocol"},
		{"bad sender", sendReq(func(r *dispatcherv1.SendMessageRequest) { r.Sender = "alice" }), codes.InvalidArgument, "INVALID_ARGUMENT", "sender"},
		{"bad in_reply_to", reply(netBob, "no spaces allowed"), codes.InvalidArgument, "INVALID_ARGUMENT", "in_reply_to"},
	}
	before := map[string]int{}
	for _, a := range []string{netAlice, netBob, netCarol} {
		before[a] = len(e.inbox(a))
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.call()
			if status.Code(err) != c.code || grpcerr.Reason(err) != c.reason {
				t.Fatalf("error = %v (reason %q), want %v %s", err, grpcerr.Reason(err), c.code, c.reason)
			}
			if c.field != "" && badField(err) != c.field {
				t.Errorf("BadRequest field = %q, want %q", badField(err), c.field)
			}
			for a, n := range before {
				if got := len(e.inbox(a)); got != n {
					t.Errorf("%s holds %d messages after the refusal, want %d", a, got, n)
				}
			}
		})
	}
}

func badField(err error) string {
	for _, d := range status.Convert(err).Details() {
		if br, ok := d.(*errdetails.BadRequest); ok && len(br.GetFieldViolations()) > 0 {
			return br.GetFieldViolations()[0].GetField()
		}
	}
	return ""
}

func TestCloseDialogue_overREST(t *testing.T) {
	e := startNetwork(t)
	ctx := t.Context()
	opener := e.send(netAlice, netBob)
	rep, err := e.client.ReplyMessage(ctx, &dispatcherv1.ReplyMessageRequest{Sender: netBob, InReplyTo: opener.GetMessageId(), MessageType: "message_response", BodyJson: `1`})
	if err != nil {
		t.Fatal(err)
	}
	// bob closes the type "nag" over REST; alice's nag is refused whole.
	code, body := e.post("/v1/"+netBob+"/dialogues/"+opener.GetDialogueId()+":closeMessages", `{"messageTypes":["nag"]}`)
	if code != http.StatusOK || !strings.Contains(body, `"closedMessageTypes":["nag"]`) {
		t.Fatalf("POST :closeMessages = %d %s", code, body)
	}
	_, err = e.client.ReplyMessage(ctx, &dispatcherv1.ReplyMessageRequest{Sender: netAlice, InReplyTo: rep.GetMessageId(), MessageType: "nag", BodyJson: `1`})
	if status.Code(err) != codes.FailedPrecondition || grpcerr.Reason(err) != "RECIPIENT_CLOSED" {
		t.Errorf("ReplyMessage(nag to bob, who closed it) = %v, want FAILED_PRECONDITION RECIPIENT_CLOSED", err)
	}
	// Someone else's dialogue is not found.
	if code, body := e.post("/v1/"+netCarol+"/dialogues/"+opener.GetDialogueId()+":close", `{}`); code != http.StatusNotFound {
		t.Errorf("POST carol's :close of a dialogue she is not in = %d %s, want 404", code, body)
	}
	// The initiator closes it for all: bob can no longer reply.
	code, body = e.post("/v1/"+netAlice+"/dialogues/"+opener.GetDialogueId()+":close", `{}`)
	if code != http.StatusOK || !strings.Contains(body, `"closed":true`) {
		t.Fatalf("POST alice's :close = %d %s, want closed", code, body)
	}
	_, err = e.client.ReplyMessage(ctx, &dispatcherv1.ReplyMessageRequest{Sender: netBob, InReplyTo: opener.GetMessageId(), MessageType: "message_response", BodyJson: `2`})
	if status.Code(err) != codes.FailedPrecondition || grpcerr.Reason(err) != "DIALOGUE_CLOSED" {
		t.Errorf("ReplyMessage after the initiator closed = %v, want FAILED_PRECONDITION DIALOGUE_CLOSED", err)
	}
	e.send(netAlice, netBob)
	if code, body := e.post("/v1/"+netBob+"/dialogues:closeAll", `{}`); code != http.StatusOK || !strings.Contains(body, `"closedCount":1`) {
		t.Errorf("POST :closeAll = %d %s, want closedCount 1", code, body)
	}
}

// shopPD is a protocol whose state machine the dispatcher enforces: the
// consumer requests, the supplier offers (a price), the consumer accepts.
const shopPD = "---\nname: shop\n---\nrequest, offer, accept."

var shopMachine = &registryv1.StateMachine{
	Roles: []string{"consumer", "supplier"},
	Messages: []*registryv1.StateMachineMessage{
		{Type: "request", SenderRoles: []string{"consumer"}},
		{Type: "offer", SenderRoles: []string{"supplier"}, SchemaJson: `{"type":"object","required":["price"],"properties":{"price":{"type":"number"}}}`},
		{Type: "accept", SenderRoles: []string{"consumer"}, Answers: []string{"offer"}},
	},
	Transitions: []*registryv1.StateMachineTransition{
		{Message: "request", Next: []string{"offer"}},
		{Message: "offer", Next: []string{"accept"}},
	},
}

func (f *followRegistry) ResolveProtocol(ctx context.Context, req *registryv1.ResolveProtocolRequest) (*registryv1.Protocol, error) {
	p, err := f.fakeRegistry.ResolveProtocol(ctx, req)
	if err == nil && p.GetSha1Hex() == sha1Hex([]byte(shopPD)) {
		p.StateMachine = shopMachine
	}
	return p, err
}

func TestSendMessage_protocolControl(t *testing.T) {
	e := startNetwork(t)
	ctx := t.Context()
	hash := e.reg.addProtocol(shopPD)
	send := func(protocol string) (*dispatcherv1.SendMessageResponse, error) {
		return e.client.SendMessage(ctx, &dispatcherv1.SendMessageRequest{
			Sender: netAlice, To: &dispatcherv1.DistributionList{Direct: []string{netBob}}, MessageType: "request", Protocol: protocol, BodyJson: `{}`,
		})
	}
	if _, err := send(strings.Repeat("0", 40)); status.Code(err) != codes.FailedPrecondition || grpcerr.Reason(err) != "REFERENCE_NOT_FOUND" {
		t.Errorf("SendMessage(unknown protocol) = %v, want FAILED_PRECONDITION REFERENCE_NOT_FOUND", err)
	}
	if n := len(e.inbox(netBob)); n != 0 {
		t.Fatalf("bob holds %d messages after a refused send", n)
	}
	opener, err := send(hash)
	if err != nil {
		t.Fatal(err)
	}
	reply := func(typ, body string) error {
		_, err := e.client.ReplyMessage(ctx, &dispatcherv1.ReplyMessageRequest{Sender: netBob, InReplyTo: opener.GetMessageId(), MessageType: typ, BodyJson: body})
		return err
	}
	for _, c := range []struct{ typ, body, rule string }{
		{"accept", `{}`, "WRONG_ROLE"},
		{"offer", `{"price":"cheap"}`, "SCHEMA"},
		{"haggle", `{}`, "UNKNOWN_MESSAGE_TYPE"},
	} {
		err := reply(c.typ, c.body)
		if status.Code(err) != codes.FailedPrecondition || grpcerr.Reason(err) != "PROTOCOL_ERROR" {
			t.Errorf("ReplyMessage(%s %s) = %v, want FAILED_PRECONDITION PROTOCOL_ERROR", c.typ, c.body, err)
		}
		got := e.inbox(netBob)
		last := got[len(got)-1]
		var body map[string]string
		_ = json.Unmarshal(last.Body, &body)
		if last.Type != "protocol_error" || last.Sender != "" || body["rule"] != c.rule || last.DialogueID != opener.GetDialogueId() {
			t.Errorf("bob's last message after %s = %+v (%s), want a protocol_error of rule %s in the dialogue", c.typ, last, last.Body, c.rule)
		}
	}
	if n := len(e.inbox(netAlice)); n != 0 {
		t.Errorf("alice holds %d messages after only violations, want 0", n)
	}
	if err := reply("offer", `{"price":3}`); err != nil {
		t.Fatalf("ReplyMessage(valid offer after violations) = %v", err)
	}
	if got := e.inbox(netAlice); len(got) != 1 || got[0].Type != "offer" || got[0].Protocol != hash {
		t.Errorf("alice's mailbox = %+v, want the offer under the protocol", got)
	}
}

func TestSendMessage_requestIDRepeatSendsOnce(t *testing.T) {
	e := startNetwork(t)
	body := `{"to":{"direct":["` + netBob + `"]},"messageType":"new_message","bodyJson":"1","requestId":"retry-7"}`
	code1, first := e.post("/v1/"+netAlice+"/messages:send", body)
	code2, again := e.post("/v1/"+netAlice+"/messages:send", body)
	if code1 != http.StatusOK || code2 != http.StatusOK || first != again {
		t.Errorf("POST messages:send twice with one requestId = %d %s, then %d %s; want the same result", code1, first, code2, again)
	}
	if n := len(e.inbox(netBob)); n != 1 {
		t.Errorf("bob holds %d messages, want 1", n)
	}
	if code, out := e.post("/v1/"+netAlice+"/messages:send", strings.Replace(body, "retry-7", "not ok", 1)); code != http.StatusBadRequest || !strings.Contains(out, "request_id") {
		t.Errorf("POST with a bad requestId = %d %s, want 400 naming request_id", code, out)
	}
}
