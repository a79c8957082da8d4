package server

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
)

// step is one reply of a scripted service dialogue: from the consumer
// (alice) or the supplier (bob), answering an earlier step (its index; -1
// for the one before it; 0 is the opener).
type step struct {
	fromSupplier bool
	answers      int
	typ, body    string
}

func cons(typ, body string) step { return step{answers: -1, typ: typ, body: body} }
func supp(typ, body string) step { return step{fromSupplier: true, answers: -1, typ: typ, body: body} }

// Every message type of the three service protocols goes through the
// network: the dialogue opens with NewRequest (category service), each
// reply reaches the other party as sent, the timeouts arrive as absolute
// times, and each path leaves the pair's order (if any) in the state its
// last outcome says; confirm_fail is a failure.
func TestNewRequest_everyMessageTypeThroughTheNetwork(t *testing.T) {
	e := startService(t)
	sec := time.Second
	paths := []struct {
		protocol string
		timeouts map[string]time.Duration
		steps    []step
		order    dispatcherv1.OrderState // UNSPECIFIED: no order
	}{
		{"delegate", map[string]time.Duration{"offer_timeout": 60 * sec}, []step{
			// The supplier answered the request itself, so its own messages answer that.
			supp("accept_offer", `{}`), {fromSupplier: true, typ: "request_message", body: `{"q":"size?"}`}, cons("request_message", `{"a":"L"}`),
			supp("order_complete", `{}`),
		}, dispatcherv1.OrderState_ORDER_STATE_SUCCEEDED},
		{"delegate", nil, []step{supp("reject_offer", `{}`)}, 0},
		{"delegate", nil, []step{supp("accept_offer", `{}`), cons("cancel_order", `{}`)}, dispatcherv1.OrderState_ORDER_STATE_FAILED},
		{"delegate", nil, []step{supp("accept_offer", `{}`), {fromSupplier: true, typ: "order_failed", body: `{}`}}, dispatcherv1.OrderState_ORDER_STATE_FAILED},
		{"allocate", map[string]time.Duration{"invite_offer_timeout": 30 * sec}, []step{
			supp("offer", `{"offer":{"price":5},"offer_timeout":60}`), cons("accept_offer", `{}`), supp("order_complete", `{}`), cons("confirm_success", `{}`),
		}, dispatcherv1.OrderState_ORDER_STATE_SUCCEEDED},
		{"allocate", nil, []step{supp("reject_task", `{}`)}, 0},
		{"allocate", nil, []step{supp("offer", `{"offer":{}}`), cons("reject_offer", `{}`)}, 0},
		{"allocate", nil, []step{
			supp("offer", `{"offer":{}}`), cons("accept_offer", `{}`), supp("order_complete", `{}`), cons("confirm_fail", `{"reason":"late"}`),
		}, dispatcherv1.OrderState_ORDER_STATE_FAILED},
		{"transact", map[string]time.Duration{"proposal_timeout": 30 * sec}, []step{
			supp("proposal", `{"proposal":{"price":5}}`),
			cons("invite_offer", `{"invite_offer_timeout":30}`),
			supp("offer", `{"offer":{"price":5},"offer_timeout":60}`), // paid acceptances: acceptance_test.go
			cons("accept_offer", `{"payment":{"reference":"ledger:1"}}`),
			supp("payment_error", `{"error":"declined","offer_timeout":60}`),
			cons("accept_offer", `{"payment":{"reference":"ledger:2"}}`),
			supp("payment_confirmed", `{}`),
			cons("request_message", `{"q":"when?"}`),
			supp("request_message", `{"a":"soon"}`),
			{fromSupplier: true, answers: 8, typ: "order_complete", body: `{}`}, // answers alice's request_message
			cons("confirm_success", `{}`),
		}, dispatcherv1.OrderState_ORDER_STATE_SUCCEEDED},
		{"transact", nil, []step{supp("reject_task", `{}`)}, 0},
		{"transact", nil, []step{supp("proposal", `{"proposal":{}}`), cons("reject_proposal", `{}`)}, 0},
		{"transact", nil, []step{supp("proposal", `{"proposal":{}}`), cons("invite_offer", `{}`), supp("reject_invite_offer", `{}`)}, 0},
		// revoke_offer follows the supplier's own offer but answers the invite.
		{"transact", nil, []step{
			supp("proposal", `{"proposal":{}}`), cons("invite_offer", `{}`), supp("offer", `{"offer":{}}`), {fromSupplier: true, answers: 2, typ: "revoke_offer", body: `{}`},
		}, 0},
		{"transact", nil, []step{supp("proposal", `{"proposal":{}}`), cons("invite_offer", `{}`), supp("offer", `{"offer":{}}`), cons("reject_offer", `{}`)}, 0},
		{"transact", nil, []step{
			supp("proposal", `{"proposal":{}}`), cons("invite_offer", `{}`), supp("offer", `{"offer":{}}`), cons("accept_offer", `{}`),
			supp("payment_confirmed", `{}`), cons("cancel_order", `{}`),
		}, dispatcherv1.OrderState_ORDER_STATE_FAILED},
		{"transact", nil, []step{
			supp("proposal", `{"proposal":{}}`), cons("invite_offer", `{}`), supp("offer", `{"offer":{}}`), cons("accept_offer", `{}`), supp("order_failed", `{}`),
		}, dispatcherv1.OrderState_ORDER_STATE_FAILED},
		{"transact", nil, []step{supp("proposal", `{"proposal":{}}`), cons("task_withdrawn", `{}`)}, 0},
	}
	seen := map[string]bool{}
	for i, p := range paths {
		open := e.request(p.protocol, p.timeouts, netBob)
		opener := last(e.inbox(netBob))
		if opener.ID != open.GetMessageId() || opener.Type != "new_task_request" || opener.Category != mailbox.CategoryService || opener.RecipientType != "supplier" {
			t.Fatalf("path %d: bob's opener = %+v, want new_task_request of category service for a supplier", i, opener)
		}
		var body map[string]any
		if err := json.Unmarshal(opener.Body, &body); err != nil || body["task"] == nil {
			t.Fatalf("path %d: opener body = %s, want the task", i, opener.Body)
		}
		for name, d := range p.timeouts {
			if got, want := body[name], float64(e.clock.Now().Add(d).Unix()); got != want {
				t.Errorf("path %d: %s delivered as %v, want the absolute time %v", i, name, got, want)
			}
		}
		seen["new_task_request"] = true
		ids := []string{open.GetMessageId()}
		for j, st := range p.steps {
			answers := st.answers
			if answers < 0 {
				answers = j
			}
			from, to := netAlice, netBob
			if st.fromSupplier {
				from, to = netBob, netAlice
			}
			id := e.mustReply(from, ids[answers], st.typ, st.body)
			got := last(e.inbox(to))
			if got.ID != id || got.Type != st.typ || got.Category != mailbox.CategoryService || got.InReplyTo != ids[answers] {
				t.Fatalf("path %d step %d: %s's last message = %+v, want %s answering %s", i, j, to, got, st.typ, ids[answers])
			}
			ids = append(ids, id)
			seen[st.typ] = true
		}
		list, err := e.client.ListOrders(t.Context(), &dispatcherv1.ListOrdersRequest{Parent: netBob, PageSize: 1000})
		if err != nil {
			t.Fatal(err)
		}
		var state dispatcherv1.OrderState
		for _, o := range list.GetOrders() {
			if o.GetDialogueId() == open.GetDialogueId() {
				state = o.GetState()
			}
		}
		if state != p.order {
			t.Errorf("path %d (%s): order state %v, want %v", i, p.protocol, state, p.order)
		}
	}
	// The list, by the types the operations send.
	for _, typ := range []string{
		"new_task_request", "proposal", "reject_task", "invite_offer", "offer", "reject_invite_offer", "revoke_offer",
		"accept_offer", "reject_offer", "task_withdrawn", "payment_confirmed", "payment_error", "request_message",
		"order_complete", "order_failed", "cancel_order", "confirm_success", "confirm_fail",
	} {
		if !seen[typ] {
			t.Errorf("no path sends %s", typ)
		}
	}
}

