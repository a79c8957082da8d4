package server

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
	"github.com/parleyhq/parley/services/dispatcher/internal/order"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

// A deadline that passes unmet has lapsed (issue 14, socontra.md sections
// 8, 9 and 11): at its instant the pair ends with a failure, whether or
// not the timer has fired. The message it guards is refused naming it
// (DEADLINE_PASSED), any other message of the pair too (PAIR_ENDED naming
// it): the supplier is released and the consumer can no longer accept.
// When the timer fires, both parties get one explicit expiry message, and
// an order the pair held fails with the expiry on its trail.

// refusedWith checks that err is the PROTOCOL_ERROR refusal of a message
// from sender and that sender's protocol_error names rule and deadline.
func (e *serviceEnv) refusedWith(what string, err error, sender, rule, deadline string) {
	e.t.Helper()
	if status.Code(err) != codes.FailedPrecondition || grpcerr.Reason(err) != "PROTOCOL_ERROR" {
		e.t.Errorf("%s: error = %v, want FAILED_PRECONDITION PROTOCOL_ERROR", what, err)
		return
	}
	if md := errorMetadata(err); md["refused_0_rule"] != rule || md["refused_0_deadline"] != deadline {
		e.t.Errorf("%s: ErrorInfo metadata = %v, want refused_0_rule %s and refused_0_deadline %s", what, md, rule, deadline)
	}
	m := last(e.inbox(sender))
	var pe struct{ Rule, Error string }
	_ = json.Unmarshal(m.Body, &pe)
	if m.Type != "protocol_error" || pe.Rule != rule || !strings.Contains(pe.Error, deadline) {
		e.t.Errorf("%s: %s's last message = %s %s, want protocol_error %s naming %s", what, sender, m.Type, m.Body, rule, deadline)
	}
}

