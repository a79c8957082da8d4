package server

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"google.golang.org/grpc/codes"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/services/dispatcher/internal/approval"
	"github.com/parleyhq/parley/services/dispatcher/internal/dialogue"
	"github.com/parleyhq/parley/services/dispatcher/internal/directory"
	"github.com/parleyhq/parley/services/dispatcher/internal/order"
	"github.com/parleyhq/parley/services/dispatcher/internal/payment"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

// The money side of a reply in a dialogue whose PD has a state machine
// (internal/payment). Before the dialogue layer sees the reply (card
// data was refused in any body already, internal/carddata):
//   - a message of a type that a message marked opensOrder answers (offer,
//     payment_error) has its terms checked and recorded before it is
//     delivered (removed if it is not), keyed by (dialogue, its sender,
//     the id it is recorded under);
//   - a message marked opensOrder (accept_offer) goes through the payment
//     gate: payment, the owner's limits and signed approval, against the
//     recorded terms of the message it answers (when that message stated
//     none, a payment_error, those of the offer its acceptance answered:
//     acceptedTerms). If the reply is then not delivered (a lost race with
//     revoke_offer, a deadline), the gate's effects are undone.
//
// The check runs outside the dialogue's transaction (it asks the registry
// for the consumer's owner), so it holds no lock on the pair: the pair's
// state machine still decides, in its transaction, whether the reply is
// accepted. Terms recorded for a reply that is then not delivered are
// removed by done; should that never run (a crash), they still belong to
// their dialogue, whose sweep removes them: the store records terms only
// for a dialogue it holds, in a transaction ordered with the sweep.

// ownerSource reads an agent's owner details from the registry.
type ownerSource struct {
	c registryv1.RegistryServiceClient
}

func (o ownerSource) owner(ctx context.Context, agent string) (payment.Owner, error) {
	a, err := o.c.GetAgent(ctx, &registryv1.GetAgentRequest{Name: agent})
	if err != nil {
		return payment.Owner{}, registryError(err)
	}
	ow := a.GetOwner()
	if ow == nil { // no owner registered: no limits, no key
		return payment.Owner{}, nil
	}
	out := payment.Owner{
		TransactionLimit: ow.GetTransactionLimitMicroUsd(), DailyLimit: ow.GetDailyLimitMicroUsd(),
		AutomatedPerTransaction: ow.AutomatedLimitPerTransactionMicroUsd, AutomatedPerDay: ow.AutomatedLimitPerDayMicroUsd,
	}
	if k := ow.GetApprovalPublicKey(); len(k) == ed25519.PublicKeySize {
		out.ApprovalKey = ed25519.PublicKey(k)
	}
	return out, nil
}

// moneyCheck is what checkMoney decided for one reply; done finishes it
// once the reply's fate is known.
type moneyCheck struct {
	s          *Server
	acceptance *payment.Acceptance // set when the gate accepted it
	// offer, when set, is the id the reply is to be recorded under, whose
	// terms checkMoney recorded ahead of delivery: removed if it is not
	// delivered under that id.
	offer    string
	dialogue string
	sender   string
}

// id is the id the reply must be recorded under; "" for any.
func (m *moneyCheck) id() string {
	if m == nil {
		return ""
	}
	return m.offer
}

// done finishes the check: res is the reply's result when it was sent.
func (m *moneyCheck) done(ctx context.Context, delivered bool, res dialogue.Result) {
	if m == nil {
		return
	}
	// On a context of its own: the caller's may be what just ended.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	switch {
	case !delivered && m.acceptance != nil:
		if err := m.s.payments.Undo(ctx, *m.acceptance); err != nil {
			m.s.logger.ErrorContext(ctx, "an undelivered acceptance still counts against its owner's day or holds its payment",
				slog.String("order", m.acceptance.Order), slog.Any("err", err))
		}
	case m.offer != "" && (!delivered || res.MessageID != m.offer):
		// Refused, or a repeat of a request sent before (under its own
		// id): these terms are no delivered message's. Exactly these go;
		// another offer's of the pair, recorded meanwhile, stay.
		if err := m.s.opts.Payments.RemoveOfferTerms(ctx, m.dialogue, m.sender, m.offer); err != nil {
			m.s.logger.ErrorContext(ctx, "a refused offer's terms stay recorded under its unused id; no acceptance can answer it",
				slog.String("dialogue", m.dialogue), slog.Any("err", err))
		}
	}
}

