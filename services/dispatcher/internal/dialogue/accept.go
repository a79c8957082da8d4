package dialogue

import (
	"context"
	"errors"
	"time"

	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

// Acceptance is a message that would form an order (its type is
// opensOrder in the dialogue's protocol: accept_offer in delegate, allocate
// and transact, including a retry after payment_error), as the
// AcceptanceGate sees it before anything is recorded.
type Acceptance struct {
	DialogueID string
	Protocol   string // the PD's hash
	Initiator  string // the consumer in the service protocols
	Sender     string // who accepts
	// Counterpart is who is accepted: the sender of the message answered.
	Counterpart string
	Type        string
	Body        []byte
	// Answered is the message accepted (an offer, a payment_error; a
	// delegate supplier accepts the new_task_request itself). Its body is
	// in the mailboxes, under Answered.ID.
	Answered  store.DialogueMessage
	MessageID string // the id the acceptance will be recorded under
	Time      time.Time
}

// AcceptanceGate checks an acceptance before it is recorded: payments,
// signed approvals, spending limits. It runs before the dialogue's
// transaction (it may call out), so the state machine may still refuse the
// acceptance afterwards (a revoke that came first, a deadline); a gate that
// reserves something must release it when its acceptance is not recorded
// (Observer does not see it).
type AcceptanceGate interface {
	// CheckAcceptance returns nil to let a through, a *Violation to refuse
	// it (the sender gets a protocol_error naming the rule, and nothing
	// changes), or another error to fail the send as is.
	CheckAcceptance(ctx context.Context, a Acceptance) error
}

// checkAcceptance runs the AcceptanceGate on m when machine says its type
// forms an order. A refusal comes back as the *RefusedError the send
// returns, with the protocol_error already in the sender's mailbox.
func (s *Service) checkAcceptance(ctx context.Context, machine Machine, d store.Dialogue, answered store.DialogueMessage, sender, id string, m Message, now time.Time) error {
	if s.opts.Acceptances == nil || machine == nil || !machine.OpensOrder(m.Type) {
		return nil
	}
	err := s.opts.Acceptances.CheckAcceptance(ctx, Acceptance{
		DialogueID: d.ID, Protocol: d.Protocol, Initiator: d.Initiator, Sender: sender, Counterpart: answered.Sender,
		Type: m.Type, Body: m.Body, Answered: answered, MessageID: id, Time: now,
	})
	var v *Violation
	if !errors.As(err, &v) {
		return err
	}
	refusals := []Refusal{protocolRefusal(answered.Sender, v)}
	s.protocolErrors(ctx, mailbox.Message{
		ID: id, DialogueID: d.ID, Sender: sender, Category: mailbox.Category(d.Category), Type: m.Type, Protocol: d.Protocol,
		InReplyTo: answered.ID, Time: now,
	}, refusals)
	return &RefusedError{Refusals: refusals, MessageID: id}
}