// The consumer closing a service dialogue withdraws the task from every
// supplier whose pair is still open: each gets task_withdrawn, its pair
// ends (a later message is refused), and a supplier whose pair had ended
// gets nothing.
func TestNewRequest_closeSendsTaskWithdrawnToOpenSuppliers(t *testing.T) {
	e := startService(t)
	open := e.request("allocate", nil, netBob, netCarol)
	e.mustReply(netCarol, open.GetMessageId(), "reject_task", `{}`)
	carolBefore := len(e.inbox(netCarol))

	if _, err := e.client.CloseDialogue(t.Context(), &dispatcherv1.CloseDialogueRequest{Name: netAlice + "/dialogues/" + open.GetDialogueId()}); err != nil {
		t.Fatalf("CloseDialogue() error = %v", err)
	}
	got := last(e.inbox(netBob))
	if got.Type != "task_withdrawn" || got.Sender != netAlice || got.DialogueID != open.GetDialogueId() || got.Category != mailbox.CategoryService {
		t.Errorf("bob's last message = %+v, want task_withdrawn from alice in the dialogue", got)
	}
	if n := len(e.inbox(netCarol)); n != carolBefore {
		t.Errorf("carol, whose pair had ended, got %d more messages", n-carolBefore)
	}
	if _, err := e.reply(netBob, open.GetMessageId(), "offer", `{"offer":{}}`); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("bob's offer after the close: error = %v, want FAILED_PRECONDITION", err)
	}
	// CloseAllDialogues withdraws too.
	again := e.request("transact", nil, netBob)
	if _, err := e.client.CloseAllDialogues(t.Context(), &dispatcherv1.CloseAllDialoguesRequest{Agent: netAlice}); err != nil {
		t.Fatal(err)
	}
	if got := last(e.inbox(netBob)); got.Type != "task_withdrawn" || got.DialogueID != again.GetDialogueId() {
		t.Errorf("after CloseAllDialogues bob's last message = %+v, want task_withdrawn of the transact dialogue", got)
	}
	// Closing a plain message dialogue sends nothing.
	plain, err := e.client.SendMessage(t.Context(), &dispatcherv1.SendMessageRequest{
		Sender: netAlice, To: &dispatcherv1.DistributionList{Direct: []string{netBob}}, MessageType: "new_message", BodyJson: `"hi"`,
	})
	if err != nil {
		t.Fatal(err)
	}
	before := len(e.inbox(netBob))
	if _, err := e.client.CloseDialogue(t.Context(), &dispatcherv1.CloseDialogueRequest{Name: netAlice + "/dialogues/" + plain.GetDialogueId()}); err != nil {
		t.Fatal(err)
	}
	if n := len(e.inbox(netBob)); n != before {
		t.Errorf("closing a message dialogue sent bob %d messages", n-before)
	}
}

