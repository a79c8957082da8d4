package storetest

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

// DialogueBackend is a backend holding both dialogues and the mailboxes
// their writes append to in the same transaction, and the offer terms a
// dialogue's sweep removes.
type DialogueBackend interface {
	store.DialogueStore
	mailbox.Store
	store.PaymentStore
}

// RunDialogues runs the dialogue suite; open returns a new empty store.
func RunDialogues(t *testing.T, open func(t *testing.T) DialogueBackend) {
	t.Run("create and answer", func(t *testing.T) { testDialogueAnswer(t, open(t)) })
	t.Run("full mailboxes", func(t *testing.T) { testDialogueFull(t, open(t)) })
	t.Run("close filters", func(t *testing.T) { testDialogueClose(t, open(t)) })
	t.Run("sweep closed dialogues", func(t *testing.T) { testDialogueSweep(t, open(t)) })
	t.Run("sweep by the dialogue's own time", func(t *testing.T) { testDialogueSweepOwnTime(t, open(t)) })
	t.Run("offer terms", func(t *testing.T) { testOfferTerms(t, open(t)) })
	t.Run("offer terms need their dialogue", func(t *testing.T) { testOfferTermsNeedTheirDialogue(t, open(t)) })
	t.Run("requests", func(t *testing.T) { testDialogueRequests(t, open(t)) })
	t.Run("owners whose names extend others'", func(t *testing.T) { testDialogueNeighbours(t, open(t)) })
	t.Run("request sweep batches", func(t *testing.T) { testSweepRequestBatches(t, open(t)) })
}

func testDialogueRequests(t *testing.T, s DialogueBackend) {
	ctx := t.Context()
	t0 := time.Unix(1_800_000_000, 0).UTC()
	if _, found, err := s.BeginRequest(ctx, alice, "r1", t0, t0.Add(-time.Minute)); err != nil || found {
		t.Fatalf("BeginRequest(new) = found %v, %v; want a new pending record", found, err)
	}
	rec, found, err := s.BeginRequest(ctx, alice, "r1", t0.Add(time.Second), t0.Add(-time.Minute))
	if err != nil || !found || rec.Done || !rec.Time.Equal(t0) {
		t.Errorf("BeginRequest(pending) = %+v, %v, %v; want the pending record of t0", rec, found, err)
	}
	if _, found, _ := s.BeginRequest(ctx, bob, "r1", t0, t0.Add(-time.Minute)); found {
		t.Error("BeginRequest(bob, r1) found alice's request: ids are per sender")
	}
	// A pending record older than stale is taken over.
	if _, found, _ := s.BeginRequest(ctx, alice, "r1", t0.Add(2*time.Minute), t0.Add(time.Minute)); found {
		t.Error("BeginRequest over a stale pending record found it, want it taken over")
	}
	if err := s.FinishRequest(ctx, alice, "r1", json.RawMessage(`{"m":1}`)); err != nil {
		t.Fatal(err)
	}
	rec, found, err = s.BeginRequest(ctx, alice, "r1", t0.Add(time.Hour), t0.Add(time.Hour))
	if err != nil || !found || !rec.Done || string(rec.Result) != `{"m":1}` {
		t.Errorf("BeginRequest(done) = %+v, %v, %v; want the result, even past stale", rec, found, err)
	}
	// Forgetting lets a repeat run again.
	if err := s.FinishRequest(ctx, bob, "r1", nil); err != nil {
		t.Fatal(err)
	}
	if _, found, _ := s.BeginRequest(ctx, bob, "r1", t0, t0); found {
		t.Error("BeginRequest after FinishRequest(nil) found the request")
	}
	if n, err := s.SweepRequests(ctx, t0.Add(time.Minute), 10); err != nil || n != 1 {
		t.Errorf("SweepRequests = %d, %v; want 1 (bob's, started at t0)", n, err)
	}
	if n, err := s.SweepRequests(ctx, t0.Add(3*time.Minute), 10); err != nil || n != 1 {
		t.Errorf("SweepRequests later = %d, %v; want 1 (alice's)", n, err)
	}
}

