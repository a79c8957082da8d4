package dialogue

import (
	"context"
	"errors"

	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

// WithdrawnType is the message type the network sends, as from the
// consumer, to every supplier whose pair is still open when the consumer
// closes a service dialogue (socontra.md section 6).
const WithdrawnType = "task_withdrawn"

// errNothingOpen ends a withdrawal that finds no open pair; nothing is
// written.
var errNothingOpen = errors.New("no open pair")

// withdraw sends task_withdrawn from the initiator agent to every receiver
// of the opener of service dialogue id whose pair the protocol still lets
// it reach, before the dialogue closes. A pair that has ended, or a
// protocol without task_withdrawn, is passed over in silence: the close is
// what the consumer asked for. Anything else (not a service dialogue, not
// the initiator, already closed) withdraws nothing.
func (s *Service) withdraw(ctx context.Context, agent, id string) error {
	d, err := s.store.GetDialogue(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil // the close reports it
	}
	if err != nil {
		return err
	}
	if d.Initiator != agent || d.Category != string(mailbox.CategoryService) || d.Protocol == "" || d.Opener == "" || d.Closed {
		return nil
	}
	machine, err := s.machine(ctx, d.Protocol)
	if err != nil || machine == nil {
		return err
	}
	now := s.opts.Now().UTC()
	m := Message{Type: WithdrawnType, Body: []byte(`{"reason":"dialogue_closed"}`)}
	dm := store.DialogueMessage{ID: s.opts.NewID(), DialogueID: d.ID, Sender: agent, Type: m.Type, InReplyTo: d.Opener, Time: now}
	msg := mailbox.Message{
		ID: dm.ID, DialogueID: d.ID, Sender: agent, Category: mailbox.CategoryService, Type: m.Type, Protocol: d.Protocol,
		RecipientType: "supplier", InReplyTo: d.Opener, Body: m.Body, Time: now,
	}
	var (
		accepted []string
		changes  []pairChange
	)
	got, err := s.store.AddMessage(ctx, d.Opener, s.mail.Bound(), func(v store.DialogueView) (store.MessageWrite, error) {
		accepted, changes = nil, nil // the store may run plan more than once
		if v.Dialogue().Closed {
			return store.MessageWrite{}, errNothingOpen
		}
		var pairs []store.PairState
		for _, r := range v.Receivers() {
			if p, ok := v.Participant(r); ok && closedTo(p, agent, m.Type) {
				continue
			}
			change, a, err := stepPair(machine, v, agent, r, m, now)
			var viol *Violation
			if errors.As(err, &viol) {
				continue
			}
			if err != nil {
				return store.MessageWrite{}, err
			}
			pairs = append(pairs, pairState(v.Dialogue(), change.pair, a))
			changes = append(changes, change)
			accepted = append(accepted, r)
		}
		if len(accepted) == 0 {
			return store.MessageWrite{}, errNothingOpen
		}
		return store.MessageWrite{Message: dm, Recipients: accepted, Pairs: pairs, Mail: msg}, nil
	})
	if errors.Is(err, errNothingOpen) || errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	_, err = s.observe(ctx, d, msg, changes)(s.report(ctx, msg, accepted, nil, got))
	var refused *RefusedError
	if errors.As(err, &refused) {
		return nil // every open supplier's mailbox refused it; no pair moved
	}
	return err
}
