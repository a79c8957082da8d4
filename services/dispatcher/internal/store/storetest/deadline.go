package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

// TimerBackend is a backend holding both dialogues (whose pair states timers
// move, with the mailboxes their writes append to) and timers.
type TimerBackend interface {
	DialogueBackend
	store.TimerStore
}

// RunTimers runs the timer suite; open returns a new empty store.
func RunTimers(t *testing.T, open func(t *testing.T) TimerBackend) {
	t.Run("order and replace", func(t *testing.T) { testTimerOrder(t, open(t)) })
	t.Run("fire", func(t *testing.T) { testTimerFire(t, open(t)) })
	t.Run("stored with the pair", func(t *testing.T) { testTimersWithThePair(t, open(t)) })
	t.Run("retry", func(t *testing.T) { testTimerRetry(t, open(t)) })
	t.Run("set again after firing", func(t *testing.T) { testTimerSetAgain(t, open(t)) })
	t.Run("fire a batch", func(t *testing.T) { testTimerFireBatch(t, open(t)) })
}

// A batch's messages reach each mailbox in the batch's order, whatever
// the order of their ids; two firings of one batch with the same message
// id append it once, and both timers go.
func testTimerFireBatch(t *testing.T, s TimerBackend) {
	ctx := t.Context()
	var timers []store.Timer
	ids := map[store.Timer]string{}
	for i, id := range []string{"x5", "x3", "x9", "x3", "x1"} {
		tm := timer(fmt.Sprintf("d%d", i), bob, "offer_timeout", time.Duration(i+1)*time.Second)
		timers = append(timers, tm)
		ids[tm] = id
	}
	if err := s.PutTimers(ctx, timers); err != nil {
		t.Fatal(err)
	}
	fired, err := s.FireTimers(ctx, timers, mailbox.Bound{}, func(x store.Timer, _ json.RawMessage) (store.TimerFiring, error) {
		m := expiryMail(ids[x])
		m.DialogueID = x.Dialogue
		return store.TimerFiring{Mail: m, Recipients: []string{bob, alice}}, nil
	})
	if err != nil || len(fired) != len(timers) {
		t.Fatalf("FireTimers(5 timers) = %d fired, %v; want all", len(fired), err)
	}
	if n := len(fired[3].Delivered.Deliveries); n != 0 {
		t.Errorf("the second firing with id x3 delivered %d, want none: appended once", n)
	}
	for _, agent := range []string{alice, bob} {
		got, err := s.ReadMailbox(ctx, agent, 0, 10)
		if err != nil {
			t.Fatal(err)
		}
		var order []string
		for _, d := range got {
			order = append(order, d.Message.ID+"/"+d.Message.DialogueID)
		}
		if want := []string{"x5/d0", "x3/d1", "x9/d2", "x1/d4"}; !slices.Equal(order, want) {
			t.Errorf("%s's mailbox = %v, want %v: the batch's order, x3 once", agent, order, want)
		}
	}
	if _, ok, err := s.NextTimer(ctx); ok || err != nil {
		t.Errorf("NextTimer() after the batch = %v, %v; want none left", ok, err)
	}
}

// A deadline set again after its timer fired gets a timer of its own,
// listed and fired once, whatever the store kept of the fired one.
func testTimerSetAgain(t *testing.T, s TimerBackend) {
	ctx := t.Context()
	noop := func(store.Timer, json.RawMessage) (store.TimerFiring, error) { return store.TimerFiring{}, nil }
	for i, at := range []time.Duration{time.Second, 2 * time.Second, time.Second} {
		tm := timer("d1", bob, "offer_timeout", at)
		if err := s.PutTimers(ctx, []store.Timer{tm}); err != nil {
			t.Fatal(err)
		}
		due, err := s.DueTimers(ctx, t0.Add(time.Hour), 10)
		if err != nil || len(due) != 1 || due[0] != tm {
			t.Fatalf("set %d: DueTimers = %+v, %v; want the timer set, alone", i, due, err)
		}
		if fired, err := s.FireTimers(ctx, due, mailbox.Bound{}, noop); err != nil || len(fired) != 1 {
			t.Fatalf("set %d: FireTimers = %+v, %v; want it fired", i, fired, err)
		}
		if _, ok, err := s.NextTimer(ctx); ok || err != nil {
			t.Fatalf("set %d: NextTimer after firing = %v, %v; want none", i, ok, err)
		}
	}
}