// testSweepRequestBatches sweeps more request ids than one call may
// remove: each call removes at most its limit, the oldest first, and the
// calls together remove exactly those started before the cut.
func testSweepRequestBatches(t *testing.T, s DialogueBackend) {
	ctx := t.Context()
	t0 := time.Unix(1_800_000_000, 0).UTC()
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Second) }
	// Begun latest first and by two senders, so that neither key nor
	// insertion order is the time order. Some are done, one forgotten.
	const due = 7
	sender := func(i int) string { return []string{alice, bob}[i%2] }
	id := func(i int) string { return fmt.Sprintf("r%d", due-i) }
	for i := due - 1; i >= 0; i-- {
		if _, found, err := s.BeginRequest(ctx, sender(i), id(i), at(i), t0); err != nil || found {
			t.Fatalf("BeginRequest(%s) = found %t, %v; want it recorded", id(i), found, err)
		}
		if i%3 == 0 {
			if err := s.FinishRequest(ctx, sender(i), id(i), json.RawMessage(`{}`)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, _, err := s.BeginRequest(ctx, carol, "forgotten", t0, t0); err != nil {
		t.Fatal(err)
	}
	if err := s.FinishRequest(ctx, carol, "forgotten", nil); err != nil {
		t.Fatal(err)
	}
	// Begun at t0, then taken over when stale at +8s: it must not be swept
	// under its first time, nor use up a batch.
	if _, _, err := s.BeginRequest(ctx, carol, "taken", t0, t0); err != nil {
		t.Fatal(err)
	}
	if _, found, err := s.BeginRequest(ctx, carol, "taken", at(due+1), at(due)); err != nil || found {
		t.Fatalf("BeginRequest(taken, stale) = found %t, %v; want it taken over", found, err)
	}
	// remembered reports whether (sender, id) is still recorded, without
	// recording it anew.
	remembered := func(sender, id string) bool {
		t.Helper()
		_, found, err := s.BeginRequest(ctx, sender, id, at(due+2), t0)
		if err != nil {
			t.Fatal(err)
		}
		if !found {
			if err := s.FinishRequest(ctx, sender, id, nil); err != nil {
				t.Fatal(err)
			}
		}
		return found
	}
	cut := at(due)
	sweepOldestFirst(t, "SweepRequests", due, func(limit int) (int, error) { return s.SweepRequests(ctx, cut, limit) }, func(i int) bool { return !remembered(sender(i), id(i)) }, func(i int) string { return fmt.Sprintf("the request begun at +%ds", i) })
	if !remembered(carol, "taken") {
		t.Error("request taken over at +8s was swept with the cut at +7s, want it kept")
	}
	if n, err := s.SweepRequests(ctx, at(due+2), 10); err != nil || n != 1 {
		t.Errorf("SweepRequests(all) = %d, %v; want 1 (taken)", n, err)
	}
}

// alice, bob and carol are the mailbox suite's agents.

var errPlan = errors.New("plan refused")

// write is the MessageWrite of m to recipients, with its mail.
func write(m store.DialogueMessage, recipients []string, pairs ...store.PairState) store.MessageWrite {
	return store.MessageWrite{
		Message: m, Recipients: recipients, Pairs: pairs,
		Mail: mailbox.Message{Sender: m.Sender, Category: mailbox.CategoryMessage, Type: m.Type, InReplyTo: m.InReplyTo, Body: []byte(`"hi"`), Time: m.Time},
	}
}

func opener(t *testing.T, s DialogueBackend, id string, recipients []string) (store.Dialogue, store.DialogueMessage) {
	t.Helper()
	now := time.Unix(1_800_000_000, 0).UTC()
	d := store.Dialogue{ID: id, Initiator: alice, Category: "message", CreateTime: now, Opener: id + "-m1"}
	m := store.DialogueMessage{ID: id + "-m1", DialogueID: id, Sender: alice, Type: "new_message", Time: now}
	pairs := []store.PairState{{Pair: store.Pair{A: bob, B: alice}, State: json.RawMessage(`{"s":1}`)}}
	got, err := s.CreateDialogue(t.Context(), d, write(m, recipients, pairs...), mailbox.Bound{})
	if err != nil || len(got.Deliveries) != len(recipients) || len(got.Refused) != 0 {
		t.Fatalf("CreateDialogue(%s) = %+v, %v; want it delivered to %v", id, got, err, recipients)
	}
	return d, m
}

func testDialogueAnswer(t *testing.T, s DialogueBackend) {
	ctx := t.Context()
	d, m := opener(t, s, "d1", []string{bob, carol})
	for _, a := range []string{bob, carol} {
		got, err := s.ReadMailbox(ctx, a, 0, 10)
		if err != nil || len(got) != 1 || got[0].Message.ID != m.ID || got[0].Message.DialogueID != "d1" || string(got[0].Message.Body) != `"hi"` {
			t.Errorf("ReadMailbox(%s) = %+v, %v; want the opener, in the same write as its record", a, got, err)
		}
	}
	if got, err := s.GetDialogue(ctx, "d1"); err != nil || got != d {
		t.Errorf("GetDialogue(d1) = %+v, %v; want %+v", got, err, d)
	}
	if got, err := s.GetDialogueMessage(ctx, m.ID); err != nil || got != m {
		t.Errorf("GetDialogueMessage(%s) = %+v, %v; want %+v", m.ID, got, err, m)
	}
	if _, err := s.CreateDialogue(ctx, d, write(m, []string{bob}), mailbox.Bound{}); !errors.Is(err, store.ErrAlreadyExists) {
		t.Errorf("CreateDialogue(d1 again) = %v, want ErrAlreadyExists", err)
	}
	if _, err := s.GetDialogue(ctx, "nope"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetDialogue(nope) = %v, want ErrNotFound", err)
	}
	if _, err := s.AddMessage(ctx, "nope", mailbox.Bound{}, nil); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("AddMessage(answering nope) = %v, want ErrNotFound", err)
	}

	// The view around the opener.
	reply := store.DialogueMessage{ID: "d1-m2", Sender: bob, Type: "message_response", InReplyTo: m.ID, Time: m.Time}
	_, err := s.AddMessage(ctx, m.ID, mailbox.Bound{}, func(v store.DialogueView) (store.MessageWrite, error) {
		if v.Dialogue() != d || v.Answered() != m {
			t.Errorf("view = %+v, %+v; want %+v, %+v", v.Dialogue(), v.Answered(), d, m)
		}
		if !v.Received(bob) || v.Received(alice) || v.Received("clients/x/agents/x") {
			t.Errorf("Received(bob, alice, x) = %v, %v, %v; want true, false, false", v.Received(bob), v.Received(alice), v.Received("clients/x/agents/x"))
		}
		if got := v.Receivers(); !slices.Equal(got, []string{bob, carol}) {
			t.Errorf("Receivers() = %v, want [bob carol]", got)
		}
		if p, ok := v.Participant(alice); !ok || p.Agent != alice {
			t.Errorf("Participant(alice) = %+v, %v; want the sender as participant", p, ok)
		}
		if _, ok := v.Participant("clients/x/agents/x"); ok {
			t.Error("Participant(x) found an agent that took no part")
		}
		if got := string(v.PairState(store.Pair{A: alice, B: bob})); got != `{"s":1}` {
			t.Errorf("PairState(alice, bob) = %s, want the state stored under (bob, alice)", got)
		}
		if got := v.PairState(store.Pair{A: alice, B: carol}); got != nil {
			t.Errorf("PairState(alice, carol) = %s, want nil", got)
		}
		return write(reply, []string{alice}, store.PairState{Pair: store.Pair{A: alice, B: bob}, State: json.RawMessage(`{"s":2}`)}), nil
	})
	if err != nil {
		t.Fatalf("AddMessage(reply): %v", err)
	}
	got, err := s.GetDialogueMessage(ctx, reply.ID)
	if reply.DialogueID = "d1"; err != nil || got != reply {
		t.Errorf("GetDialogueMessage(reply) = %+v, %v; want %+v with the dialogue set", got, err, reply)
	}

	// A failing plan writes nothing.
	_, err = s.AddMessage(ctx, reply.ID, mailbox.Bound{}, func(v store.DialogueView) (store.MessageWrite, error) {
		if !v.Received(alice) || v.Received(bob) {
			t.Errorf("receipts of the reply: alice %v, bob %v; want true, false", v.Received(alice), v.Received(bob))
		}
		return store.MessageWrite{}, errPlan
	})
	if !errors.Is(err, errPlan) {
		t.Errorf("AddMessage(failing plan) = %v, want the plan's error", err)
	}
	_, err = s.AddMessage(ctx, reply.ID, mailbox.Bound{}, func(v store.DialogueView) (store.MessageWrite, error) {
		if got := string(v.PairState(store.Pair{A: bob, B: alice})); got != `{"s":2}` {
			t.Errorf("PairState after the reply = %s, want {\"s\":2}", got)
		}
		return write(store.DialogueMessage{ID: m.ID}, []string{alice}), nil
	})
	if !errors.Is(err, store.ErrAlreadyExists) {
		t.Errorf("AddMessage(taken message id) = %v, want ErrAlreadyExists", err)
	}

	// A broadcast keeps no receipts and makes no participants.
	b := store.Dialogue{ID: "b1", Initiator: alice, Category: "subscription"}
	bm := store.DialogueMessage{ID: "b1-m1", DialogueID: "b1", Sender: alice, Type: "broadcast"}
	bw := write(bm, []string{bob})
	bw.NoReceipts = true
	if got, err := s.CreateDialogue(ctx, b, bw, mailbox.Bound{}); err != nil || len(got.Deliveries) != 1 {
		t.Fatalf("CreateDialogue(broadcast) = %+v, %v; want it delivered to bob", got, err)
	}
	_, _ = s.AddMessage(ctx, bm.ID, mailbox.Bound{}, func(v store.DialogueView) (store.MessageWrite, error) {
		if v.Received(bob) || len(v.Receivers()) != 0 {
			t.Errorf("broadcast receipts = %v, want none", v.Receivers())
		}
		if _, ok := v.Participant(alice); ok {
			t.Error("a broadcast's sender became a participant")
		}
		return store.MessageWrite{}, errPlan
	})
}

func testDialogueFull(t *testing.T, s DialogueBackend) {
	ctx := t.Context()
	bound := mailbox.Bound{MaxMessages: 1}
	if _, _, err := s.AppendMessage(ctx, msg("filler", `"x"`, t0), []string{carol}, bound); err != nil {
		t.Fatal(err)
	}
	d := store.Dialogue{ID: "d1", Initiator: alice, Category: "message", CreateTime: t0}
	m := store.DialogueMessage{ID: "d1-m1", DialogueID: "d1", Sender: alice, Type: "new_message", Time: t0}
	pairs := []store.PairState{
		{Pair: store.Pair{A: alice, B: bob}, State: json.RawMessage(`{"s":1}`)},
		{Pair: store.Pair{A: alice, B: carol}, State: json.RawMessage(`{"s":1}`)},
	}
	got, err := s.CreateDialogue(ctx, d, write(m, []string{carol, bob}, pairs...), bound)
	if err != nil || len(got.Deliveries) != 1 || got.Deliveries[0].Agent != bob || len(got.Refused) != 1 ||
		got.Refused[0].Agent != carol || !errors.Is(got.Refused[0].Err, mailbox.ErrFull) {
		t.Fatalf("CreateDialogue(bob, carol full) = %+v, %v; want bob delivered, carol refused as full", got, err)
	}
	_, _ = s.AddMessage(ctx, m.ID, bound, func(v store.DialogueView) (store.MessageWrite, error) {
		if got := v.Receivers(); !slices.Equal(got, []string{bob}) {
			t.Errorf("Receivers() = %v, want [bob]: carol's mailbox refused it", got)
		}
		if _, ok := v.Participant(carol); ok {
			t.Error("carol, whose mailbox refused the opener, became a participant")
		}
		if got := v.PairState(store.Pair{A: alice, B: carol}); got != nil {
			t.Errorf("PairState(alice, carol) = %s, want none: carol was refused", got)
		}
		if got := string(v.PairState(store.Pair{A: alice, B: bob})); got != `{"s":1}` {
			t.Errorf("PairState(alice, bob) = %s, want {\"s\":1}", got)
		}
		return store.MessageWrite{}, errPlan
	})
	if st, _ := s.GetMailbox(ctx, carol); st.Head != 1 {
		t.Errorf("carol's mailbox head = %d, want 1 (the filler only)", st.Head)
	}

	// Every mailbox full: nothing is written.
	d2 := store.Dialogue{ID: "d2", Initiator: alice, Category: "message", CreateTime: t0}
	m2 := store.DialogueMessage{ID: "d2-m1", DialogueID: "d2", Sender: alice, Type: "new_message", Time: t0}
	got, err = s.CreateDialogue(ctx, d2, write(m2, []string{carol}), bound)
	if err != nil || len(got.Deliveries) != 0 || len(got.Refused) != 1 {
		t.Fatalf("CreateDialogue(carol full) = %+v, %v; want carol refused", got, err)
	}
	if _, err := s.GetDialogue(ctx, "d2"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetDialogue(d2) = %v, want ErrNotFound: no mailbox took its opener", err)
	}
	if _, err := s.GetDialogueMessage(ctx, m2.ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetDialogueMessage(d2-m1) = %v, want ErrNotFound", err)
	}
	if n, _ := s.UpdateAgentDialogues(ctx, carol, func(*store.Dialogue, *store.Participant) (bool, error) { return true, nil }); n != 0 {
		t.Errorf("carol takes part in %d dialogues, want 0", n)
	}
	// A reply whose every recipient is full writes nothing either.
	r := store.DialogueMessage{ID: "d1-m2", Sender: bob, Type: "message_response", InReplyTo: m.ID, Time: t0}
	if _, _, err := s.AppendMessage(ctx, msg("filler2", `"x"`, t0), []string{alice}, bound); err != nil {
		t.Fatal(err)
	}
	got, err = s.AddMessage(ctx, m.ID, bound, func(store.DialogueView) (store.MessageWrite, error) {
		return write(r, []string{alice}, store.PairState{Pair: store.Pair{A: alice, B: bob}, State: json.RawMessage(`{"s":2}`)}), nil
	})
	if err != nil || len(got.Deliveries) != 0 || len(got.Refused) != 1 {
		t.Fatalf("AddMessage(alice full) = %+v, %v; want alice refused", got, err)
	}
	if _, err := s.GetDialogueMessage(ctx, r.ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetDialogueMessage(d1-m2) = %v, want ErrNotFound: no mailbox took it", err)
	}
	_, _ = s.AddMessage(ctx, m.ID, bound, func(v store.DialogueView) (store.MessageWrite, error) {
		if got := string(v.PairState(store.Pair{A: alice, B: bob})); got != `{"s":1}` {
			t.Errorf("PairState(alice, bob) = %s, want {\"s\":1}: the refused reply moved nothing", got)
		}
		return store.MessageWrite{}, errPlan
	})
}

func testDialogueClose(t *testing.T, s DialogueBackend) {
	ctx := t.Context()
	opener(t, s, "d1", []string{bob})
	opener(t, s, "d2", []string{bob, carol})
	if _, _, err := s.UpdateParticipant(ctx, "d1", carol, func(*store.Dialogue, *store.Participant) error { return nil }); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("UpdateParticipant(d1, carol) = %v, want ErrNotFound: carol takes no part", err)
	}
	if _, _, err := s.UpdateParticipant(ctx, "nope", bob, func(*store.Dialogue, *store.Participant) error { return nil }); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("UpdateParticipant(nope, bob) = %v, want ErrNotFound", err)
	}
	_, _, err := s.UpdateParticipant(ctx, "d1", bob, func(d *store.Dialogue, p *store.Participant) error {
		d.Closed, p.ClosedTypes = true, []string{"x"}
		return errPlan
	})
	if !errors.Is(err, errPlan) {
		t.Errorf("UpdateParticipant(failing) = %v, want its error", err)
	}
	d, p, err := s.UpdateParticipant(ctx, "d1", bob, func(d *store.Dialogue, p *store.Participant) error {
		if d.Closed || len(p.ClosedTypes) > 0 {
			t.Errorf("a failed UpdateParticipant wrote %+v, %+v", d, p)
		}
		p.ClosedTypes = []string{"offer"}
		p.ClosedAgents = []string{alice}
		return nil
	})
	if err != nil || d.ID != "d1" || !slices.Equal(p.ClosedTypes, []string{"offer"}) || !slices.Equal(p.ClosedAgents, []string{alice}) {
		t.Errorf("UpdateParticipant(d1, bob) = %+v, %+v, %v", d, p, err)
	}
	// Close all of bob's: d1 and d2; then again, none are open.
	for _, want := range []int{2, 0} {
		n, err := s.UpdateAgentDialogues(ctx, bob, func(d *store.Dialogue, p *store.Participant) (bool, error) {
			p.Closed = true
			return true, nil
		})
		if err != nil || n != want {
			t.Errorf("UpdateAgentDialogues(bob) = %d, %v; want %d", n, err, want)
		}
	}
	if _, p, _ := s.UpdateParticipant(ctx, "d2", carol, func(*store.Dialogue, *store.Participant) error { return nil }); p.Closed {
		t.Errorf("closing bob's dialogues closed carol's record too: %+v", p)
	}
}

