package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

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

func testTimerFire(t *testing.T, s TimerBackend) {
	ctx := t.Context()
	opener(t, s, "d1", []string{bob}) // pair (alice, bob) holds {"s":1}
	tm := timer("d1", bob, "offer_timeout", time.Second)
	if err := s.PutTimers(ctx, []store.Timer{tm}); err != nil {
		t.Fatal(err)
	}
	if st, err := s.PairState(ctx, "d1", store.Pair{A: alice, B: bob}); err != nil || string(st) != `{"s":1}` {
		t.Fatalf("PairState(d1, alice-bob) = %s, %v; want {\"s\":1}", st, err)
	}

	// A failing mutate writes nothing and keeps the timer.
	boom := errors.New("boom")
	if fired, err := s.FireTimer(ctx, tm, func(json.RawMessage) (json.RawMessage, error) { return nil, boom }); fired || !errors.Is(err, boom) {
		t.Errorf("FireTimer(failing mutate) = %v, %v; want false, boom", fired, err)
	}
	// A replaced timer (other At) does not fire.
	stale := tm
	stale.At = tm.At.Add(-time.Millisecond)
	if fired, err := s.FireTimer(ctx, stale, func(json.RawMessage) (json.RawMessage, error) {
		t.Error("mutate ran for a stale timer")
		return nil, nil
	}); fired || err != nil {
		t.Errorf("FireTimer(stale) = %v, %v; want false, nil", fired, err)
	}

	var seen json.RawMessage
	fired, err := s.FireTimer(ctx, tm, func(st json.RawMessage) (json.RawMessage, error) {
		seen = st
		return json.RawMessage(`{"s":2}`), nil
	})
	if !fired || err != nil || string(seen) != `{"s":1}` {
		t.Fatalf("FireTimer() = %v, %v, saw %s; want true, nil, the stored state", fired, err, seen)
	}
	// The pair is keyed the same whichever agent comes first.
	if st, _ := s.PairState(ctx, "d1", store.Pair{A: bob, B: alice}); string(st) != `{"s":2}` {
		t.Errorf("PairState after FireTimer = %s, want {\"s\":2}", st)
	}
	if fired, err := s.FireTimer(ctx, tm, func(json.RawMessage) (json.RawMessage, error) { return json.RawMessage(`{"s":3}`), nil }); fired || err != nil {
		t.Errorf("FireTimer(again) = %v, %v; want false: a timer fires once", fired, err)
	}
	if _, ok, _ := s.NextTimer(ctx); ok {
		t.Error("NextTimer() after firing found a timer")
	}
}
