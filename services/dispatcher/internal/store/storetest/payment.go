package storetest

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

// RunPayments runs the payment suite; open returns a new empty store.
func RunPayments(t *testing.T, open func(t *testing.T) store.PaymentStore) {
	t.Run("payments", func(t *testing.T) { testPayments(t, open(t)) })
	t.Run("payment requests", func(t *testing.T) { testPaymentRequests(t, open(t)) })
	t.Run("open payments", func(t *testing.T) { testOpenPayments(t, open(t)) })
	t.Run("payment sweep", func(t *testing.T) { testSweepPayments(t, open(t)) })
	t.Run("payment sweep batches", func(t *testing.T) { testSweepPaymentBatches(t, open(t)) })
	t.Run("spend", func(t *testing.T) { testSpend(t, open(t)) })
	t.Run("spend sweep batches", func(t *testing.T) { testSweepSpendBatches(t, open(t)) })
}

func testPayments(t *testing.T, s store.PaymentStore) {
	ctx := t.Context()
	p := store.Payment{ID: "p1", Payer: alice, Payee: bob, AmountMicros: 5, Currency: "USD", State: store.PaymentAuthorized, CreateTime: t0, UpdateTime: t0}
	if got, created, err := s.CreatePayment(ctx, p, "", nil); err != nil || !created || got != p {
		t.Fatalf("CreatePayment = %+v, %t, %v; want it created", got, created, err)
	}
	if _, _, err := s.CreatePayment(ctx, p, "", nil); !errors.Is(err, store.ErrAlreadyExists) {
		t.Errorf("CreatePayment(again) = %v, want ErrAlreadyExists", err)
	}
	if got, err := s.GetPayment(ctx, "p1"); err != nil || got != p {
		t.Errorf("GetPayment = %+v, %v; want %+v", got, err, p)
	}
	if _, err := s.GetPayment(ctx, "nope"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetPayment(absent) = %v, want ErrNotFound", err)
	}
	boom := errors.New("boom")
	if _, err := s.UpdatePayment(ctx, "p1", func(p *store.Payment) error { p.State = store.PaymentCaptured; return boom }); !errors.Is(err, boom) {
		t.Errorf("UpdatePayment(failing) = %v, want its error", err)
	}
	if got, _ := s.GetPayment(ctx, "p1"); got.State != store.PaymentAuthorized {
		t.Errorf("after a failed update the payment is %s, want it unchanged", got.State)
	}
	got, err := s.UpdatePayment(ctx, "p1", func(p *store.Payment) error { p.State, p.Order = store.PaymentReserved, "o1"; return nil })
	if err != nil || got.State != store.PaymentReserved || got.Order != "o1" {
		t.Errorf("UpdatePayment = %+v, %v; want reserved for o1", got, err)
	}
	if _, err := s.UpdatePayment(ctx, "nope", func(*store.Payment) error { return nil }); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("UpdatePayment(absent) = %v, want ErrNotFound", err)
	}
}

