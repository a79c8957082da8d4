package server

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/services/dispatcher/internal/approval"
	"github.com/parleyhq/parley/services/dispatcher/internal/order"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
	"github.com/parleyhq/parley/services/dispatcher/internal/store/boltstore"
)

func ownerKey(b byte) ed25519.PrivateKey {
	seed := make([]byte, ed25519.SeedSize)
	seed[0] = b
	return ed25519.NewKeyFromSeed(seed)
}

// transactToOffer runs a transact dialogue from alice to bob up to bob's
// offer with body offerBody, and returns the dialogue id and the offer's id.
func (e *serviceEnv) transactToOffer(offerBody string) (string, string) {
	e.t.Helper()
	req := e.request("transact", nil, netBob)
	proposal := e.mustReply(netBob, req.GetMessageId(), "proposal", `{"proposal":{}}`)
	invite := e.mustReply(netAlice, proposal, "invite_offer", `{}`)
	return req.GetDialogueId(), e.mustReply(netBob, invite, "offer", offerBody)
}

// A paid transact acceptance that needs the owner's approval: each bad
// acceptance is refused naming its rule and changes nothing (no order, the
// payment still unused); the good one forms the order, reserves the
// payment for it, and the payee captures it and confirms.
func TestTransact_paidAcceptanceNeedsPaymentAndSignedApproval(t *testing.T) {
	e := startService(t)
	key, other := ownerKey(1), ownerKey(2)
	e.reg.addAgent(&registryv1.Agent{Name: netAlice, Owner: &registryv1.Owner{ApprovalPublicKey: key.Public().(ed25519.PublicKey)}})
	dlg, offer := e.transactToOffer(`{"offer":{"what":"ship"},"price":{"amount_micros":2500000,"currency":"USD"},"payment_required":true,"human_authorization_required":true}`)
	orderID := order.ID(dlg, netBob)
	pay := e.createPayment(netAlice, netBob, 2_500_000)
	_, payID, _ := cutPayment(pay.GetName())
	ref := map[string]string{"provider": "ledger", "reference": payID}
	terms := approval.Terms{Order: orderID, AmountMicros: 2_500_000, Currency: "USD", Payee: netBob}
	later := e.clock.Now().Add(10 * time.Minute)
	otherTerms := terms
	otherTerms.AmountMicros = 1

	for _, c := range []struct {
		name string
		body any
		code codes.Code
		rule string
	}{
		{"no payment", map[string]any{}, codes.FailedPrecondition, "PAYMENT_MISSING"},
		{"card data", map[string]any{"payment": map[string]any{"provider": "ledger", "reference": payID, "card": "4111 1111 1111 1111"}}, codes.InvalidArgument, "INVALID_ARGUMENT"},
		{"no approval", map[string]any{"payment": ref}, codes.FailedPrecondition, "APPROVAL_MISSING"},
		{"a boolean claim", map[string]any{"payment": ref, "human_authorization": true}, codes.FailedPrecondition, "APPROVAL_MISSING"},
		{"signed by the wrong key", map[string]any{"payment": ref, "human_authorization": approval.Sign(other, terms, later)}, codes.FailedPrecondition, "APPROVAL_SIGNATURE"},
		{"over other terms", map[string]any{"payment": ref, "human_authorization": approval.Sign(key, otherTerms, later)}, codes.FailedPrecondition, "APPROVAL_TERMS"},
		{"expired", map[string]any{"payment": ref, "human_authorization": approval.Sign(key, terms, e.clock.Now())}, codes.FailedPrecondition, "APPROVAL_EXPIRED"},
	} {
		_, err := e.reply(netAlice, offer, "accept_offer", mustJSON(c.body))
		if status.Code(err) != c.code || grpcerr.Reason(err) != c.rule {
			t.Errorf("accept_offer (%s) error = %v (reason %q), want %v %s", c.name, err, grpcerr.Reason(err), c.code, c.rule)
		}
	}
	// Nothing changed: no order, the payment unused.
	if _, err := e.client.GetOrder(t.Context(), &dispatcherv1.GetOrderRequest{Name: netAlice + "/orders/" + orderID}); status.Code(err) != codes.NotFound {
		t.Fatalf("GetOrder after refused acceptances error = %v, want NOT_FOUND", err)
	}
	if p, _ := e.client.GetPayment(t.Context(), &dispatcherv1.GetPaymentRequest{Name: pay.GetName()}); p.GetState() != dispatcherv1.PaymentState_PAYMENT_STATE_AUTHORIZED {
		t.Fatalf("payment after refused acceptances = %v, want authorized", p)
	}

	good := mustJSON(map[string]any{"payment": ref, "human_authorization": approval.Sign(key, terms, later)})
	accept := e.mustReply(netAlice, offer, "accept_offer", good)
	p, err := e.client.GetPayment(t.Context(), &dispatcherv1.GetPaymentRequest{Name: pay.GetName()})
	if err != nil || p.GetState() != dispatcherv1.PaymentState_PAYMENT_STATE_RESERVED || p.GetOrder() != orderID {
		t.Fatalf("payment after the acceptance = %v, %v; want reserved for order %s", p, err, orderID)
	}
	if p, err := e.client.CapturePayment(t.Context(), &dispatcherv1.CapturePaymentRequest{Name: netBob + "/payments/" + payID}); err != nil ||
		p.GetState() != dispatcherv1.PaymentState_PAYMENT_STATE_CAPTURED {
		t.Fatalf("CapturePayment by bob = %v, %v", p, err)
	}
	e.mustReply(netBob, accept, "payment_confirmed", mustJSON(map[string]any{"payment": ref}))
	o, err := e.client.GetOrder(t.Context(), &dispatcherv1.GetOrderRequest{Name: netBob + "/orders/" + orderID})
	if err != nil || o.GetLastMessageType() != "payment_confirmed" {
		t.Errorf("GetOrder(bob's view of %s) = %v, %v; want the order, paid", orderID, o, err)
	}
}

