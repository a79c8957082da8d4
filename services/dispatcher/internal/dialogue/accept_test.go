package dialogue_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"

	"github.com/parleyhq/parley/services/dispatcher/internal/dialogue"
	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
)

// refusingGate is an AcceptanceGate that refuses acceptances whose body is
// "no" and remembers every acceptance it saw.
type refusingGate struct {
	mu   sync.Mutex
	seen []dialogue.Acceptance
}

func (g *refusingGate) CheckAcceptance(_ context.Context, a dialogue.Acceptance) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.seen = append(g.seen, a)
	if string(a.Body) == `"no"` {
		return &dialogue.Violation{Rule: "APPROVAL_REQUIRED", Detail: "the acceptance carries no approval"}
	}
	return nil
}

// The gate sees every acceptance (a type that forms an order) before it is
// recorded, and nothing else; one it refuses is not delivered, moves no
// pair, and answers the sender with a protocol_error naming the rule.
func TestAcceptanceGate_checksAcceptancesBeforeTheyAreRecorded(t *testing.T) {
	gate := &refusingGate{}
	obs := &recordingObserver{}
	e := newEnv(t, dialogue.Options{Protocols: fakeProtocols{}, Observer: obs, Acceptances: gate})
	ctx := t.Context()
	m := text("task")
	m.Protocol = "0123456789abcdef0123456789abcdef01234567"
	open, err := e.svc.Open(ctx, alice, mailbox.CategoryService, dialogue.List{Direct: []string{bob}}, m)
	if err != nil {
		t.Fatal(err)
	}
	offer := text("offer")
	offer.Type = "offer"
	res, err := e.svc.Reply(ctx, bob, open.MessageID, false, offer)
	if err != nil {
		t.Fatal(err)
	}
	obs.take()
	bobBefore := len(e.mail.of(bob))

	accept := text("no")
	accept.Type = "accept"
	_, err = e.svc.Reply(ctx, alice, res.MessageID, false, accept)
	var refused *dialogue.RefusedError
	if !errors.As(err, &refused) || !errors.Is(err, dialogue.ErrProtocol) || refused.Refusals[0].Rule != "APPROVAL_REQUIRED" {
		t.Fatalf("refused acceptance: error = %v, want a protocol refusal naming APPROVAL_REQUIRED", err)
	}
	if n := len(e.mail.of(bob)); n != bobBefore {
		t.Errorf("bob got %d messages from a refused acceptance", n-bobBefore)
	}
	if got := obs.take(); len(got) != 0 {
		t.Errorf("a refused acceptance moved pairs: %q", got)
	}
	pe := e.mail.of(alice)[len(e.mail.of(alice))-1]
	var body struct{ Rule string }
	_ = json.Unmarshal(pe.Body, &body)
	if pe.Type != "protocol_error" || body.Rule != "APPROVAL_REQUIRED" || pe.InReplyTo != refused.MessageID {
		t.Errorf("alice's last message = %+v, want protocol_error naming APPROVAL_REQUIRED", pe)
	}

	accept = text("yes")
	accept.Type = "accept"
	ok, err := e.svc.Reply(ctx, alice, res.MessageID, false, accept)
	if err != nil {
		t.Fatalf("accepted acceptance: %v", err)
	}
	gate.mu.Lock()
	defer gate.mu.Unlock()
	if len(gate.seen) != 2 {
		t.Fatalf("the gate saw %d messages, want the two acceptances only", len(gate.seen))
	}
	a := gate.seen[1]
	if a.Sender != alice || a.Counterpart != bob || a.Initiator != alice || a.Answered.ID != res.MessageID || a.Answered.Type != "offer" ||
		a.MessageID != ok.MessageID || a.DialogueID != open.DialogueID || a.Type != "accept" {
		t.Errorf("the gate saw %+v, want alice accepting bob's offer under the id recorded", a)
	}
}