// A timer that failed is put off: due at its retry, with its failures
// counted, and fired from there as listed; a retry of a timer no longer
// stored as listed (put off already, fired, replaced) is passed over.
func testTimerRetry(t *testing.T, s TimerBackend) {
	ctx := t.Context()
	a, b := timer("d1", bob, "offer_timeout", time.Second), timer("d2", bob, "offer_timeout", 2*time.Second)
	if err := s.PutTimers(ctx, []store.Timer{a, b}); err != nil {
		t.Fatal(err)
	}
	if err := s.RetryTimers(ctx, []store.TimerRetry{{Timer: a, Retry: t0.Add(5 * time.Second)}}); err != nil {
		t.Fatal(err)
	}
	if due, err := s.DueTimers(ctx, t0.Add(3*time.Second), 10); err != nil || len(due) != 1 || due[0] != b {
		t.Errorf("DueTimers(t0+3s) = %v, %v; want d2 alone: d1 is put off", names(due), err)
	}
	if next, ok, err := s.NextTimer(ctx); err != nil || !ok || next != b {
		t.Errorf("NextTimer() = %+v, %v, %v; want d2", next, ok, err)
	}
	due, err := s.DueTimers(ctx, t0.Add(5*time.Second), 10)
	if err != nil || len(due) != 2 || due[0] != b || due[1].Dialogue != "d1" || due[1].Failures != 1 || !due[1].Retry.Equal(t0.Add(5*time.Second)) || !due[1].At.Equal(a.At) {
		t.Fatalf("DueTimers(t0+5s) = %+v, %v; want d2, then d1 failed once, due at its retry", due, err)
	}
	retried := due[1]
	// The stale listing of d1 (before it was put off) changes nothing,
	// and does not fire.
	if err := s.RetryTimers(ctx, []store.TimerRetry{{Timer: a, Retry: t0.Add(time.Hour)}}); err != nil {
		t.Fatal(err)
	}
	fired, err := s.FireTimers(ctx, []store.Timer{a}, mailbox.Bound{}, func(store.Timer, json.RawMessage) (store.TimerFiring, error) {
		t.Error("expire ran for a stale listing")
		return store.TimerFiring{}, nil
	})
	if err != nil || len(fired) != 0 {
		t.Errorf("FireTimers(stale listing) = %+v, %v; want nothing", fired, err)
	}
	// Put off again: failures add up.
	if err := s.RetryTimers(ctx, []store.TimerRetry{{Timer: retried, Retry: t0.Add(7 * time.Second)}}); err != nil {
		t.Fatal(err)
	}
	due, _ = s.DueTimers(ctx, t0.Add(time.Hour), 10)
	if len(due) != 2 || due[1].Failures != 2 || !due[1].Retry.Equal(t0.Add(7*time.Second)) {
		t.Fatalf("DueTimers after a second failure = %+v, want d1 failed twice, due at t0+7s", due)
	}
	fired, err = s.FireTimers(ctx, []store.Timer{due[1]}, mailbox.Bound{}, func(store.Timer, json.RawMessage) (store.TimerFiring, error) {
		return store.TimerFiring{}, nil
	})
	if err != nil || len(fired) != 1 {
		t.Errorf("FireTimers(d1 as listed) = %+v, %v; want it fired", fired, err)
	}
	// Setting a deadline again replaces a failing timer, back-off and all.
	if err := s.RetryTimers(ctx, []store.TimerRetry{{Timer: b, Retry: t0.Add(time.Hour)}}); err != nil {
		t.Fatal(err)
	}
	if err := s.PutTimers(ctx, []store.Timer{b}); err != nil {
		t.Fatal(err)
	}
	if due, _ := s.DueTimers(ctx, t0.Add(2*time.Second), 10); len(due) != 1 || due[0] != b {
		t.Errorf("DueTimers after d2 was set again = %+v, want it due at its deadline, no failure", due)
	}
}