// The owner's limits at acceptance: a hard limit refuses even with an
// approval; passing an automated limit needs one.
func TestAllocate_spendingLimitsAtAcceptance(t *testing.T) {
	e := startService(t)
	key := ownerKey(1)
	perTx, perDay := int64(1_000_000), int64(3_000_000)
	e.reg.addAgent(&registryv1.Agent{Name: netAlice, Owner: &registryv1.Owner{
		ApprovalPublicKey: key.Public().(ed25519.PublicKey), DailyLimitMicroUsd: 4_000_000, TransactionLimitMicroUsd: 2_000_000,
		AutomatedLimitPerTransactionMicroUsd: &perTx, AutomatedLimitPerDayMicroUsd: &perDay,
	}})
	later := e.clock.Now().Add(time.Minute)
	round := func(amount int64, approved bool) error {
		req := e.request("allocate", map[string]time.Duration{"invite_offer_timeout": 30 * time.Second}, netBob)
		offer := e.mustReply(netBob, req.GetMessageId(), "offer", fmt.Sprintf(`{"offer":{},"offer_timeout":60,"price":{"amount_micros":%d,"currency":"USD"}}`, amount))
		body := map[string]any{}
		if approved {
			body["human_authorization"] = approval.Sign(key, approval.Terms{Order: order.ID(req.GetDialogueId(), netBob), AmountMicros: amount, Currency: "USD", Payee: netBob}, later)
		}
		_, err := e.reply(netAlice, offer, "accept_offer", mustJSON(body))
		return err
	}
	for _, c := range []struct {
		name     string
		amount   int64
		approved bool
		rule     string // "" accepts
	}{
		{"within every limit", 1_000_000, false, ""},
		{"over the transaction limit, approved", 2_000_001, true, "SPENDING_LIMIT"},
		{"over the automated transaction limit", 1_500_000, false, "APPROVAL_MISSING"},
		{"over the automated transaction limit, approved", 1_500_000, true, ""}, // day: 2.5
		{"over the automated daily limit", 1_000_000, false, "APPROVAL_MISSING"},
		{"over the automated daily limit, approved", 1_000_000, true, ""}, // day: 3.5
		{"over the daily limit, approved", 600_000, true, "SPENDING_LIMIT"},
	} {
		err := round(c.amount, c.approved)
		if grpcerr.Reason(err) != c.rule && !(c.rule == "" && err == nil) {
			t.Errorf("%s: accept_offer error = %v, want rule %q", c.name, err, c.rule)
		}
	}
}