// Every deadline of the three built-in protocols lapses through the
// server, at exactly its instant.
func TestServiceDeadlines_lapseEndsThePairAtItsInstant(t *testing.T) {
	sec := time.Second
	tests := []struct {
		name     string
		protocol string
		timeouts map[string]time.Duration
		steps    []step // after the opener; the last one sets the deadline (or none: the opener did)
		deadline string
		late     step // the guarded message, sent at the deadline
		other    step // a message the pair would take but for the lapse; none when only the consumer's close could reach bob
		order    dispatcherv1.OrderState
	}{
		{
			name: "delegate: the supplier did not accept in time", protocol: "delegate",
			timeouts: map[string]time.Duration{"offer_timeout": 10 * sec},
			deadline: "offer_timeout", late: supp("accept_offer", `{}`),
		},
		{
			name: "allocate: no offer in the window", protocol: "allocate",
			timeouts: map[string]time.Duration{"invite_offer_timeout": 10 * sec},
			deadline: "invite_offer_timeout", late: supp("offer", `{"offer":{}}`),
		},
		{
			name: "allocate: the offer was not accepted in time", protocol: "allocate",
			steps:    []step{supp("offer", `{"offer":{},"offer_timeout":10}`)},
			deadline: "offer_timeout", late: cons("accept_offer", `{}`), other: cons("reject_offer", `{}`),
		},
		{
			name: "transact: no proposal in the window", protocol: "transact",
			timeouts: map[string]time.Duration{"proposal_timeout": 10 * sec},
			deadline: "proposal_timeout", late: supp("proposal", `{"proposal":{}}`),
		},
		{
			name: "transact: no offer after the invitation", protocol: "transact",
			steps:    []step{supp("proposal", `{"proposal":{}}`), cons("invite_offer", `{"invite_offer_timeout":10}`)},
			deadline: "invite_offer_timeout", late: supp("offer", `{"offer":{}}`), other: step{answers: 1, typ: "task_withdrawn", body: `{}`},
		},
		{
			// The supplier is released: it has nothing left to revoke.
			name: "transact: the offer was not accepted in time", protocol: "transact",
			steps:    []step{supp("proposal", `{"proposal":{}}`), cons("invite_offer", `{}`), supp("offer", `{"offer":{},"offer_timeout":10}`)},
			deadline: "offer_timeout", late: cons("accept_offer", `{}`), other: step{fromSupplier: true, answers: 2, typ: "revoke_offer", body: `{}`},
		},
		{
			// The order formed at the first acceptance; the lapse fails it.
			name: "transact: no new acceptance after a payment error", protocol: "transact",
			steps: []step{
				supp("proposal", `{"proposal":{}}`), cons("invite_offer", `{}`), supp("offer", `{"offer":{}}`), cons("accept_offer", `{}`),
				supp("payment_error", `{"error":"declined","offer_timeout":10}`),
			},
			deadline: "offer_timeout", late: cons("accept_offer", `{}`), other: cons("task_withdrawn", `{}`),
			order: dispatcherv1.OrderState_ORDER_STATE_FAILED,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := startService(t)
			open := e.request(tt.protocol, tt.timeouts, netBob)
			ids := []string{open.GetMessageId()}
			send := func(st step, answerIdx int) (string, error) {
				if st.answers >= 0 {
					answerIdx = st.answers
				}
				from := netAlice
				if st.fromSupplier {
					from = netBob
				}
				res, err := e.reply(from, ids[answerIdx], st.typ, st.body)
				return res.GetMessageId(), err
			}
			for i, st := range tt.steps {
				id, err := send(st, i)
				if err != nil {
					t.Fatalf("step %d (%s): %v", i, st.typ, err)
				}
				ids = append(ids, id)
			}
			at := e.clock.Now().Add(10 * time.Second)
			e.clock.Advance(10 * time.Second)

			// Lapsed before the timer fires.
			sender := func(st step) string {
				if st.fromSupplier {
					return netBob
				}
				return netAlice
			}
			_, err := send(tt.late, len(ids)-1)
			e.refusedWith("the late "+tt.late.typ, err, sender(tt.late), "DEADLINE_PASSED", tt.deadline)
			if tt.other.typ != "" {
				_, err = send(tt.other, len(ids)-1)
				e.refusedWith(tt.other.typ+" after the lapse", err, sender(tt.other), "PAIR_ENDED", tt.deadline)
			}

			// An order the pair held reads failed from the deadline on, with
			// the expiry last on its trail, before its timer records it
			// (GetOrder, ListOrders and its state filter), and the same after.
			checkOrder := func(when string) {
				t.Helper()
				list, err := e.client.ListOrders(t.Context(), &dispatcherv1.ListOrdersRequest{Parent: netAlice})
				if err != nil {
					t.Fatal(err)
				}
				switch {
				case tt.order == 0 && len(list.GetOrders()) != 0:
					t.Errorf("%s: orders = %v, want none", when, list.GetOrders())
				case tt.order != 0 && len(list.GetOrders()) != 1:
					t.Errorf("%s: orders = %v, want one", when, list.GetOrders())
				case tt.order != 0:
					o := list.GetOrders()[0]
					trail := o.GetTransitions()
					if o.GetState() != tt.order || len(trail) == 0 || trail[len(trail)-1].GetMessageType() != tt.deadline+"_expired" ||
						trail[len(trail)-1].GetSender() != "" || !trail[len(trail)-1].GetTime().AsTime().Equal(at) || !o.GetUpdateTime().AsTime().Equal(at) {
						t.Errorf("%s: order = %v, want %v with the expiry last on its trail, from the network at %s", when, o, tt.order, at)
					}
					got, err := e.client.GetOrder(t.Context(), &dispatcherv1.GetOrderRequest{Name: o.GetName()})
					if err != nil || !proto.Equal(got, o) {
						t.Errorf("%s: GetOrder(%s) = %v, %v; want %v", when, o.GetName(), got, err, o)
					}
					for st, want := range map[dispatcherv1.OrderState]int{tt.order: 1, dispatcherv1.OrderState_ORDER_STATE_ACTIVE: 0} {
						l, err := e.client.ListOrders(t.Context(), &dispatcherv1.ListOrdersRequest{Parent: netAlice, State: st})
						if err != nil || len(l.GetOrders()) != want {
							t.Errorf("%s: ListOrders(state %v) = %v, %v; want %d", when, st, l.GetOrders(), err, want)
						}
					}
				}
			}
			checkOrder("before the timer fires")

			// The timer fires once: one expiry to each party.
			if n, err := e.srv.deadlines.FireDue(t.Context()); n != 1 || err != nil {
				t.Fatalf("FireDue() = %d, %v; want one expiry", n, err)
			}
			if n, err := e.srv.deadlines.FireDue(t.Context()); n != 0 || err != nil {
				t.Errorf("FireDue(again) = %d, %v; want nothing: a deadline fires once", n, err)
			}
			for _, agent := range []string{netAlice, netBob} {
				var got []mailbox.Message
				for _, m := range e.inbox(agent) {
					if m.Type == tt.deadline+"_expired" {
						got = append(got, m)
					}
				}
				var body struct{ Deadline, DeadlineTime, Outcome string }
				if len(got) == 1 {
					_ = json.Unmarshal(got[0].Body, &body)
				}
				if len(got) != 1 || got[0].DialogueID != open.GetDialogueId() || got[0].Category != mailbox.CategoryService || got[0].Sender != "" ||
					body.Deadline != tt.deadline || body.Outcome != "failure" || body.DeadlineTime != at.Format(time.RFC3339) {
					t.Errorf("%s's expiries = %+v (body %+v), want one %s_expired from the network, failed, at %s", agent, got, body, tt.deadline, at.Format(time.RFC3339))
				}
			}
			// Still lapsed after the firing.
			_, err = send(tt.late, len(ids)-1)
			e.refusedWith("the late "+tt.late.typ+" after the expiry", err, sender(tt.late), "DEADLINE_PASSED", tt.deadline)

			checkOrder("after the expiry")
			if tt.order != 0 {
				// Recorded by the firing, not only read so.
				stored, err := e.srv.opts.Orders.GetOrder(t.Context(), order.ID(open.GetDialogueId(), netBob))
				if n := len(stored.Transitions); err != nil || n == 0 || stored.Transitions[n-1].Type != tt.deadline+"_expired" || stored.State != store.OrderFailed {
					t.Errorf("stored order after the expiry = %+v, %v; want FAILED with the expiry recorded last", stored, err)
				}
			}

			// The pair has ended: the consumer's close withdraws nothing from bob.
			if _, err := e.client.CloseDialogue(t.Context(), &dispatcherv1.CloseDialogueRequest{Name: netAlice + "/dialogues/" + open.GetDialogueId()}); err != nil {
				t.Fatal(err)
			}
			for _, m := range e.inbox(netBob) {
				if m.Type == "task_withdrawn" {
					t.Errorf("bob got task_withdrawn after the lapse: %+v", m)
				}
			}
		})
	}
}