// A custom service protocol opens with NewRequest too, by its hash, with
// its own opener type and body fields.
func TestNewRequest_customProtocolByHash(t *testing.T) {
	e := startService(t)
	hash := e.addHaggle()
	res, err := e.client.NewRequest(t.Context(), &dispatcherv1.NewRequestRequest{
		Sender: netAlice, To: &dispatcherv1.DistributionList{Direct: []string{netBob}}, Protocol: hash,
		TaskJson: `{"what":"lamp"}`, BodyJson: `{"item":"lamp","quote_timeout":60}`,
	})
	if err != nil {
		t.Fatalf("NewRequest(haggle) error = %v", err)
	}
	got := last(e.inbox(netBob))
	if got.ID != res.GetMessageId() || got.Type != "request_quote" || got.Category != mailbox.CategoryService {
		t.Errorf("bob's message = %+v, want request_quote of category service", got)
	}
	quote := e.mustReply(netBob, res.GetMessageId(), "quote", `{"price":3,"quote_valid":60}`)
	e.mustReply(netAlice, quote, "accept", `{}`)
}

// Bad NewRequest input is refused with the field named, and nothing is
// sent.
func TestNewRequest_refusesBadInput(t *testing.T) {
	e := startService(t)
	haggle := e.addHaggle()
	to := &dispatcherv1.DistributionList{Direct: []string{netBob}}
	ok := func() *dispatcherv1.NewRequestRequest {
		return &dispatcherv1.NewRequestRequest{Sender: netAlice, To: to, Protocol: "allocate", TaskJson: `{}`}
	}
	cases := []struct {
		name  string
		edit  func(r *dispatcherv1.NewRequestRequest)
		field string
	}{
		{"no sender", func(r *dispatcherv1.NewRequestRequest) { r.Sender = "" }, "sender"},
		{"no list", func(r *dispatcherv1.NewRequestRequest) { r.To = nil }, "to"},
		{"no protocol", func(r *dispatcherv1.NewRequestRequest) { r.Protocol = "" }, "protocol"},
		{"unknown protocol name", func(r *dispatcherv1.NewRequestRequest) { r.Protocol = "auction" }, "protocol"},
		{"no task", func(r *dispatcherv1.NewRequestRequest) { r.TaskJson = "" }, "task_json"},
		{"task not an object", func(r *dispatcherv1.NewRequestRequest) { r.TaskJson = `"ship"` }, "task_json"},
		{"task not JSON", func(r *dispatcherv1.NewRequestRequest) { r.TaskJson = `{` }, "task_json"},
		{"body not an object", func(r *dispatcherv1.NewRequestRequest) { r.BodyJson = `[1]` }, "body_json"},
		{"body sets the task", func(r *dispatcherv1.NewRequestRequest) { r.BodyJson = `{"task":1}` }, "body_json"},
		{"body sets a timeout", func(r *dispatcherv1.NewRequestRequest) { r.BodyJson = `{"invite_offer_timeout":1}` }, "body_json"},
		{"zero timeout", func(r *dispatcherv1.NewRequestRequest) { r.InviteOfferTimeout = durationpb.New(0) }, "invite_offer_timeout"},
		{"negative timeout", func(r *dispatcherv1.NewRequestRequest) { r.InviteOfferTimeout = durationpb.New(-time.Second) }, "invite_offer_timeout"},
		{"fractional timeout", func(r *dispatcherv1.NewRequestRequest) {
			r.InviteOfferTimeout = durationpb.New(1500 * time.Millisecond)
		}, "invite_offer_timeout"},
		{"timeout the protocol does not declare", func(r *dispatcherv1.NewRequestRequest) { r.ProposalTimeout = durationpb.New(time.Minute) }, "proposal_timeout"},
		{"bad message type", func(r *dispatcherv1.NewRequestRequest) { r.MessageType = "a b" }, "message_type"},
		{"bad request id", func(r *dispatcherv1.NewRequestRequest) { r.RequestId = "a b" }, "request_id"},
		{"hash without a state machine", func(r *dispatcherv1.NewRequestRequest) { r.Protocol = e.reg.addProtocol("---\nname: plain\n---\n") }, "protocol"},
		{"opener type not initial", func(r *dispatcherv1.NewRequestRequest) { r.Protocol, r.MessageType = haggle, "quote" }, "message_type"},
	}
	before := len(e.inbox(netBob))
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := ok()
			tc.edit(r)
			_, err := e.client.NewRequest(t.Context(), r)
			if status.Code(err) != codes.InvalidArgument || badField(err) != tc.field {
				t.Errorf("NewRequest() error = %v, want INVALID_ARGUMENT naming %s", err, tc.field)
			}
		})
	}
	if n := len(e.inbox(netBob)); n != before {
		t.Errorf("refused requests put %d messages in bob's mailbox", n-before)
	}
	// Card data never passes through the network, in any message.
	open := e.request("transact", nil, netBob)
	for name, send := range map[string]func() error{
		"NewRequest task": func() error {
			r := ok()
			r.TaskJson = `{"pay_with":"4111 1111 1111 1111"}`
			_, err := e.client.NewRequest(t.Context(), r)
			return err
		},
		"ReplyMessage card number": func() error {
			_, err := e.reply(netBob, open.GetMessageId(), "proposal", `{"proposal":{"card":"5500000000000004"}}`)
			return err
		},
		"ReplyMessage CVV": func() error {
			_, err := e.reply(netBob, open.GetMessageId(), "proposal", `{"proposal":{},"payment":{"ref":"ledger:1","cvv":"123"}}`)
			return err
		},
		"SendMessage": func() error {
			_, err := e.client.SendMessage(t.Context(), &dispatcherv1.SendMessageRequest{
				Sender: netAlice, To: to, MessageType: "new_message", BodyJson: `{"n":4111111111111111}`,
			})
			return err
		},
	} {
		before := len(e.inbox(netBob)) + len(e.inbox(netAlice))
		if err := send(); status.Code(err) != codes.InvalidArgument || badField(err) != "body_json" || !strings.Contains(err.Error(), "card data") {
			t.Errorf("%s with card data: error = %v, want INVALID_ARGUMENT naming body_json and card data", name, err)
		}
		if n := len(e.inbox(netBob)) + len(e.inbox(netAlice)); n != before {
			t.Errorf("%s with card data delivered %d messages", name, n-before)
		}
	}
	// The pair did not move: the proposal still goes through.
	e.mustReply(netBob, open.GetMessageId(), "proposal", `{"proposal":{"payment":{"reference":"ledger:1"}}}`)

	// A service protocol does not open with SendMessage: the category is
	// the operation's.
	_, err := e.client.SendMessage(t.Context(), &dispatcherv1.SendMessageRequest{
		Sender: netAlice, To: to, MessageType: "new_task_request", Protocol: e.hashes["allocate"], BodyJson: `{"task":{}}`,
	})
	if status.Code(err) != codes.InvalidArgument || badField(err) != "protocol" {
		t.Errorf("SendMessage(allocate) error = %v, want INVALID_ARGUMENT naming protocol", err)
	}
}

// A message after its deadline is refused naming the deadline even before
// the timer fires: the pair's state holds the deadline, and the server's
// clock is the judge.
func TestNewRequest_lateMessageRefusedBeforeTheTimerFires(t *testing.T) {
	e := startService(t)
	open := e.request("transact", map[string]time.Duration{"proposal_timeout": 30 * time.Second}, netBob)
	e.clock.Advance(31 * time.Second)
	_, err := e.reply(netBob, open.GetMessageId(), "proposal", `{"proposal":{}}`)
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("late proposal: error = %v, want FAILED_PRECONDITION", err)
	}
	m := last(e.inbox(netBob))
	var pe struct{ Rule, Error string }
	_ = json.Unmarshal(m.Body, &pe)
	if m.Type != "protocol_error" || pe.Rule != "DEADLINE_PASSED" || !strings.Contains(pe.Error, "proposal_timeout") {
		t.Errorf("bob's last message = %s %s, want protocol_error DEADLINE_PASSED naming proposal_timeout", m.Type, m.Body)
	}
}