func testPaymentRequests(t *testing.T, s store.PaymentStore) {
	ctx := t.Context()
	p := store.Payment{ID: "p1", Payer: alice, Payee: bob, AmountMicros: 5, Currency: "USD", State: store.PaymentAuthorized, CreateTime: t0, UpdateTime: t0}
	if _, created, err := s.CreatePayment(ctx, p, "r1", nil); err != nil || !created {
		t.Fatalf("CreatePayment(r1) = %t, %v; want it created", created, err)
	}
	// A repeat by the same payer with the same id stores nothing and
	// returns the first payment, as it stands now.
	reserved, err := s.UpdatePayment(ctx, "p1", func(p *store.Payment) error { p.State, p.Order = store.PaymentReserved, "o1"; return nil })
	if err != nil {
		t.Fatal(err)
	}
	again := p
	again.ID, again.AmountMicros = "p2", 7
	got, created, err := s.CreatePayment(ctx, again, "r1", func(int) error { t.Error("check called on a repeat"); return nil })
	if err != nil || created || got != reserved {
		t.Errorf("CreatePayment(r1 again) = %+v, %t, %v; want %+v, not created", got, created, err, reserved)
	}
	if _, err := s.GetPayment(ctx, "p2"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetPayment(p2) = %v: a repeat stored a payment", err)
	}
	// The id is the payer's own: another payer's r1 is a new payment.
	other := store.Payment{ID: "p3", Payer: bob, Payee: alice, AmountMicros: 5, Currency: "USD", State: store.PaymentAuthorized, CreateTime: t0, UpdateTime: t0}
	if got, created, err := s.CreatePayment(ctx, other, "r1", nil); err != nil || !created || got != other {
		t.Errorf("CreatePayment(bob r1) = %+v, %t, %v; want it created", got, created, err)
	}
	// A refused create records nothing.
	over := errors.New("over")
	p4 := p
	p4.ID = "p4"
	if _, _, err := s.CreatePayment(ctx, p4, "r2", func(int) error { return over }); !errors.Is(err, over) {
		t.Errorf("CreatePayment(refused) = %v, want its error", err)
	}
	if got, created, err := s.CreatePayment(ctx, p4, "r2", nil); err != nil || !created || got != p4 {
		t.Errorf("CreatePayment(r2 after a refusal) = %+v, %t, %v; want it created", got, created, err)
	}
	// The sweep forgets ids recorded before its time.
	if n, err := s.SweepPaymentRequests(ctx, t0, 10); err != nil || n != 0 {
		t.Errorf("SweepPaymentRequests(t0) = %d, %v; want 0", n, err)
	}
	if n, err := s.SweepPaymentRequests(ctx, t0.Add(time.Nanosecond), 10); err != nil || n != 3 {
		t.Errorf("SweepPaymentRequests(after) = %d, %v; want 3", n, err)
	}
	p5 := p
	p5.ID = "p5"
	if got, created, err := s.CreatePayment(ctx, p5, "r1", nil); err != nil || !created || got != p5 {
		t.Errorf("CreatePayment(r1 after the sweep) = %+v, %t, %v; want a new payment", got, created, err)
	}
}

