package dialogue_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/parleyhq/parley/services/dispatcher/internal/dialogue"
	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
)

// recordingObserver is a dialogue.Observer that remembers what it was told.
type recordingObserver struct {
	mu    sync.Mutex
	moves []dialogue.PairMove
}

func (o *recordingObserver) PairsMoved(_ context.Context, moves []dialogue.PairMove) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.moves = append(o.moves, moves...)
}

func (o *recordingObserver) take() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []string
	for _, m := range o.moves {
		out = append(out, fmt.Sprintf("%s %s→%s %s %s/%s", m.Type, m.Sender, m.Counterpart, m.Initiator, m.Prev, m.Next))
	}
	o.moves = nil
	return out
}

// The Observer hears of every pair a delivered message moved, and of no
// pair whose recipient was refused (by permission, by its full mailbox, or
// by the protocol).
func TestObserver_toldOfDeliveredPairsOnly(t *testing.T) {
	obs := &recordingObserver{}
	e := newEnv(t, dialogue.Options{Protocols: fakeProtocols{}, Observer: obs})
	e.mail.fill(carol)
	ctx := t.Context()
	m := text("task")
	m.Protocol = "0123456789abcdef0123456789abcdef01234567"
	open, err := e.svc.Open(ctx, alice, mailbox.CategoryService, dialogue.List{Direct: []string{bob, carol, dave}}, m)
	if err != nil {
		t.Fatal(err)
	}
	got := obs.take()
	if want := "new_message " + alice + "→" + bob + " " + alice + " /1"; len(got) != 1 || got[0] != want {
		t.Fatalf("moves after Open = %q, want [%q]", got, want)
	}
	bad := text("x")
	bad.Type = "bad"
	if _, err := e.svc.Reply(ctx, bob, open.MessageID, false, bad); err == nil {
		t.Fatal("Reply(bad) succeeded")
	}
	if got := obs.take(); len(got) != 0 {
		t.Errorf("moves after a refused reply = %q, want none", got)
	}
	ok := text("fine")
	ok.Type = "offer"
	if _, err := e.svc.Reply(ctx, bob, open.MessageID, false, ok); err != nil {
		t.Fatal(err)
	}
	// The counterpart is the pair's non-initiator, whoever sends.
	if got, want := obs.take(), "offer "+bob+"→"+bob+" "+alice+" 1/2"; len(got) != 1 || got[0] != want {
		t.Errorf("moves after bob's reply = %q, want [%q]", got, want)
	}
}
