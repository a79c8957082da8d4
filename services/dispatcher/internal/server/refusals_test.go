package server

import (
	"crypto/ed25519"
	"encoding/json"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/grpcerr"
)

// The bad input, through the network on the built-in protocols:
// each message is refused with an error naming the rule broken (a
// protocol_error to the sender for the state machine's rules), and
// nothing changes: the other party gets nothing, no order forms or moves,
// and the message the pair does allow still goes through. The refusals
// are walked edge by edge in serviceprotocol.TestEveryEdge (generated from
// the PDs), deadlines in lapse_test.go, approvals in acceptance_test.go and
// card data in newrequest_test.go; this test takes each kind once, end to
// end.
func TestServiceRefusals_nameTheRuleAndChangeNothing(t *testing.T) {
	type attempt struct{ sender, inReplyTo, typ, body string }
	tests := []struct {
		name string
		// setup runs a dialogue up to the refusal and returns the bad
		// message and a good one the pair takes afterwards ("" typ: none).
		setup  func(e *serviceEnv) (bad, good attempt)
		code   codes.Code
		reason string
		rule   string // the protocol_error's rule, for PROTOCOL_ERROR
	}{
		{
			name: "a type not allowed in the state", code: codes.FailedPrecondition, reason: "PROTOCOL_ERROR", rule: "NOT_ALLOWED_AFTER",
			setup: func(e *serviceEnv) (attempt, attempt) {
				open := e.request("transact", nil, netBob)
				// An offer before any proposal or invitation.
				return attempt{netBob, open.GetMessageId(), "offer", `{"offer":{}}`},
					attempt{netBob, open.GetMessageId(), "proposal", `{"proposal":{}}`}
			},
		},
		{
			name: "a type sent by the wrong role", code: codes.FailedPrecondition, reason: "PROTOCOL_ERROR", rule: "WRONG_ROLE",
			setup: func(e *serviceEnv) (attempt, attempt) {
				open := e.request("transact", nil, netBob)
				// The supplier sending the consumer's invitation.
				return attempt{netBob, open.GetMessageId(), "invite_offer", `{}`},
					attempt{netBob, open.GetMessageId(), "proposal", `{"proposal":{}}`}
			},
		},
		{
			name: "a message after its deadline", code: codes.FailedPrecondition, reason: "PROTOCOL_ERROR", rule: "DEADLINE_PASSED",
			setup: func(e *serviceEnv) (attempt, attempt) {
				open := e.request("allocate", map[string]time.Duration{"invite_offer_timeout": 10 * time.Second}, netBob)
				e.clock.Advance(10 * time.Second)
				return attempt{netBob, open.GetMessageId(), "offer", `{"offer":{}}`}, attempt{}
			},
		},
		{
			name: "a message for a closed dialogue", code: codes.FailedPrecondition, reason: "DIALOGUE_CLOSED",
			setup: func(e *serviceEnv) (attempt, attempt) {
				open := e.request("allocate", nil, netBob)
				offer := e.mustReply(netBob, open.GetMessageId(), "offer", `{"offer":{}}`)
				if _, err := e.client.CloseDialogue(e.t.Context(), &dispatcherv1.CloseDialogueRequest{Name: netAlice + "/dialogues/" + open.GetDialogueId()}); err != nil {
					e.t.Fatal(err)
				}
				return attempt{netAlice, offer, "accept_offer", `{}`}, attempt{}
			},
		},
		{
			name: "a revoke after acceptance", code: codes.FailedPrecondition, reason: "PROTOCOL_ERROR", rule: "NOT_ALLOWED_AFTER",
			setup: func(e *serviceEnv) (attempt, attempt) {
				open := e.request("transact", nil, netBob)
				proposal := e.mustReply(netBob, open.GetMessageId(), "proposal", `{"proposal":{}}`)
				invite := e.mustReply(netAlice, proposal, "invite_offer", `{}`)
				offer := e.mustReply(netBob, invite, "offer", `{"offer":{}}`)
				accept := e.mustReply(netAlice, offer, "accept_offer", `{}`)
				return attempt{netBob, invite, "revoke_offer", `{}`}, attempt{netBob, accept, "order_complete", `{}`}
			},
		},
		{
			name: "an acceptance over the automated limit without an approval", code: codes.FailedPrecondition, reason: "APPROVAL_MISSING",
			setup: func(e *serviceEnv) (attempt, attempt) {
				perTx := int64(1_000_000)
				e.reg.addAgent(&registryv1.Agent{Name: netAlice, Owner: &registryv1.Owner{
					ApprovalPublicKey: ownerKey(1).Public().(ed25519.PublicKey), AutomatedLimitPerTransactionMicroUsd: &perTx,
				}})
				open := e.request("allocate", nil, netBob)
				offer := e.mustReply(netBob, open.GetMessageId(), "offer", `{"offer":{},"price":{"amount_micros":1500000,"currency":"USD"}}`)
				return attempt{netAlice, offer, "accept_offer", `{}`}, attempt{netAlice, offer, "reject_offer", `{}`}
			},
		},
		{
			name: "an acceptance over the spending limit", code: codes.FailedPrecondition, reason: "SPENDING_LIMIT",
			setup: func(e *serviceEnv) (attempt, attempt) {
				e.reg.addAgent(&registryv1.Agent{Name: netAlice, Owner: &registryv1.Owner{TransactionLimitMicroUsd: 1_000_000}})
				open := e.request("allocate", nil, netBob)
				offer := e.mustReply(netBob, open.GetMessageId(), "offer", `{"offer":{},"price":{"amount_micros":1500000,"currency":"USD"}}`)
				return attempt{netAlice, offer, "accept_offer", `{}`}, attempt{netAlice, offer, "reject_offer", `{}`}
			},
		},
		{
			name: "card data in a message", code: codes.InvalidArgument, reason: "INVALID_ARGUMENT",
			setup: func(e *serviceEnv) (attempt, attempt) {
				open := e.request("allocate", nil, netBob)
				offer := e.mustReply(netBob, open.GetMessageId(), "offer", `{"offer":{}}`)
				return attempt{netAlice, offer, "accept_offer", `{"payment":{"card":"4111111111111111","cvv":"123"}}`},
					attempt{netAlice, offer, "accept_offer", `{}`}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := startService(t)
			bad, good := tt.setup(e)
			other := netBob
			if bad.sender == netBob {
				other = netAlice
			}
			orders := func() string {
				list, err := e.client.ListOrders(t.Context(), &dispatcherv1.ListOrdersRequest{Parent: netAlice})
				if err != nil {
					t.Fatal(err)
				}
				raw, _ := json.Marshal(list.GetOrders())
				return string(raw)
			}
			ordersBefore, otherBefore := orders(), len(e.inbox(other))

			_, err := e.reply(bad.sender, bad.inReplyTo, bad.typ, bad.body)
			if status.Code(err) != tt.code || grpcerr.Reason(err) != tt.reason {
				t.Fatalf("%s from %s: error = %v (reason %q), want %v %s", bad.typ, bad.sender, err, grpcerr.Reason(err), tt.code, tt.reason)
			}
			if tt.rule != "" {
				m := last(e.inbox(bad.sender))
				var pe struct{ Rule string }
				_ = json.Unmarshal(m.Body, &pe)
				if m.Type != "protocol_error" || m.InReplyTo == "" || pe.Rule != tt.rule {
					t.Errorf("%s's last message = %s %s, want a protocol_error of rule %s", bad.sender, m.Type, m.Body, tt.rule)
				}
			}
			if n := len(e.inbox(other)); n != otherBefore {
				t.Errorf("%s got %d messages from the refused %s", other, n-otherBefore, bad.typ)
			}
			if got := orders(); got != ordersBefore {
				t.Errorf("orders after the refusal = %s, want unchanged %s", got, ordersBefore)
			}
			if good.typ != "" {
				if _, err := e.reply(good.sender, good.inReplyTo, good.typ, good.body); err != nil {
					t.Errorf("%s after the refusal: %v; the refusal moved the pair", good.typ, err)
				}
			}
		})
	}
}