// testDialogueSweepOwnTime: a dialogue updated after it entered the
// sweep's order, its close time moved later ("moved") or closed no more
// ("reopened"), is swept by what it holds now: a sweep between its old
// and new times leaves both, and one after the new close time removes
// "moved" only.
func testDialogueSweepOwnTime(t *testing.T, s DialogueBackend) {
	ctx := t.Context()
	now := time.Unix(1_800_000_000, 0).UTC()
	set := func(id string, closed bool, at time.Time) {
		t.Helper()
		if _, _, err := s.UpdateParticipant(ctx, id, alice, func(d *store.Dialogue, _ *store.Participant) error {
			d.Closed, d.CloseTime = closed, at
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"moved", "reopened"} {
		opener(t, s, id, []string{bob})
		set(id, true, now.Add(time.Hour))
	}
	set("moved", true, now.Add(3*time.Hour))
	set("reopened", false, time.Time{})
	if n, err := s.SweepDialogues(ctx, now.Add(2*time.Hour), 10); err != nil {
		t.Fatalf("SweepDialogues(+2h) = %d, %v", n, err)
	}
	for _, id := range []string{"moved", "reopened"} {
		if _, err := s.GetDialogue(ctx, id); err != nil {
			t.Errorf("GetDialogue(%s) after a sweep at +2h = %v; closed at +1h, then updated: it must stay", id, err)
		}
	}
	if n, err := s.SweepDialogues(ctx, now.Add(4*time.Hour), 10); err != nil || n != 1 {
		t.Errorf("SweepDialogues(+4h) = %d, %v; want 1 (moved, closed at +3h)", n, err)
	}
	if _, err := s.GetDialogue(ctx, "moved"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetDialogue(moved) after a sweep at +4h = %v, want ErrNotFound", err)
	}
	if _, err := s.GetDialogue(ctx, "reopened"); err != nil {
		t.Errorf("GetDialogue(reopened) after a sweep at +4h = %v; an open dialogue must stay", err)
	}
}

func testDialogueSweep(t *testing.T, s DialogueBackend) {
	ctx := t.Context()
	now := time.Unix(1_800_000_000, 0).UTC()
	closeAt := func(id string, at time.Time) {
		t.Helper()
		if _, _, err := s.UpdateParticipant(ctx, id, alice, func(d *store.Dialogue, _ *store.Participant) error {
			d.Closed, d.CloseTime = true, at
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	opener(t, s, "open", []string{bob})
	_, m := opener(t, s, "early", []string{bob, carol})
	reply := store.DialogueMessage{ID: "early-m2", Sender: bob, Type: "message_response", InReplyTo: m.ID, Time: now}
	if _, err := s.AddMessage(ctx, m.ID, mailbox.Bound{}, func(store.DialogueView) (store.MessageWrite, error) {
		return write(reply, []string{alice}), nil
	}); err != nil {
		t.Fatal(err)
	}
	closeAt("early", now.Add(time.Hour))
	opener(t, s, "late", []string{bob})
	closeAt("late", now.Add(3*time.Hour))
	b := store.Dialogue{ID: "news", Initiator: alice, Category: "subscription", CreateTime: now}
	bw := write(store.DialogueMessage{ID: "news-m1", Sender: alice, Type: "broadcast", Time: now}, []string{bob})
	bw.NoReceipts = true
	if _, err := s.CreateDialogue(ctx, b, bw, mailbox.Bound{}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"early", "open"} {
		if err := s.SetOfferTerms(ctx, id, bob, id+"-offer", json.RawMessage(`{"amount_micros":1}`)); err != nil {
			t.Fatal(err)
		}
	}

	if n, err := s.SweepDialogues(ctx, now.Add(2*time.Hour), 10); err != nil || n != 2 {
		t.Fatalf("SweepDialogues(closed before +2h) = %d, %v; want 2 (early, closed at +1h, and the broadcast)", n, err)
	}
	for _, id := range []string{"early", "news"} {
		if _, err := s.GetDialogue(ctx, id); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("GetDialogue(%s) after the sweep = %v, want ErrNotFound", id, err)
		}
	}
	for _, id := range []string{"early-m1", "early-m2", "news-m1"} {
		if _, err := s.GetDialogueMessage(ctx, id); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("GetDialogueMessage(%s) after the sweep = %v, want ErrNotFound", id, err)
		}
	}
	if _, _, err := s.UpdateParticipant(ctx, "early", bob, func(*store.Dialogue, *store.Participant) error { return nil }); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("UpdateParticipant(early, bob) after the sweep = %v, want ErrNotFound", err)
	}
	if n, err := s.UpdateAgentDialogues(ctx, carol, func(*store.Dialogue, *store.Participant) (bool, error) { return true, nil }); err != nil || n != 0 {
		t.Errorf("UpdateAgentDialogues(carol) after the sweep = %d, %v; want 0: her only dialogue went", n, err)
	}
	for _, id := range []string{"open", "late"} {
		if _, err := s.GetDialogue(ctx, id); err != nil {
			t.Errorf("GetDialogue(%s) = %v; an open or recently closed dialogue must stay", id, err)
		}
	}
	// The offer terms go with their dialogue (else they pile up forever).
	if got, err := s.OfferTerms(ctx, "early", bob, "early-offer"); err != nil || got != nil {
		t.Errorf("OfferTerms(early, bob) after the sweep = %s, %v; want nil", got, err)
	}
	if got, err := s.OfferTerms(ctx, "open", bob, "open-offer"); err != nil || got == nil {
		t.Errorf("OfferTerms(open, bob) after the sweep = %s, %v; want the terms kept", got, err)
	}
	// Bounded: one at a time, then nothing is left.
	for _, want := range []int{1, 0} {
		if n, err := s.SweepDialogues(ctx, now.Add(4*time.Hour), 1); err != nil || n != want {
			t.Errorf("SweepDialogues(limit 1) = %d, %v; want %d", n, err, want)
		}
	}
	if _, err := s.GetDialogue(ctx, "open"); err != nil {
		t.Errorf("GetDialogue(open) = %v; a dialogue never closed stays", err)
	}
}

func testOfferTerms(t *testing.T, s DialogueBackend) {
	ctx := t.Context()
	opener(t, s, "d1", []string{bob, carol})
	terms := func(supplier, id string) string {
		t.Helper()
		got, err := s.OfferTerms(ctx, "d1", supplier, id)
		if err != nil {
			t.Fatal(err)
		}
		return string(got)
	}
	if got := terms(bob, "m1"); got != "" {
		t.Errorf("OfferTerms(none) = %s, want nil", got)
	}
	set := func(id, v string) {
		t.Helper()
		if err := s.SetOfferTerms(ctx, "d1", bob, id, json.RawMessage(v)); err != nil {
			t.Fatal(err)
		}
	}
	set("m1", `{"a":1}`)
	set("m2", `{"a":2}`)
	// Each message's own terms, exactly: one that stated none (a
	// payment_error) has none, not the pair's latest (which may be a
	// refused offer's).
	for id, want := range map[string]string{"m1": `{"a":1}`, "m2": `{"a":2}`, "m3": ""} {
		if got := terms(bob, id); got != want {
			t.Errorf("OfferTerms(%s) = %s, want %s", id, got, want)
		}
	}
	if got := terms(carol, "m1"); got != "" {
		t.Errorf("OfferTerms(other supplier) = %s, want nil", got)
	}
	// Set again, m1's terms are replaced.
	set("m1", `{"a":3}`)
	if got := terms(bob, "m1"); got != `{"a":3}` {
		t.Errorf("OfferTerms(m1) after it was set again = %s, want {\"a\":3}", got)
	}
	// Two offers of the pair recorded at once, both refused: each removes
	// exactly its own terms, whatever the order, and the delivered offers'
	// stay.
	set("race1", `{"a":4}`)
	set("race2", `{"a":5}`)
	for _, id := range []string{"race1", "race2"} {
		if err := s.RemoveOfferTerms(ctx, "d1", bob, id); err != nil {
			t.Fatal(err)
		}
	}
	for id, want := range map[string]string{"race1": "", "race2": "", "m1": `{"a":3}`, "m2": `{"a":2}`} {
		if got := terms(bob, id); got != want {
			t.Errorf("OfferTerms(%s) after both racing offers were refused = %s, want %s", id, got, want)
		}
	}
	// Removing terms never recorded is no error and changes nothing.
	if err := s.RemoveOfferTerms(ctx, "d1", carol, "m1"); err != nil {
		t.Errorf("RemoveOfferTerms(never recorded) = %v", err)
	}
	for _, id := range []string{"m1", "m2"} {
		if err := s.RemoveOfferTerms(ctx, "d1", bob, id); err != nil {
			t.Fatal(err)
		}
	}
	if got := terms(bob, "m1"); got != "" {
		t.Errorf("OfferTerms after removing every offer's = %s, want nil", got)
	}
}

// Offer terms are recorded only for a stored dialogue, so that every
// record goes with its dialogue's sweep: terms set for a dialogue never
// stored, or swept (even while the terms are being set), are refused, and
// none outlives its dialogue.
func testOfferTermsNeedTheirDialogue(t *testing.T, s DialogueBackend) {
	ctx := t.Context()
	terms := json.RawMessage(`{"amount_micros":1}`)
	if err := s.SetOfferTerms(ctx, "never", bob, "never-offer", terms); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("SetOfferTerms(a dialogue never stored) = %v, want ErrNotFound", err)
	}
	if got, err := s.OfferTerms(ctx, "never", bob, "never-offer"); err != nil || got != nil {
		t.Errorf("OfferTerms(never) = %s, %v; want nil", got, err)
	}
	now := time.Unix(1_800_000_000, 0).UTC()
	const n = 24
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("swept%02d", i)
		opener(t, s, ids[i], []string{bob})
		if _, _, err := s.UpdateParticipant(ctx, ids[i], alice, func(d *store.Dialogue, _ *store.Participant) error {
			d.Closed, d.CloseTime = true, now
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	// The sweep and the terms race: each dialogue's terms are set either
	// before its sweep (and go with it) or after (and are refused).
	var (
		wg    sync.WaitGroup
		errs  = make([]error, n)
		swept int
	)
	for i, id := range ids {
		wg.Go(func() { errs[i] = s.SetOfferTerms(ctx, id, bob, id+"-offer", terms) })
	}
	wg.Go(func() {
		for swept < n {
			k, err := s.SweepDialogues(ctx, now.Add(time.Hour), 5)
			if err != nil {
				t.Errorf("SweepDialogues = %v", err)
				return
			}
			swept += k
		}
	})
	wg.Wait()
	for i, id := range ids {
		if errs[i] != nil && !errors.Is(errs[i], store.ErrNotFound) {
			t.Errorf("SetOfferTerms(%s) while it is swept = %v, want nil or ErrNotFound", id, errs[i])
		}
		if got, err := s.OfferTerms(ctx, id, bob, id+"-offer"); err != nil || got != nil {
			t.Errorf("OfferTerms(%s) after its sweep = %s, %v; want nil (set first: swept with it; set after: refused)", id, got, err)
		}
	}
	if err := s.SetOfferTerms(ctx, ids[0], bob, "late", terms); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("SetOfferTerms(a swept dialogue) = %v, want ErrNotFound", err)
	}
}

// testDialogueNeighbours: an agent whose name extends another's (bob2,
// bob) and a dialogue whose id extends another's (d10, d1; and each
// dialogue's messages, d1-m1, under ids that extend its own) keep their
// rows apart. Reading, acknowledging and compacting bob's mailbox, closing
// all of bob's dialogues and sweeping d1 leave bob2's mailbox and d10
// whole.
func testDialogueNeighbours(t *testing.T, s DialogueBackend) {
	ctx := t.Context()
	now := time.Unix(1_800_000_000, 0).UTC()
	bob2 := bob + "2"
	for _, c := range []struct{ id, to string }{{"d1", bob}, {"d10", bob2}} {
		d := store.Dialogue{ID: c.id, Initiator: alice, Category: "message", CreateTime: now, Opener: c.id + "-m1"}
		m := store.DialogueMessage{ID: c.id + "-m1", DialogueID: c.id, Sender: alice, Type: "new_message", Time: now}
		pair := store.PairState{Pair: store.Pair{A: alice, B: c.to}, State: json.RawMessage(`{"s":"` + c.id + `"}`)}
		if _, err := s.CreateDialogue(ctx, d, write(m, []string{c.to}, pair), mailbox.Bound{}); err != nil {
			t.Fatalf("CreateDialogue(%s) = %v", c.id, err)
		}
	}
	reply := store.DialogueMessage{ID: "d10-m2", Sender: bob2, Type: "message_response", InReplyTo: "d10-m1", Time: now}
	if _, err := s.AddMessage(ctx, "d10-m1", mailbox.Bound{}, func(store.DialogueView) (store.MessageWrite, error) {
		return write(reply, []string{alice}), nil
	}); err != nil {
		t.Fatal(err)
	}

	if got, err := s.ReadMailbox(ctx, bob, 0, 10); err != nil || ids(got) != "1:d1-m1 " {
		t.Errorf("ReadMailbox(bob) = %s, %v; want only d1-m1, not bob2's", ids(got), err)
	}
	if st, err := s.ClearMailbox(ctx, bob); err != nil || st.Pending != 0 {
		t.Errorf("ClearMailbox(bob) = %+v, %v; want nothing pending", st, err)
	}
	if n, err := s.CompactMailboxes(ctx, now.Add(time.Hour), 10); err != nil || n != 1 {
		t.Errorf("CompactMailboxes = %d, %v; want 1 (bob's d1-m1)", n, err)
	}
	if n, err := s.UpdateAgentDialogues(ctx, bob, func(d *store.Dialogue, p *store.Participant) (bool, error) {
		if d.ID != "d1" {
			t.Errorf("UpdateAgentDialogues(bob) offered dialogue %s, want only d1", d.ID)
		}
		p.Closed = true
		return true, nil
	}); err != nil || n != 1 {
		t.Errorf("UpdateAgentDialogues(bob) = %d, %v; want 1 (d1)", n, err)
	}
	if _, _, err := s.UpdateParticipant(ctx, "d1", alice, func(d *store.Dialogue, _ *store.Participant) error {
		d.Closed, d.CloseTime = true, now
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if n, err := s.SweepDialogues(ctx, now.Add(time.Hour), 10); err != nil || n != 1 {
		t.Fatalf("SweepDialogues = %d, %v; want 1 (d1)", n, err)
	}

	if got, err := s.ReadMailbox(ctx, bob2, 0, 10); err != nil || ids(got) != "1:d10-m1 " {
		t.Errorf("ReadMailbox(bob2) = %s, %v; want d10-m1 kept", ids(got), err)
	}
	if st, err := s.GetMailbox(ctx, bob2); err != nil || st.Head != 1 || st.Acked != 0 || st.Pending != 1 {
		t.Errorf("GetMailbox(bob2) = %+v, %v; want head 1, nothing acknowledged, 1 pending", st, err)
	}
	for _, id := range []string{"d10-m1", "d10-m2"} {
		if _, err := s.GetDialogueMessage(ctx, id); err != nil {
			t.Errorf("GetDialogueMessage(%s) = %v; want it kept with d10", id, err)
		}
	}
	if _, err := s.GetDialogueMessage(ctx, "d1-m1"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetDialogueMessage(d1-m1) = %v, want ErrNotFound: swept with d1", err)
	}
	_, _ = s.AddMessage(ctx, "d10-m2", mailbox.Bound{}, func(v store.DialogueView) (store.MessageWrite, error) {
		if v.Dialogue().ID != "d10" || v.Dialogue().Closed {
			t.Errorf("dialogue of d10-m2 = %+v, want d10, open", v.Dialogue())
		}
		for _, a := range []string{alice, bob2} {
			if p, ok := v.Participant(a); !ok || p.Closed {
				t.Errorf("Participant(d10, %s) = %+v, %v; want it kept, open", a, p, ok)
			}
		}
		if got := string(v.PairState(store.Pair{A: alice, B: bob2})); got != `{"s":"d10"}` {
			t.Errorf("PairState(d10, alice, bob2) = %s, want {\"s\":\"d10\"}", got)
		}
		return store.MessageWrite{}, errPlan
	})
	if n, err := s.UpdateAgentDialogues(ctx, bob2, func(d *store.Dialogue, _ *store.Participant) (bool, error) {
		if d.ID != "d10" {
			t.Errorf("UpdateAgentDialogues(bob2) offered dialogue %s, want only d10", d.ID)
		}
		return true, nil
	}); err != nil || n != 1 {
		t.Errorf("UpdateAgentDialogues(bob2) = %d, %v; want 1 (d10)", n, err)
	}
}