// An acceptance the pair then refuses (the offer was revoked first) keeps
// nothing the payment gate did: the payment is free again and the day's
// spending is back where it was.
func TestTransact_refusedAcceptanceReleasesItsPayment(t *testing.T) {
	e := startService(t)
	e.reg.addAgent(&registryv1.Agent{Name: netAlice, Owner: &registryv1.Owner{DailyLimitMicroUsd: 3_000_000}})
	req := e.request("transact", nil, netBob)
	proposal := e.mustReply(netBob, req.GetMessageId(), "proposal", `{"proposal":{}}`)
	invite := e.mustReply(netAlice, proposal, "invite_offer", `{}`)
	offer := e.mustReply(netBob, invite, "offer", `{"offer":{},"price":{"amount_micros":2000000,"currency":"USD"},"payment_required":true}`)
	e.mustReply(netBob, invite, "revoke_offer", `{}`)
	pay := e.createPayment(netAlice, netBob, 2_000_000)
	_, payID, _ := cutPayment(pay.GetName())
	_, err := e.reply(netAlice, offer, "accept_offer", mustJSON(map[string]any{"payment": map[string]string{"provider": "ledger", "reference": payID}}))
	if grpcerr.Reason(err) != "PROTOCOL_ERROR" {
		t.Fatalf("accept_offer after revoke_offer error = %v, want PROTOCOL_ERROR", err)
	}
	if p, _ := e.client.GetPayment(t.Context(), &dispatcherv1.GetPaymentRequest{Name: pay.GetName()}); p.GetState() != dispatcherv1.PaymentState_PAYMENT_STATE_AUTHORIZED || p.GetOrder() != "" {
		t.Errorf("payment after the refused acceptance = %v, want authorized and unused", p)
	}
	// The day is empty again: 2 more fit under the limit of 3.
	dlg, offer2 := e.transactToOffer(`{"offer":{},"price":{"amount_micros":2000000,"currency":"USD"}}`)
	if _, err := e.reply(netAlice, offer2, "accept_offer", `{}`); err != nil {
		t.Errorf("accept_offer in %s error = %v; the refused acceptance still counts against the day", dlg, err)
	}
}

// A consumer whose agent has no owner registered accepts a paid offer:
// no limits and no key apply, the payment is reserved (this panicked on
// the missing owner).
func TestTransact_paidAcceptanceByAConsumerWithoutOwner(t *testing.T) {
	e := startService(t)
	e.reg.addAgent(&registryv1.Agent{Name: netAlice})
	dlg, offer := e.transactToOffer(`{"offer":{"what":"ship"},"price":{"amount_micros":1000000,"currency":"USD"},"payment_required":true}`)
	pay := e.createPayment(netAlice, netBob, 1_000_000)
	_, payID, _ := cutPayment(pay.GetName())
	e.mustReply(netAlice, offer, "accept_offer", mustJSON(map[string]any{"payment": map[string]string{"provider": "ledger", "reference": payID}}))
	p, err := e.client.GetPayment(t.Context(), &dispatcherv1.GetPaymentRequest{Name: pay.GetName()})
	if err != nil || p.GetState() != dispatcherv1.PaymentState_PAYMENT_STATE_RESERVED || p.GetOrder() != order.ID(dlg, netBob) {
		t.Errorf("payment after the acceptance = %v, %v; want reserved for the order", p, err)
	}
}