func testOpenPayments(t *testing.T, s store.PaymentStore) {
	ctx := t.Context()
	var seen []int
	check := func(open int) error { seen = append(seen, open); return nil }
	pay := func(id, payer string) store.Payment {
		return store.Payment{ID: id, Payer: payer, Payee: carol, AmountMicros: 1, Currency: "USD", State: store.PaymentAuthorized, CreateTime: t0, UpdateTime: t0}
	}
	for _, p := range []store.Payment{pay("a1", alice), pay("a2", alice), pay("b1", bob), pay("a3", alice)} {
		if _, _, err := s.CreatePayment(ctx, p, "", check); err != nil {
			t.Fatal(err)
		}
	}
	// Reserved payments stay open; captured ones do not count.
	if _, err := s.UpdatePayment(ctx, "a1", func(p *store.Payment) error { p.State = store.PaymentReserved; return nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := s.UpdatePayment(ctx, "a2", func(p *store.Payment) error { p.State = store.PaymentCaptured; return nil }); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.CreatePayment(ctx, pay("a4", alice), "", check); err != nil {
		t.Fatal(err)
	}
	if want := []int{0, 1, 0, 2, 2}; !slices.Equal(seen, want) {
		t.Errorf("check saw %v open payments, want %v", seen, want)
	}
}

func testSweepPayments(t *testing.T, s store.PaymentStore) {
	ctx := t.Context()
	t1 := t0.Add(time.Hour)
	pay := func(id string, at time.Time) store.Payment {
		return store.Payment{ID: id, Payer: alice, Payee: bob, AmountMicros: 1, Currency: "USD", State: store.PaymentAuthorized, CreateTime: at, UpdateTime: at}
	}
	for _, p := range []store.Payment{pay("old-authorized", t0), pay("old-reserved", t0), pay("old-captured", t0), pay("new-captured", t0), pay("new-authorized", t1)} {
		if _, _, err := s.CreatePayment(ctx, p, "r-"+p.ID, nil); err != nil {
			t.Fatal(err)
		}
	}
	set := func(id string, st store.PaymentState, at time.Time) {
		t.Helper()
		if _, err := s.UpdatePayment(ctx, id, func(p *store.Payment) error { p.State, p.UpdateTime = st, at; return nil }); err != nil {
			t.Fatal(err)
		}
	}
	set("old-reserved", store.PaymentReserved, t0)
	set("old-captured", store.PaymentReserved, t0)
	set("old-captured", store.PaymentCaptured, t0)
	set("new-captured", store.PaymentReserved, t0)
	set("new-captured", store.PaymentCaptured, t1)
	if n, err := s.SweepPayments(ctx, t0, 10); err != nil || n != 0 {
		t.Errorf("SweepPayments(t0) = %d, %v; want 0", n, err)
	}
	// Payments last changed before the time go unless reserved: an order
	// holds those.
	if n, err := s.SweepPayments(ctx, t1, 10); err != nil || n != 2 {
		t.Errorf("SweepPayments(t1) = %d, %v; want 2", n, err)
	}
	for id, kept := range map[string]bool{"old-authorized": false, "old-reserved": true, "old-captured": false, "new-captured": true, "new-authorized": true} {
		if _, err := s.GetPayment(ctx, id); (err == nil) != kept {
			t.Errorf("GetPayment(%s) after the sweep = %v, want kept %t", id, err, kept)
		}
	}
	// A removed payment is no longer open, and its request_id names
	// nothing: a repeat creates anew.
	open := -1
	p := pay("again", t1)
	if got, created, err := s.CreatePayment(ctx, p, "r-old-authorized", func(n int) error { open = n; return nil }); err != nil || !created || got != p || open != 2 {
		t.Errorf("CreatePayment(r-old-authorized) = %+v, %t, %v, saw %d open; want it created, 2 open", got, created, err, open)
	}
	// Reserved, then released and left: it goes with its new time.
	set("old-reserved", store.PaymentAuthorized, t1)
	if n, err := s.SweepPayments(ctx, t1.Add(time.Second), 10); err != nil || n != 4 {
		t.Errorf("SweepPayments(t1+1s) = %d, %v; want 4", n, err)
	}
}

// testSweepPaymentBatches sweeps more payments and request ids than one
// call may remove: each call removes at most its limit, oldest first, and
// the calls together remove exactly what is due.
func testSweepPaymentBatches(t *testing.T, s store.PaymentStore) {
	ctx := t.Context()
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Second) }
	pay := func(id string, t time.Time) store.Payment {
		return store.Payment{ID: id, Payer: alice, Payee: bob, AmountMicros: 1, Currency: "USD", State: store.PaymentAuthorized, CreateTime: t, UpdateTime: t}
	}
	// Created newest first, so that neither id nor insertion order is
	// the time order.
	const due = 7
	for i := due - 1; i >= 0; i-- {
		if _, _, err := s.CreatePayment(ctx, pay(fmt.Sprintf("p%d", due-i), at(i)), fmt.Sprintf("r%d", i), nil); err != nil {
			t.Fatal(err)
		}
	}
	// A reserved payment is never due; it must not use up a batch.
	if _, _, err := s.CreatePayment(ctx, pay("held", t0), "", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.UpdatePayment(ctx, "held", func(p *store.Payment) error { p.State = store.PaymentReserved; return nil }); err != nil {
		t.Fatal(err)
	}
	cut := at(due)
	sweepOldestFirst(t, "SweepPayments", due, func(limit int) (int, error) { return s.SweepPayments(ctx, cut, limit) }, func(i int) bool {
		_, err := s.GetPayment(ctx, fmt.Sprintf("p%d", due-i))
		return errors.Is(err, store.ErrNotFound)
	}, func(i int) string { return fmt.Sprintf("the payment created at +%ds", i) })
	if _, err := s.GetPayment(ctx, "held"); err != nil {
		t.Errorf("GetPayment(held) after the sweeps = %v, want it kept", err)
	}

	// r0's payment is gone, so r0 creates anew and is recorded again,
	// later: the sweeps below must not forget it under its first time.
	again := pay("again", cut)
	if _, created, err := s.CreatePayment(ctx, again, "r0", nil); err != nil || !created {
		t.Fatalf("CreatePayment(r0 after its payment was swept) = %t, %v; want it created", created, err)
	}
	var got []int
	for range due {
		n, err := s.SweepPaymentRequests(ctx, at(5), 2)
		if err != nil {
			t.Fatalf("SweepPaymentRequests(limit 2) = %v", err)
		}
		got = append(got, n)
		if n == 0 {
			break
		}
	}
	// r1 to r4 were recorded before +5s; r0 now at +7s.
	if want := []int{2, 2, 0}; !slices.Equal(got, want) {
		t.Errorf("SweepPaymentRequests(+5s, limit 2) forgot %v per call, want %v", got, want)
	}
	if p, created, err := s.CreatePayment(ctx, pay("p-other", cut), "r0", nil); err != nil || created || p.ID != "again" {
		t.Errorf("CreatePayment(r0) after the sweeps = %s, created %t, %v; want payment again, not created", p.ID, created, err)
	}
	if n, err := s.SweepPaymentRequests(ctx, cut.Add(time.Second), 10); err != nil || n != 3 {
		t.Errorf("SweepPaymentRequests(all) = %d, %v; want 3 (r5, r6, r0)", n, err)
	}
}

func testSpend(t *testing.T, s store.PaymentStore) {
	ctx := t.Context()
	var seen []int64
	check := func(total int64) error { seen = append(seen, total); return nil }
	limit := errors.New("over")
	for _, sp := range []store.Spend{
		{Agent: alice, Day: "2026-12-02", Order: "o1", AmountMicros: 10},
		{Agent: alice, Day: "2026-12-02", Order: "o2", AmountMicros: 5},
		{Agent: alice, Day: "2026-12-02", Order: "o1", AmountMicros: 10}, // counted once
		{Agent: bob, Day: "2026-12-02", Order: "o3", AmountMicros: 7},
		{Agent: alice, Day: "2026-12-03", Order: "o4", AmountMicros: 1},
	} {
		if err := s.AddSpend(ctx, sp, check); err != nil {
			t.Fatalf("AddSpend(%+v) = %v", sp, err)
		}
	}
	if want := []int64{0, 10, 0, 0}; !slices.Equal(seen, want) {
		t.Errorf("check saw day totals %v, want %v", seen, want)
	}
	refused := store.Spend{Agent: alice, Day: "2026-12-02", Order: "o5", AmountMicros: 1}
	if err := s.AddSpend(ctx, refused, func(int64) error { return limit }); !errors.Is(err, limit) {
		t.Errorf("AddSpend(refused) = %v, want the check's error", err)
	}
	if err := s.RemoveSpend(ctx, alice, "o2"); err != nil {
		t.Fatal(err)
	}
	if err := s.RemoveSpend(ctx, alice, "never"); err != nil {
		t.Errorf("RemoveSpend(never added) = %v", err)
	}
	seen = nil
	if err := s.AddSpend(ctx, refused, check); err != nil || !slices.Equal(seen, []int64{10}) {
		t.Errorf("AddSpend after a refusal and a removal saw %v (%v), want the total 10: o1 only", seen, err)
	}
}

func testSweepSpendBatches(t *testing.T, s store.PaymentStore) {
	ctx := t.Context()
	// Due (days ended by the cut, 2026-11-02 05:00 UTC), oldest first:
	// o1 and o2 share the first day, no other due day is shared, so that
	// each batch of 3 ends between two days.
	due := []store.Spend{
		{Agent: alice, Day: "2026-10-01", Order: "o1", AmountMicros: 1},
		{Agent: bob, Day: "2026-10-01", Order: "o2", AmountMicros: 2},
		{Agent: alice, Day: "2026-10-03", Order: "o3", AmountMicros: 3},
		{Agent: alice, Day: "2026-10-05", Order: "o4", AmountMicros: 4},
		{Agent: bob, Day: "2026-10-20", Order: "o5", AmountMicros: 5},
		{Agent: alice, Day: "2026-10-31", Order: "o6", AmountMicros: 6},
		{Agent: alice, Day: "2026-11-01", Order: "o7", AmountMicros: 7},
	}
	// Kept: the cut's own day has not ended; the last two are "yesterday"
	// and "today" for a caller at 2026-12-02.
	kept := []store.Spend{
		{Agent: alice, Day: "2026-11-02", Order: "o8", AmountMicros: 8},
		{Agent: alice, Day: "2026-12-01", Order: "o9", AmountMicros: 9},
		{Agent: alice, Day: "2026-12-02", Order: "o10", AmountMicros: 10},
		{Agent: alice, Day: "2026-12-02", Order: "o11", AmountMicros: 11},
		{Agent: bob, Day: "2026-12-02", Order: "o12", AmountMicros: 12},
	}
	// Added newest first, so that neither key nor insertion order is the
	// day order.
	all := slices.Concat(due, kept)
	for i := len(all) - 1; i >= 0; i-- {
		if err := s.AddSpend(ctx, all[i], func(int64) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	probe := errors.New("probe")
	// counted reports whether sp's order is still counted: AddSpend then
	// calls no check. Otherwise the check refuses it and nothing is
	// written.
	counted := func(sp store.Spend) bool {
		t.Helper()
		err := s.AddSpend(ctx, sp, func(int64) error { return probe })
		if err != nil && !errors.Is(err, probe) {
			t.Fatal(err)
		}
		return err == nil
	}
	// total is agent's total of day.
	total := func(agent, day string) int64 {
		t.Helper()
		var got int64
		err := s.AddSpend(ctx, store.Spend{Agent: agent, Day: day, Order: "probe", AmountMicros: 1}, func(d int64) error { got = d; return probe })
		if !errors.Is(err, probe) {
			t.Fatalf("AddSpend(probe) = %v", err)
		}
		return got
	}
	today := total(alice, "2026-12-02")
	if today != 21 {
		t.Fatalf("alice's total of 2026-12-02 before the sweeps = %d, want 21", today)
	}
	cut := time.Date(2026, 11, 2, 5, 0, 0, 0, time.UTC)
	sweepOldestFirst(t, "SweepSpends", len(due), func(limit int) (int, error) { return s.SweepSpends(ctx, cut, limit) }, func(i int) bool { return !counted(due[i]) }, func(i int) string { return due[i].Order + " of " + due[i].Day })
	for _, sp := range kept {
		if !counted(sp) {
			t.Errorf("after the sweeps: %s of %s is no longer counted, want it kept", sp.Order, sp.Day)
		}
	}
	if got := total(alice, "2026-12-02"); got != today {
		t.Errorf("alice's total of 2026-12-02 after the sweeps = %d, want %d unchanged", got, today)
	}
	for _, c := range []struct {
		agent, day string
		want       int64
	}{{alice, "2026-12-01", 9}, {alice, "2026-11-02", 8}, {bob, "2026-12-02", 12}, {alice, "2026-10-05", 0}, {bob, "2026-10-01", 0}} {
		if got := total(c.agent, c.day); got != c.want {
			t.Errorf("%s's total of %s after the sweeps = %d, want %d", c.agent, c.day, got, c.want)
		}
	}
	// A swept order is counted anew, on the day it is counted again.
	again := due[0]
	again.Day = "2026-12-02"
	if err := s.AddSpend(ctx, again, func(int64) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if got := total(alice, "2026-12-02"); got != today+again.AmountMicros {
		t.Errorf("alice's total of 2026-12-02 after counting swept o1 again = %d, want %d", got, today+again.AmountMicros)
	}
	if n, err := s.SweepSpends(ctx, time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC), 100); err != nil || n != len(kept)+1 {
		t.Errorf("SweepSpends(all) = %d, %v; want %d", n, err, len(kept)+1)
	}
}