// A lapse is per (dialogue, supplier): the invited supplier's window ends
// its pair alone, the other supplier is not told, and the consumer
// backtracks to the next-ranked proposal and forms an order with it.
func TestTransact_lapseEndsOnePairAndTheConsumerBacktracks(t *testing.T) {
	e := startService(t)
	open := e.request("transact", map[string]time.Duration{"proposal_timeout": 30 * time.Second}, netBob, netCarol)
	bobs := e.mustReply(netBob, open.GetMessageId(), "proposal", `{"proposal":{"rank":1}}`)
	carols := e.mustReply(netCarol, open.GetMessageId(), "proposal", `{"proposal":{"rank":2}}`)
	invite := e.mustReply(netAlice, bobs, "invite_offer", `{"invite_offer_timeout":10}`)
	e.clock.Advance(10 * time.Second)
	_, err := e.reply(netBob, invite, "offer", `{"offer":{}}`)
	e.refusedWith("bob's late offer", err, netBob, "DEADLINE_PASSED", "invite_offer_timeout")
	if n, err := e.srv.deadlines.FireDue(t.Context()); n != 1 || err != nil {
		t.Fatalf("FireDue() = %d, %v; want bob's invitation to expire", n, err)
	}
	for _, m := range e.inbox(netCarol) {
		if strings.HasSuffix(m.Type, "_expired") {
			t.Errorf("carol was told of an expiry: %+v", m)
		}
	}

	// Backtrack: carol's pair is untouched.
	invite2 := e.mustReply(netAlice, carols, "invite_offer", `{"invite_offer_timeout":10}`)
	offer := e.mustReply(netCarol, invite2, "offer", `{"offer":{}}`)
	e.mustReply(netAlice, offer, "accept_offer", `{}`)
	for agent, want := range map[string]int{netAlice: 1, netCarol: 1, netBob: 0} {
		list, err := e.client.ListOrders(t.Context(), &dispatcherv1.ListOrdersRequest{Parent: agent})
		if err != nil || len(list.GetOrders()) != want {
			t.Errorf("ListOrders(%s) = %v, %v; want %d", agent, list.GetOrders(), err, want)
			continue
		}
		if want == 1 && list.GetOrders()[0].GetSupplier() != netCarol {
			t.Errorf("%s's order = %v, want carol's", agent, list.GetOrders()[0])
		}
	}
}