// Offers of one pair that the state machine refuses after their terms
// were recorded leave none behind, however they race: the consumer's
// acceptance of the pair's delivered offer is checked against that
// offer's terms, not a refused one's (over alice's limit here).
func TestAllocate_racingRefusedOffersLeaveNoTerms(t *testing.T) {
	e := startService(t)
	e.reg.addAgent(&registryv1.Agent{Name: netAlice, Owner: &registryv1.Owner{TransactionLimitMicroUsd: 2_000_000, DailyLimitMicroUsd: 1_000_000_000}})
	price := func(micros int) string {
		return fmt.Sprintf(`{"offer":{},"price":{"amount_micros":%d,"currency":"USD"}}`, micros)
	}
	for round := range 20 {
		req := e.request("allocate", map[string]time.Duration{"invite_offer_timeout": 30 * time.Second}, netBob)
		offer := e.mustReply(netBob, req.GetMessageId(), "offer", price(1_000_000))
		// Two more offers of the pair at once: an offer cannot follow an
		// offer, so both are refused, after their terms were recorded.
		var (
			wg   sync.WaitGroup
			errs [2]error
		)
		for i := range errs {
			wg.Go(func() { _, errs[i] = e.reply(netBob, req.GetMessageId(), "offer", price(5_000_000+i)) })
		}
		wg.Wait()
		for i, err := range errs {
			if grpcerr.Reason(err) != "PROTOCOL_ERROR" {
				t.Fatalf("round %d: racing offer %d error = %v, want PROTOCOL_ERROR", round, i, err)
			}
		}
		if _, err := e.reply(netAlice, offer, "accept_offer", `{}`); err != nil {
			t.Fatalf("round %d: accept_offer of the 1 USD offer = %v, want it accepted under its own terms", round, err)
		}
	}
}

// sweepingPayments sweeps the dialogue away just before an offer's terms
// are recorded (the sweep running between the reply's read of its dialogue
// and the terms' write), and fails every RemoveOfferTerms, as a crash
// between the terms' write and their undo does.
type sweepingPayments struct {
	store.PaymentStore
	st    *boltstore.Store
	sweep func() // once, then nil
	id    string // the message id of the terms set after the sweep
}

func (p *sweepingPayments) SetOfferTerms(ctx context.Context, dialogue, supplier, id string, terms json.RawMessage) error {
	if p.sweep != nil {
		p.sweep()
		p.sweep, p.id = nil, id
	}
	return p.PaymentStore.SetOfferTerms(ctx, dialogue, supplier, id, terms)
}

func (p *sweepingPayments) RemoveOfferTerms(context.Context, string, string, string) error {
	return errors.New("the process died before the undo")
}

// An offer whose dialogue is swept while it is being sent leaves no terms
// behind: they are not recorded for a dialogue gone, since nothing would
// ever remove them (the sweep that takes a dialogue's terms has run), and
// an undo may never come.
func TestAllocate_offerOfASweptDialogueLeavesNoTerms(t *testing.T) {
	var p *sweepingPayments
	e := startServiceWrapped(t, Options{}, func(st *boltstore.Store) store.PaymentStore {
		p = &sweepingPayments{PaymentStore: st, st: st}
		return p
	})
	req := e.request("allocate", map[string]time.Duration{"invite_offer_timeout": 30 * time.Second}, netBob)
	d := req.GetDialogueId()
	p.sweep = func() {
		ctx := t.Context()
		// On the handler's goroutine: Errorf, not Fatal.
		if _, _, err := p.st.UpdateParticipant(ctx, d, netAlice, func(d *store.Dialogue, _ *store.Participant) error {
			d.Closed, d.CloseTime = true, e.clock.Now().Add(-time.Hour)
			return nil
		}); err != nil {
			t.Errorf("close the dialogue: %v", err)
		}
		if n, err := p.st.SweepDialogues(ctx, e.clock.Now(), 10); err != nil || n != 1 {
			t.Errorf("SweepDialogues = %d, %v; want the dialogue swept", n, err)
		}
	}
	_, err := e.reply(netBob, req.GetMessageId(), "offer", `{"offer":{},"price":{"amount_micros":1000000,"currency":"USD"}}`)
	if err == nil {
		t.Fatal("offer in a swept dialogue accepted, want it refused")
	}
	if p.sweep != nil {
		t.Fatal("the offer's terms were never recorded: the test's sweep did not run")
	}
	// Under the id the offer would have had: lookups are exact.
	if got, err := p.st.OfferTerms(t.Context(), d, netBob, p.id); err != nil || got != nil {
		t.Errorf("offer terms of the swept dialogue = %s, %v; want none", got, err)
	}
}

// undoLessPayments fails every RemoveOfferTerms, as a crash between an
// offer's terms' write and their undo does.
type undoLessPayments struct{ store.PaymentStore }

func (undoLessPayments) RemoveOfferTerms(context.Context, string, string, string) error {
	return errors.New("the process died before the undo")
}