// A dialogue write stores the timers of each pair state it writes in the
// same transaction, replacing the pair's timer of the same name, and the
// pair's order record; a pair whose recipient's mailbox refused the
// message gets none of them.
func testTimersWithThePair(t *testing.T, s TimerBackend) {
	ctx := t.Context()
	now := time.Unix(1_800_000_000, 0).UTC()
	d := store.Dialogue{ID: "d1", Initiator: alice, Category: "service", CreateTime: now}
	m := store.DialogueMessage{ID: "d1-m1", DialogueID: "d1", Sender: alice, Type: "new_task_request", Time: now}
	pair := func(agent string, ts ...store.Timer) store.PairState {
		return store.PairState{Pair: store.Pair{A: alice, B: agent}, State: json.RawMessage(`{"s":1}`), Timers: ts}
	}
	// carol's mailbox is full (one message held): her pair and timer are not written.
	if _, _, err := s.AppendMessage(ctx, mailbox.Message{ID: "x0", Category: mailbox.CategoryMessage, Type: "t", Body: []byte(`{}`), Time: now}, []string{carol}, mailbox.Bound{}); err != nil {
		t.Fatal(err)
	}
	w := write(m, []string{bob, carol}, pair(bob, timer("d1", bob, "offer_timeout", time.Second)), pair(carol, timer("d1", carol, "offer_timeout", time.Second)))
	if _, err := s.CreateDialogue(ctx, d, w, mailbox.Bound{MaxMessages: 1}); err != nil {
		t.Fatal(err)
	}
	if due, err := s.DueTimers(ctx, t0.Add(time.Hour), 10); err != nil || len(due) != 1 || due[0] != timer("d1", bob, "offer_timeout", time.Second) {
		t.Fatalf("timers after the opener = %v, %v; want bob's alone", names(due), err)
	}
	// A later write replaces bob's timer of that name.
	r := store.DialogueMessage{ID: "d1-m2", DialogueID: "d1", Sender: bob, Type: "offer", InReplyTo: m.ID, Time: now}
	if _, err := s.AddMessage(ctx, m.ID, mailbox.Bound{}, func(store.DialogueView) (store.MessageWrite, error) {
		return write(r, []string{alice}, store.PairState{Pair: store.Pair{A: bob, B: alice}, State: json.RawMessage(`{"s":2}`),
			Timers: []store.Timer{timer("d1", bob, "offer_timeout", time.Minute)},
			Order: &store.OrderWrite{
				Order:      store.Order{ID: "o1", Dialogue: "d1", Protocol: "p", Consumer: alice, Supplier: bob},
				Transition: store.OrderTransition{Type: "offer", MessageID: r.ID, Sender: bob, Time: now, State: store.OrderActive},
				Open:       true,
			}}), nil
	}); err != nil {
		t.Fatal(err)
	}
	// The order record went with it.
	if os, ok := s.(store.OrderStore); ok {
		if o, err := os.GetOrder(ctx, "o1"); err != nil || len(o.Transitions) != 1 || o.Transitions[0].MessageID != r.ID {
			t.Errorf("GetOrder(o1) after the reply = %+v, %v; want it opened by the reply", o, err)
		}
	}
	if due, err := s.DueTimers(ctx, t0.Add(time.Hour), 10); err != nil || len(due) != 1 || due[0] != timer("d1", bob, "offer_timeout", time.Minute) {
		t.Errorf("timers after the reply = %+v, %v; want bob's, replaced", due, err)
	}
}

func timer(dialogue, counterpart, name string, at time.Duration) store.Timer {
	return store.Timer{Dialogue: dialogue, Initiator: alice, Counterpart: counterpart, Protocol: "p", Name: name, At: t0.Add(at)}
}

func names(ts []store.Timer) []string {
	var out []string
	for _, t := range ts {
		out = append(out, t.Dialogue+"/"+t.Name)
	}
	return out
}