// checkMoney runs the money checks of a reply by sender to inReplyTo; nil
// means there is nothing to finish. A refusal is a *payment.Refusal or
// an *approval.Refusal.
func (s *Server) checkMoney(ctx context.Context, sender, inReplyTo, typ string, body []byte) (*moneyCheck, error) {
	if s.payments == nil {
		return nil, nil
	}
	answered, err := s.opts.Dialogues.GetDialogueMessage(ctx, inReplyTo)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil // the dialogue layer refuses it
	}
	if err != nil {
		return nil, err
	}
	d, err := s.opts.Dialogues.GetDialogue(ctx, answered.DialogueID)
	if errors.Is(err, store.ErrNotFound) || (err == nil && d.Protocol == "") {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	pr, err := s.dir.Protocol(ctx, d.Protocol, nil)
	if err != nil || pr.StateMachine == nil {
		return nil, nil //nolint:nilerr // the dialogue layer reports an unknown protocol
	}
	opens, termTypes := orderTypes(pr)
	switch {
	case slices.Contains(opens, typ):
		supplier, payee := answered.Sender, answered.Sender
		if sender != d.Initiator { // delegate: the supplier accepts the consumer's request
			supplier, payee = sender, sender
		}
		raw, err := s.acceptedTerms(ctx, d.ID, answered, opens)
		if err != nil {
			return nil, err
		}
		terms, _, err := payment.ParseTerms(raw)
		if err != nil {
			return nil, err
		}
		a := payment.Acceptance{Order: order.ID(d.ID, supplier), Consumer: d.Initiator, Supplier: payee, Terms: terms, Body: body, Time: s.opts.Now()}
		if terms.Price != nil || terms.HumanAuthorizationRequired {
			if a.Owner, err = s.owners.owner(ctx, d.Initiator); err != nil {
				return nil, err
			}
		}
		if err := s.payments.Accept(ctx, a); err != nil {
			return nil, err
		}
		return &moneyCheck{s: s, acceptance: &a}, nil
	case slices.Contains(termTypes, typ):
		_, found, err := payment.ParseTerms(body)
		if err != nil || !found {
			return nil, err
		}
		// Recorded before delivery, under the id the reply will have: the
		// consumer may accept the moment the offer reaches its mailbox,
		// and its acceptance is checked against the terms of the message
		// it answers (recorded after, a quick acceptance passed as
		// unpriced and reserved no payment). Keyed by message, a refused
		// offer removes its own terms and no other's, however many
		// offers of the pair race.
		id := dialogue.NewID()
		err = s.opts.Payments.SetOfferTerms(ctx, d.ID, sender, id, body)
		if errors.Is(err, store.ErrNotFound) {
			return nil, nil // swept meanwhile: the dialogue layer refuses it
		}
		if err != nil {
			return nil, err
		}
		return &moneyCheck{s: s, offer: id, dialogue: d.ID, sender: sender}, nil
	}
	return nil, nil
}

// maxTermsChain bounds acceptedTerms' walk back: each payment_error that
// restates no terms is one step (two reads) further from its offer.
const maxTermsChain = 32

// ruleTermsChain refuses an acceptance whose terms lie beyond
// maxTermsChain: refused, not checked as unpriced, which would skip the
// payment, the owner's limits and its approval.
const ruleTermsChain payment.Rule = "OFFER_TERMS_CHAIN"

// acceptedTerms returns the terms an acceptance of answered is checked
// against, as answered's sender (the pair's side that states terms)
// recorded them: answered's own; when it stated none and answers an
// earlier acceptance (a payment_error answering an accept_offer), those of
// the message that acceptance answered, and so on back, at most
// maxTermsChain messages (a *payment.Refusal beyond); else the pair's
// terms recorded before terms were kept per message (id ""). The walk
// goes through stored messages only, so the terms of a message never
// delivered (refused, and their removal not come yet, or never: a crash)
// are never read, unlike the pair's latest terms, which may be such.
func (s *Server) acceptedTerms(ctx context.Context, dialogue string, answered store.DialogueMessage, opens []string) (json.RawMessage, error) {
	supplier, m := answered.Sender, answered
	for range maxTermsChain {
		raw, err := s.opts.Payments.OfferTerms(ctx, dialogue, supplier, m.ID)
		if err != nil || raw != nil {
			return raw, err
		}
		acceptance, ok, err := s.storedMessage(ctx, m.InReplyTo)
		if err != nil {
			return nil, err
		}
		if !ok || !slices.Contains(opens, acceptance.Type) {
			return s.opts.Payments.OfferTerms(ctx, dialogue, supplier, "")
		}
		prev, ok, err := s.storedMessage(ctx, acceptance.InReplyTo)
		if err != nil {
			return nil, err
		}
		if !ok || prev.Sender != supplier {
			return s.opts.Payments.OfferTerms(ctx, dialogue, supplier, "")
		}
		m = prev
	}
	return nil, &payment.Refusal{Rule: ruleTermsChain, Detail: fmt.Sprintf(
		"the terms this acceptance answers are more than %d payment_errors back: the supplier must restate them (in its payment_error) before an acceptance", maxTermsChain)}
}

// storedMessage returns the dialogue message id; ok false when there is
// none (id "", or not stored).
func (s *Server) storedMessage(ctx context.Context, id string) (_ store.DialogueMessage, ok bool, _ error) {
	if id == "" {
		return store.DialogueMessage{}, false, nil
	}
	m, err := s.opts.Dialogues.GetDialogueMessage(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return store.DialogueMessage{}, false, nil
	}
	return m, err == nil, err
}

// orderTypes returns the PD's types marked opensOrder, and the types they
// answer (whose bodies state the terms accepted).
func orderTypes(pr *directory.Protocol) (opens, terms []string) {
	for _, mt := range pr.StateMachine.GetMessages() {
		if mt.GetOpensOrder() {
			opens = append(opens, mt.GetType())
			terms = append(terms, mt.GetAnswers()...)
		}
	}
	return opens, terms
}

// moneyStatus is the gRPC status of a money refusal, FAILED_PRECONDITION
// with its rule as the reason. Other errors are not refusals (ok false).
func moneyStatus(err error) (error, bool) {
	var pr *payment.Refusal
	var ar *approval.Refusal
	switch {
	case errors.As(err, &pr):
		return grpcerr.New(codes.FailedPrecondition, pr.Detail, string(pr.Rule), Domain, nil), true
	case errors.As(err, &ar):
		return grpcerr.New(codes.FailedPrecondition, ar.Detail, string(ar.Rule), Domain, nil), true
	}
	return nil, false
}