// An acceptance answering a payment_error that restates no terms is
// checked against the terms of the offer the pair's acceptance answered,
// never against those of an offer the pair refused: its terms were
// recorded before the refusal and, when their undo never came (or has not
// come yet), were read as the pair's last, so a price nobody was offered
// refused every later acceptance.
func TestTransact_acceptanceAfterAPaymentErrorIgnoresARefusedOffersTerms(t *testing.T) {
	e := startServiceWrapped(t, Options{}, func(st *boltstore.Store) store.PaymentStore { return undoLessPayments{st} })
	e.reg.addAgent(&registryv1.Agent{Name: netAlice})
	req := e.request("transact", nil, netBob)
	proposal := e.mustReply(netBob, req.GetMessageId(), "proposal", `{"proposal":{}}`)
	invite := e.mustReply(netAlice, proposal, "invite_offer", `{}`)
	offer := e.mustReply(netBob, invite, "offer", `{"offer":{},"price":{"amount_micros":1000000,"currency":"USD"},"payment_required":true}`)
	pay := func() string {
		_, id, _ := cutPayment(e.createPayment(netAlice, netBob, 1_000_000).GetName())
		return mustJSON(map[string]any{"payment": map[string]string{"provider": "ledger", "reference": id}})
	}
	accept := e.mustReply(netAlice, offer, "accept_offer", pay())
	declined := e.mustReply(netBob, accept, "payment_error", `{"error":"declined","offer_timeout":30}`)
	// An offer the pair refuses (only an acceptance may follow a
	// payment_error), at another price.
	if _, err := e.reply(netBob, invite, "offer", `{"offer":{},"price":{"amount_micros":5000000,"currency":"USD"},"payment_required":true}`); grpcerr.Reason(err) != "PROTOCOL_ERROR" {
		t.Fatalf("offer after payment_error error = %v, want PROTOCOL_ERROR", err)
	}
	if _, err := e.reply(netAlice, declined, "accept_offer", pay()); err != nil {
		t.Errorf("accept_offer of the 1 USD offer after its payment_error = %v, want it accepted under that offer's terms", err)
	}
}

// An acceptance whose terms lie more than maxTermsChain payment_errors back
// is refused, never checked as unpriced: past the bound the walk to the
// terms found none, and an acceptance without terms passed the payment
// gate, the owner's limits and its approval (a consumer and a supplier
// together could skip them after 32 payment_errors).
func TestTransact_acceptanceTooFarFromItsTermsIsRefused(t *testing.T) {
	e := startService(t)
	e.reg.addAgent(&registryv1.Agent{Name: netAlice})
	req := e.request("transact", nil, netBob)
	proposal := e.mustReply(netBob, req.GetMessageId(), "proposal", `{"proposal":{}}`)
	invite := e.mustReply(netAlice, proposal, "invite_offer", `{}`)
	last := e.mustReply(netBob, invite, "offer", `{"offer":{},"price":{"amount_micros":1000000,"currency":"USD"},"payment_required":true}`)
	pay := func() string {
		_, id, _ := cutPayment(e.createPayment(netAlice, netBob, 1_000_000).GetName())
		return mustJSON(map[string]any{"payment": map[string]string{"provider": "ledger", "reference": id}})
	}
	for i := range maxTermsChain {
		if i == maxTermsChain-1 { // the offer is maxTermsChain-1 payment_errors back: its terms hold
			if _, err := e.reply(netAlice, last, "accept_offer", `{}`); grpcerr.Reason(err) != "PAYMENT_MISSING" {
				t.Fatalf("accept_offer without payment, %d payment_errors after the offer = %v, want PAYMENT_MISSING", i, err)
			}
		}
		accept := e.mustReply(netAlice, last, "accept_offer", pay())
		last = e.mustReply(netBob, accept, "payment_error", `{"error":"declined","offer_timeout":30}`)
	}
	for _, body := range []string{`{}`, pay()} {
		if _, err := e.reply(netAlice, last, "accept_offer", body); grpcerr.Reason(err) != "OFFER_TERMS_CHAIN" {
			t.Errorf("accept_offer(%s), %d payment_errors after the offer = %v, want OFFER_TERMS_CHAIN", body, maxTermsChain, err)
		}
	}
}