func testTimerOrder(t *testing.T, s TimerBackend) {
	ctx := t.Context()
	if _, ok, err := s.NextTimer(ctx); ok || err != nil {
		t.Fatalf("NextTimer(empty) = ok %v, %v; want none", ok, err)
	}
	err := s.PutTimers(ctx, []store.Timer{
		timer("d1", bob, "offer_timeout", 30*time.Second),
		timer("d2", bob, "proposal_timeout", 10*time.Second),
		timer("d1", carol, "offer_timeout", 20*time.Second),
	})
	if err != nil {
		t.Fatal(err)
	}
	next, ok, err := s.NextTimer(ctx)
	if err != nil || !ok || next != timer("d2", bob, "proposal_timeout", 10*time.Second) {
		t.Errorf("NextTimer() = %+v, %v, %v; want d2's proposal_timeout", next, ok, err)
	}
	due, err := s.DueTimers(ctx, t0.Add(20*time.Second), 10)
	if got := names(due); err != nil || len(got) != 2 || got[0] != "d2/proposal_timeout" || got[1] != "d1/offer_timeout" || due[1].Counterpart != carol {
		t.Errorf("DueTimers(t0+20s) = %v, %v; want d2 then d1 (carol), the one due exactly at now included", got, err)
	}
	if due, _ := s.DueTimers(ctx, t0.Add(time.Hour), 1); len(due) != 1 {
		t.Errorf("DueTimers(limit 1) = %d timers, want 1", len(due))
	}
	// After a timer listed: those listed after it, whether or not it is
	// still stored; at the same time, in DueTimers' order.
	for _, c := range []struct {
		after store.Timer
		limit int
		want  []string
	}{
		{timer("d2", bob, "proposal_timeout", 10*time.Second), 10, []string{"d1/offer_timeout", "d1/offer_timeout"}},
		{timer("d2", bob, "proposal_timeout", 10*time.Second), 1, []string{"d1/offer_timeout"}},
		{timer("d1", carol, "offer_timeout", 20*time.Second), 10, []string{"d1/offer_timeout"}},
		{timer("d0", bob, "gone", 20*time.Second), 10, []string{"d1/offer_timeout", "d1/offer_timeout"}}, // not stored
		{timer("d1", bob, "offer_timeout", 20*time.Second), 10, []string{"d1/offer_timeout", "d1/offer_timeout"}},
		{timer("d1", bob, "offer_timeout", 30*time.Second), 10, nil},
	} {
		due, err := s.DueTimersAfter(ctx, t0.Add(time.Hour), c.after, c.limit)
		if got := names(due); err != nil || !slices.Equal(got, c.want) {
			t.Errorf("DueTimersAfter(%s/%s at %v, limit %d) = %v, %v; want %v", c.after.Dialogue, c.after.Counterpart, c.after.At.Sub(t0), c.limit, got, err, c.want)
		}
	}
	if due, err := s.DueTimersAfter(ctx, t0.Add(25*time.Second), timer("d2", bob, "proposal_timeout", 10*time.Second), 10); err != nil || len(due) != 1 || due[0].Counterpart != carol {
		t.Errorf("DueTimersAfter(t0+25s) = %v, %v; want d1 (carol) alone: due by now", names(due), err)
	}
	// Setting a deadline again replaces it: the earlier time is gone.
	if err := s.PutTimers(ctx, []store.Timer{timer("d2", bob, "proposal_timeout", 40*time.Second)}); err != nil {
		t.Fatal(err)
	}
	due, _ = s.DueTimers(ctx, t0.Add(35*time.Second), 10)
	if got := names(due); len(got) != 2 || got[0] != "d1/offer_timeout" || got[1] != "d1/offer_timeout" {
		t.Errorf("DueTimers(t0+35s) after replacing d2's = %v, want only d1's two", got)
	}
	ctx2, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.DueTimers(ctx2, t0, 1); err == nil {
		t.Error("DueTimers(cancelled) = nil error")
	}
}

func expiryMail(id string) mailbox.Message {
	return mailbox.Message{ID: id, DialogueID: "d1", Category: mailbox.CategoryService, Type: "offer_timeout_expired", Body: []byte(`{}`), Time: t0}
}

