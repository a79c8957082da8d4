package storetest

import (
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

// RunOrders runs the order suite; open returns a new empty store.
func RunOrders(t *testing.T, open func(t *testing.T) store.OrderStore) {
	t.Run("trail", func(t *testing.T) { testOrderTrail(t, open(t)) })
	t.Run("list", func(t *testing.T) { testOrderList(t, open(t)) })
	t.Run("lapse", func(t *testing.T) { testOrderLapse(t, open(t)) })
}

func order(id, dialogue, supplier string) store.Order {
	return store.Order{ID: id, Dialogue: dialogue, Protocol: "p", Consumer: alice, Supplier: supplier}
}

func transition(typ, msg, sender string, at time.Duration, st store.OrderState) store.OrderTransition {
	return store.OrderTransition{Type: typ, MessageID: msg, Sender: sender, Time: t0.Add(at), State: st}
}

func testOrderTrail(t *testing.T, s store.OrderStore) {
	ctx := t.Context()
	if _, err := s.RecordOrder(ctx, order("o1", "d1", bob), transition("order_complete", "m9", bob, 0, store.OrderSucceeded), false); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("RecordOrder(no order, not opening) = %v, want ErrNotFound", err)
	}
	o, err := s.RecordOrder(ctx, order("o1", "d1", bob), transition("accept_offer", "m1", alice, 0, store.OrderActive), true)
	if err != nil || o.ID != "o1" || o.State != store.OrderActive || !o.CreateTime.Equal(t0) || len(o.Transitions) != 1 {
		t.Fatalf("RecordOrder(open) = %+v, %v; want o1 active with one transition", o, err)
	}
	// The pair is the same whichever way round; a second opening records
	// on the existing order (id o2 is not used).
	swapped := store.Order{ID: "o2", Dialogue: "d1", Consumer: alice, Supplier: bob}
	if o, err := s.RecordOrder(ctx, swapped, transition("request_message", "m2", bob, time.Second, store.OrderActive), true); err != nil || o.ID != "o1" || len(o.Transitions) != 2 {
		t.Errorf("RecordOrder(same pair) = %+v, %v; want o1 with two transitions", o, err)
	}
	if o, err := s.RecordOrder(ctx, order("o1", "d1", bob), transition("order_complete", "m3", bob, 2*time.Second, store.OrderSucceeded), false); err != nil || o.State != store.OrderSucceeded {
		t.Errorf("RecordOrder(order_complete) = %+v, %v; want succeeded", o, err)
	}
	// A retry of a recorded message changes nothing.
	if o, err := s.RecordOrder(ctx, order("o1", "d1", bob), transition("order_complete", "m3", bob, 5*time.Second, store.OrderFailed), false); err != nil || o.State != store.OrderSucceeded || len(o.Transitions) != 3 {
		t.Errorf("RecordOrder(retry) = %+v, %v; want unchanged", o, err)
	}
	if o, err := s.RecordOrder(ctx, order("o1", "d1", bob), transition("confirm_fail", "m4", alice, 3*time.Second, store.OrderFailed), false); err != nil || o.State != store.OrderFailed {
		t.Errorf("RecordOrder(confirm_fail) = %+v, %v; want failed", o, err)
	}
	got, err := s.GetOrder(ctx, "o1")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"accept_offer/m1/active", "request_message/m2/active", "order_complete/m3/succeeded", "confirm_fail/m4/failed"}
	if len(got.Transitions) != len(want) || !got.UpdateTime.Equal(t0.Add(3*time.Second)) {
		t.Fatalf("GetOrder(o1) = %+v, want %d transitions updated at t0+3s", got, len(want))
	}
	for i, tr := range got.Transitions {
		if s := fmt.Sprintf("%s/%s/%s", tr.Type, tr.MessageID, tr.State); s != want[i] {
			t.Errorf("transition %d = %s, want %s", i, s, want[i])
		}
	}
	if _, err := s.GetOrder(ctx, "o2"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetOrder(o2) = %v, want ErrNotFound", err)
	}
}

func testOrderList(t *testing.T, s store.OrderStore) {
	ctx := t.Context()
	for i, sup := range []string{bob, carol, bob} {
		id := fmt.Sprintf("o%d", i+1)
		st := store.OrderActive
		if i == 1 {
			st = store.OrderFailed
		}
		if _, err := s.RecordOrder(ctx, order(id, fmt.Sprintf("d%d", i+1), sup), transition("accept_offer", id+"-m", alice, 0, st), true); err != nil {
			t.Fatal(err)
		}
	}
	ids := func(os []store.Order) []string {
		var out []string
		for _, o := range os {
			out = append(out, o.ID)
		}
		return out
	}
	if got, err := s.ListOrders(ctx, alice, "", t0, "", 10); err != nil || fmt.Sprint(ids(got)) != "[o1 o2 o3]" {
		t.Errorf("ListOrders(alice) = %v, %v; want [o1 o2 o3]", ids(got), err)
	}
	if got, _ := s.ListOrders(ctx, bob, "", t0, "", 10); fmt.Sprint(ids(got)) != "[o1 o3]" {
		t.Errorf("ListOrders(bob) = %v, want [o1 o3]", ids(got))
	}
	if got, _ := s.ListOrders(ctx, alice, store.OrderFailed, t0, "", 10); fmt.Sprint(ids(got)) != "[o2]" {
		t.Errorf("ListOrders(alice, failed) = %v, want [o2]", ids(got))
	}
	if got, _ := s.ListOrders(ctx, alice, "", t0, "o1", 1); fmt.Sprint(ids(got)) != "[o2]" {
		t.Errorf("ListOrders(alice, after o1, 1) = %v, want [o2]", ids(got))
	}
	if got, _ := s.ListOrders(ctx, "clients/c/agents/alic", "", t0, "", 10); len(got) != 0 {
		t.Errorf("ListOrders(a prefix of alice) = %v, want none", ids(got))
	}
}

// An active order whose pair's first pending deadline passes failed at
// that instant: read and listed by state so from then on, before the
// deadline's timer records the expiry, and the same after.
func testOrderLapse(t *testing.T, s store.OrderStore) {
	ctx := t.Context()
	lapse := &store.OrderLapse{Deadline: "offer_timeout", At: t0.Add(10 * time.Second), MessageID: "x1"}
	tr := transition("payment_error", "m2", bob, time.Second, store.OrderActive)
	tr.Lapse = lapse
	for _, w := range []struct {
		tr   store.OrderTransition
		open bool
	}{{transition("accept_offer", "m1", alice, 0, store.OrderActive), true}, {tr, false}} {
		if _, err := s.RecordOrder(ctx, order("o1", "d1", bob), w.tr, w.open); err != nil {
			t.Fatal(err)
		}
	}
	// Another active order, with no deadline pending.
	if _, err := s.RecordOrder(ctx, order("o2", "d2", bob), transition("accept_offer", "m3", alice, 0, store.OrderActive), true); err != nil {
		t.Fatal(err)
	}
	list := func(state store.OrderState, now time.Time) string {
		t.Helper()
		got, err := s.ListOrders(ctx, alice, state, now, "", 10)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, o := range got {
			o = o.At(now)
			out = append(out, fmt.Sprintf("%s/%s/%d", o.ID, o.State, len(o.Transitions)))
		}
		return fmt.Sprint(out)
	}
	before, at := lapse.At.Add(-time.Nanosecond), lapse.At
	for _, c := range []struct {
		state store.OrderState
		now   time.Time
		want  string
	}{
		{store.OrderActive, before, "[o1/active/2 o2/active/1]"},
		{store.OrderFailed, before, "[]"},
		{store.OrderActive, at, "[o2/active/1]"},
		{store.OrderFailed, at, "[o1/failed/3]"},
		{"", at, "[o1/failed/3 o2/active/1]"},
	} {
		if got := list(c.state, c.now); got != c.want {
			t.Errorf("ListOrders(alice, %q, deadline%+v) = %s, want %s", c.state, c.now.Sub(at), got, c.want)
		}
	}
	stored, err := s.GetOrder(ctx, "o1")
	if err != nil {
		t.Fatal(err)
	}
	read := stored.At(at)
	// The timer fires: the expiry it records is the one read already.
	fired, err := s.RecordOrder(ctx, order("o1", "d1", bob), transition("offer_timeout_expired", "x1", "", 10*time.Second, store.OrderFailed), false)
	if err != nil {
		t.Fatal(err)
	}
	if after := fired.At(at.Add(time.Hour)); !reflect.DeepEqual(read, after) {
		t.Errorf("order read at its lapse = %+v, after the expiry was recorded = %+v; want the same", read, after)
	}
	if got := list(store.OrderFailed, at); got != "[o1/failed/3]" {
		t.Errorf("ListOrders(alice, failed) after the expiry = %s, want [o1/failed/3]", got)
	}
}