func testTimerFire(t *testing.T, s TimerBackend) {
	ctx := t.Context()
	opener(t, s, "d1", []string{bob}) // pair (alice, bob) holds {"s":1}; bob's mailbox the opener
	tm := timer("d1", bob, "offer_timeout", time.Second)
	other := timer("d2", bob, "offer_timeout", 2*time.Second) // no pair stored
	if err := s.PutTimers(ctx, []store.Timer{tm, other}); err != nil {
		t.Fatal(err)
	}
	if st, err := s.PairState(ctx, "d1", store.Pair{A: alice, B: bob}); err != nil || string(st) != `{"s":1}` {
		t.Fatalf("PairState(d1, alice-bob) = %s, %v; want {\"s\":1}", st, err)
	}

	// One batch: a failing expire keeps its timer and writes nothing for
	// it; a stale timer (other At) is passed over; the other fires, with
	// no state to move and no message.
	boom := errors.New("boom")
	stale := other
	stale.At = other.At.Add(-time.Millisecond)
	fired, err := s.FireTimers(ctx, []store.Timer{tm, stale, other}, mailbox.Bound{}, func(x store.Timer, st json.RawMessage) (store.TimerFiring, error) {
		switch x {
		case tm:
			return store.TimerFiring{}, boom
		case other:
			if st != nil {
				t.Errorf("expire(d2) saw state %s, want nil", st)
			}
			return store.TimerFiring{}, nil
		}
		t.Errorf("expire ran for %+v", x)
		return store.TimerFiring{}, nil
	})
	if !errors.Is(err, boom) || len(fired) != 1 || fired[0].Timer != other || fired[0].Next != nil {
		t.Fatalf("FireTimers(failing, stale, other) = %+v, %v; want d2 fired alone and boom", fired, err)
	}
	if due, _ := s.DueTimers(ctx, t0.Add(time.Hour), 10); len(due) != 1 || due[0] != tm {
		t.Fatalf("timers left = %v, want d1's alone", names(due))
	}

	// Firing moves the state and appends the message to both mailboxes,
	// in the same transaction; bob's is full (one message held) and is
	// refused, and the state moves all the same.
	fired, err = s.FireTimers(ctx, []store.Timer{tm}, mailbox.Bound{MaxMessages: 1}, func(_ store.Timer, st json.RawMessage) (store.TimerFiring, error) {
		return store.TimerFiring{State: json.RawMessage(`{"s":2}`), Mail: expiryMail("x1"), Recipients: []string{alice, bob}}, nil
	})
	if err != nil || len(fired) != 1 || string(fired[0].Prev) != `{"s":1}` || string(fired[0].Next) != `{"s":2}` ||
		len(fired[0].Delivered.Deliveries) != 1 || fired[0].Delivered.Deliveries[0].Agent != alice ||
		len(fired[0].Delivered.Refused) != 1 || fired[0].Delivered.Refused[0].Agent != bob {
		t.Fatalf("FireTimers(d1) = %+v, %v; want it fired from {\"s\":1} to {\"s\":2}, delivered to alice, bob refused", fired, err)
	}
	if got, err := s.ReadMailbox(ctx, alice, 0, 10); err != nil || len(got) != 1 || got[0].Message.ID != "x1" {
		t.Errorf("alice's mailbox = %+v, %v; want the expiry", got, err)
	}
	// The pair is keyed the same whichever agent comes first.
	if st, _ := s.PairState(ctx, "d1", store.Pair{A: bob, B: alice}); string(st) != `{"s":2}` {
		t.Errorf("PairState after FireTimers = %s, want {\"s\":2}", st)
	}
	// Once: the timer is gone.
	fired, err = s.FireTimers(ctx, []store.Timer{tm}, mailbox.Bound{}, func(store.Timer, json.RawMessage) (store.TimerFiring, error) {
		t.Error("expire ran for a fired timer")
		return store.TimerFiring{}, nil
	})
	if len(fired) != 0 || err != nil {
		t.Errorf("FireTimers(again) = %+v, %v; want nothing: a timer fires once", fired, err)
	}
	if _, ok, _ := s.NextTimer(ctx); ok {
		t.Error("NextTimer() after firing found a timer")
	}

	// A message already stored is not appended again; the state moves.
	again := timer("d1", bob, "proposal_timeout", 3*time.Second)
	if err := s.PutTimers(ctx, []store.Timer{again}); err != nil {
		t.Fatal(err)
	}
	fired, err = s.FireTimers(ctx, []store.Timer{again}, mailbox.Bound{}, func(store.Timer, json.RawMessage) (store.TimerFiring, error) {
		return store.TimerFiring{State: json.RawMessage(`{"s":3}`), Mail: expiryMail("x1"), Recipients: []string{alice}}, nil
	})
	if err != nil || len(fired) != 1 || len(fired[0].Delivered.Deliveries) != 0 {
		t.Errorf("FireTimers(a message stored already) = %+v, %v; want fired, nothing delivered", fired, err)
	}
	if got, _ := s.ReadMailbox(ctx, alice, 0, 10); len(got) != 1 {
		t.Errorf("alice's mailbox holds %d messages, want the expiry once", len(got))
	}
	if st, _ := s.PairState(ctx, "d1", store.Pair{A: alice, B: bob}); string(st) != `{"s":3}` {
		t.Errorf("PairState = %s, want {\"s\":3}", st)
	}
}
