package payment_test

import (
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/parleyhq/parley/services/dispatcher/internal/approval"
	"github.com/parleyhq/parley/services/dispatcher/internal/payment"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
	"github.com/parleyhq/parley/services/dispatcher/internal/store/boltstore"
)

const (
	consumer = "clients/c/agents/buyer"
	supplier = "clients/s/agents/shop"
)

var now = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

type fixture struct {
	st     *boltstore.Store
	gate   *payment.Gate
	ledger *payment.Ledger
	priv   ed25519.PrivateKey
	pub    ed25519.PublicKey
	ids    int
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	st, err := boltstore.Open(t.TempDir(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	f := &fixture{st: st}
	f.ledger = payment.NewLedger(st, func() string { f.ids++; return fmt.Sprintf("pay%d", f.ids) }, func() time.Time { return now }, payment.LedgerLimits{})
	f.gate = payment.NewGate(st, map[string]payment.Provider{payment.LedgerName: f.ledger})
	seed := make([]byte, ed25519.SeedSize)
	f.priv = ed25519.NewKeyFromSeed(seed)
	f.pub = f.priv.Public().(ed25519.PublicKey)
	return f
}

func usd(amount int64) *payment.Price { return &payment.Price{AmountMicros: amount, Currency: "USD"} }

func body(t *testing.T, v map[string]any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func ruleOf(err error) string {
	var r *payment.Refusal
	var a *approval.Refusal
	switch {
	case errors.As(err, &r):
		return string(r.Rule)
	case errors.As(err, &a):
		return string(a.Rule)
	case err != nil:
		return "error: " + err.Error()
	}
	return ""
}

func (f *fixture) approve(order string, amount int64, expires time.Time) approval.Approval {
	return approval.Sign(f.priv, approval.Terms{Order: order, AmountMicros: amount, Currency: "USD", Payee: supplier}, expires)
}

func TestGate_accept(t *testing.T) {
	limit := func(v int64) *int64 { return &v }
	for _, c := range []struct {
		name  string
		terms payment.Terms
		owner func(f *fixture) payment.Owner
		body  func(f *fixture) map[string]any
		want  string // "" accepts
	}{
		{"unpriced offer", payment.Terms{}, nil, nil, ""},
		{"priced, no limits, no payment needed", payment.Terms{Price: usd(5_000_000)}, nil, nil, ""},
		{"payment required and missing", payment.Terms{Price: usd(5), PaymentRequired: true}, nil, nil, "PAYMENT_MISSING"},
		{"unknown provider", payment.Terms{Price: usd(5), PaymentRequired: true}, nil,
			func(*fixture) map[string]any {
				return map[string]any{"payment": map[string]any{"provider": "stripe", "reference": "x"}}
			}, "PAYMENT_PROVIDER"},
		{"unknown reference", payment.Terms{Price: usd(5), PaymentRequired: true}, nil,
			func(*fixture) map[string]any { return map[string]any{"payment": ref("nope")} }, "PAYMENT_REFERENCE"},
		{"reference of another amount", payment.Terms{Price: usd(5), PaymentRequired: true}, nil,
			func(f *fixture) map[string]any { return map[string]any{"payment": ref(f.pay(t, consumer, 6))} }, "PAYMENT_REFERENCE"},
		{"reference of another payer", payment.Terms{Price: usd(5), PaymentRequired: true}, nil,
			func(f *fixture) map[string]any {
				return map[string]any{"payment": ref(f.pay(t, "clients/x/agents/y", 5))}
			}, "PAYMENT_REFERENCE"},
		{"paid", payment.Terms{Price: usd(5), PaymentRequired: true}, nil,
			func(f *fixture) map[string]any { return map[string]any{"payment": ref(f.pay(t, consumer, 5))} }, ""},
		{"over the transaction limit, approved or not", payment.Terms{Price: usd(11)},
			func(f *fixture) payment.Owner { return payment.Owner{ApprovalKey: f.pub, TransactionLimit: 10} },
			func(f *fixture) map[string]any {
				return map[string]any{"human_authorization": f.approve("o1", 11, now.Add(time.Hour))}
			}, "SPENDING_LIMIT"},
		{"limits in USD, price in EUR", payment.Terms{Price: &payment.Price{AmountMicros: 1, Currency: "EUR"}},
			func(*fixture) payment.Owner { return payment.Owner{DailyLimit: 10} }, nil, "SPENDING_LIMIT"},
		{"human authorization required, none sent", payment.Terms{Price: usd(5), HumanAuthorizationRequired: true},
			func(f *fixture) payment.Owner { return payment.Owner{ApprovalKey: f.pub} }, nil, "APPROVAL_MISSING"},
		{"human authorization required, no key registered", payment.Terms{Price: usd(5), HumanAuthorizationRequired: true}, nil,
			func(f *fixture) map[string]any {
				return map[string]any{"human_authorization": f.approve("o1", 5, now.Add(time.Hour))}
			}, "APPROVAL_KEY_MISSING"},
		{"human authorization required and given", payment.Terms{Price: usd(5), HumanAuthorizationRequired: true},
			func(f *fixture) payment.Owner { return payment.Owner{ApprovalKey: f.pub} },
			func(f *fixture) map[string]any {
				return map[string]any{"human_authorization": f.approve("o1", 5, now.Add(time.Hour))}
			}, ""},
		{"approval of another order", payment.Terms{Price: usd(5), HumanAuthorizationRequired: true},
			func(f *fixture) payment.Owner { return payment.Owner{ApprovalKey: f.pub} },
			func(f *fixture) map[string]any {
				return map[string]any{"human_authorization": f.approve("o2", 5, now.Add(time.Hour))}
			}, "APPROVAL_TERMS"},
		{"approval expired", payment.Terms{Price: usd(5), HumanAuthorizationRequired: true},
			func(f *fixture) payment.Owner { return payment.Owner{ApprovalKey: f.pub} },
			func(f *fixture) map[string]any { return map[string]any{"human_authorization": f.approve("o1", 5, now)} }, "APPROVAL_EXPIRED"},
		{"over the automated transaction limit, no approval", payment.Terms{Price: usd(11)},
			func(f *fixture) payment.Owner {
				return payment.Owner{ApprovalKey: f.pub, AutomatedPerTransaction: limit(10)}
			}, nil, "APPROVAL_MISSING"},
		{"within the automated transaction limit", payment.Terms{Price: usd(10)},
			func(f *fixture) payment.Owner {
				return payment.Owner{ApprovalKey: f.pub, AutomatedPerTransaction: limit(10)}
			}, nil, ""},
		{"automated limit 0 always asks", payment.Terms{Price: usd(1)},
			func(f *fixture) payment.Owner {
				return payment.Owner{ApprovalKey: f.pub, AutomatedPerTransaction: limit(0)}
			}, nil, "APPROVAL_MISSING"},
		{"over the automated daily limit, no approval", payment.Terms{Price: usd(11)},
			func(f *fixture) payment.Owner { return payment.Owner{ApprovalKey: f.pub, AutomatedPerDay: limit(10)} }, nil, "APPROVAL_MISSING"},
		{"over the automated daily limit, approved", payment.Terms{Price: usd(11)},
			func(f *fixture) payment.Owner { return payment.Owner{ApprovalKey: f.pub, AutomatedPerDay: limit(10)} },
			func(f *fixture) map[string]any {
				return map[string]any{"human_authorization": f.approve("o1", 11, now.Add(time.Minute))}
			}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t)
			a := payment.Acceptance{Order: "o1", Consumer: consumer, Supplier: supplier, Terms: c.terms, Time: now}
			if c.owner != nil {
				a.Owner = c.owner(f)
			}
			a.Body = []byte(`{}`)
			if c.body != nil {
				a.Body = body(t, c.body(f))
			}
			if got := ruleOf(f.gate.Accept(t.Context(), a)); got != c.want {
				t.Errorf("Accept = %q, want %q", got, c.want)
			}
		})
	}
}

func ref(id string) payment.Reference {
	return payment.Reference{Provider: payment.LedgerName, Reference: id}
}

func (f *fixture) pay(t *testing.T, payer string, amount int64) string {
	t.Helper()
	p, err := f.ledger.Create(t.Context(), payer, supplier, *usd(amount), "")
	if err != nil {
		t.Fatal(err)
	}
	return p.ID
}

// TestGate_dailyLimit: acceptances of one UTC day add up; a refused one
// counts nothing and leaves its payment unreserved; the next day starts
// at 0; accepting the same order again counts it once.
func TestGate_dailyLimit(t *testing.T) {
	f := newFixture(t)
	owner := payment.Owner{DailyLimit: 10}
	accept := func(order string, amount int64, at time.Time) (string, string) {
		id := f.pay(t, consumer, amount)
		a := payment.Acceptance{Order: order, Consumer: consumer, Supplier: supplier, Owner: owner, Time: at,
			Terms: payment.Terms{Price: usd(amount), PaymentRequired: true}, Body: body(t, map[string]any{"payment": ref(id)})}
		return ruleOf(f.gate.Accept(t.Context(), a)), id
	}
	if got, _ := accept("o1", 6, now); got != "" {
		t.Fatalf("first acceptance = %s", got)
	}
	got, refused := accept("o2", 5, now)
	if got != "SPENDING_LIMIT" {
		t.Errorf("6+5 over a daily limit of 10 = %q, want SPENDING_LIMIT", got)
	}
	if p, _ := f.st.GetPayment(t.Context(), refused); p.State != store.PaymentAuthorized {
		t.Errorf("the refused acceptance's payment is %s, want it still authorized", p.State)
	}
	if got, _ := accept("o3", 4, now); got != "" {
		t.Errorf("6+4 within a daily limit of 10 = %q, want accepted", got)
	}
	if got, _ := accept("o1", 6, now); got != "" {
		t.Errorf("o1 again (a new payment after payment_error) = %q, want accepted: an order counts once", got)
	}
	if got, _ := accept("o4", 10, now.Add(24*time.Hour)); got != "" {
		t.Errorf("the next day = %q, want accepted", got)
	}
}

// TestLedger_capture: only the payee captures, only a reserved payment.
func TestLedger_capture(t *testing.T) {
	f := newFixture(t)
	id := f.pay(t, consumer, 5)
	if _, err := f.ledger.Capture(t.Context(), id, supplier); !errors.Is(err, payment.ErrNotReserved) {
		t.Errorf("Capture(authorized) = %v, want ErrNotReserved", err)
	}
	c := payment.Charge{Order: "o1", Payer: consumer, Payee: supplier, Price: *usd(5)}
	if err := f.ledger.Reserve(t.Context(), id, c); err != nil {
		t.Fatal(err)
	}
	c.Order = "o2"
	if got := ruleOf(f.ledger.Reserve(t.Context(), id, c)); got != "PAYMENT_REFERENCE" {
		t.Errorf("Reserve for a second order = %q, want PAYMENT_REFERENCE", got)
	}
	if _, err := f.ledger.Capture(t.Context(), id, consumer); !errors.Is(err, payment.ErrNotPayee) {
		t.Errorf("Capture by the payer = %v, want ErrNotPayee", err)
	}
	for range 2 {
		if p, err := f.ledger.Capture(t.Context(), id, supplier); err != nil || p.State != store.PaymentCaptured {
			t.Errorf("Capture by the payee = %+v, %v; want captured (twice is harmless)", p, err)
		}
	}
}

// TestLedger_openLimit: a payer holds at most maxOpen payments not yet
// captured; a capture frees a place, other payers are not counted, and a
// repeat of a recorded request_id is not refused.
func TestLedger_openLimit(t *testing.T) {
	f := newFixture(t)
	ids := 0
	l := payment.NewLedger(f.st, func() string { ids++; return fmt.Sprintf("lim%d", ids) }, func() time.Time { return now }, payment.LedgerLimits{MaxOpen: 2})
	create := func(payer, requestID string) (store.Payment, error) {
		return l.Create(t.Context(), payer, supplier, *usd(5), requestID)
	}
	first, err := create(consumer, "r1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := create(consumer, ""); err != nil {
		t.Fatal(err)
	}
	_, err = create(consumer, "")
	if !errors.Is(err, payment.ErrOpenLimit) || !strings.Contains(err.Error(), "2 open payments") {
		t.Fatalf("Create(third open) = %v, want ErrOpenLimit naming the count", err)
	}
	if p, err := create(consumer, "r1"); err != nil || p.ID != first.ID {
		t.Errorf("Create(repeat of r1 at the limit) = %+v, %v; want the first payment", p, err)
	}
	if _, err := create("clients/c/agents/other", ""); err != nil {
		t.Errorf("Create(another payer) = %v, want it created", err)
	}
	c := payment.Charge{Order: "o1", Payer: consumer, Payee: supplier, Price: *usd(5)}
	if err := l.Reserve(t.Context(), first.ID, c); err != nil {
		t.Fatal(err)
	}
	if _, err := create(consumer, ""); !errors.Is(err, payment.ErrOpenLimit) {
		t.Errorf("Create(with one reserved) = %v, want ErrOpenLimit: reserved payments are open", err)
	}
	if _, err := l.Capture(t.Context(), first.ID, supplier); err != nil {
		t.Fatal(err)
	}
	if _, err := create(consumer, ""); err != nil {
		t.Errorf("Create(after a capture) = %v, want it created", err)
	}
}

// TestLedger_requestID: a repeat of a payer's request_id returns the first
// payment; one asking for another payment is ErrRequestReused.
func TestLedger_requestID(t *testing.T) {
	f := newFixture(t)
	first, err := f.ledger.Create(t.Context(), consumer, supplier, *usd(5), "r1")
	if err != nil {
		t.Fatal(err)
	}
	if p, err := f.ledger.Create(t.Context(), consumer, supplier, *usd(5), "r1"); err != nil || p != first {
		t.Errorf("Create(repeat) = %+v, %v; want %+v", p, err, first)
	}
	for _, price := range []payment.Price{*usd(6), {AmountMicros: 5, Currency: "EUR"}} {
		if _, err := f.ledger.Create(t.Context(), consumer, supplier, price, "r1"); !errors.Is(err, payment.ErrRequestReused) {
			t.Errorf("Create(r1 for %+v) = %v, want ErrRequestReused", price, err)
		}
	}
	if _, err := f.ledger.Create(t.Context(), consumer, "clients/c/agents/else", *usd(5), "r1"); !errors.Is(err, payment.ErrRequestReused) {
		t.Errorf("Create(r1 to another payee) = %v, want ErrRequestReused", err)
	}
	for i := 2; i <= f.ids; i++ {
		if _, err := f.st.GetPayment(t.Context(), fmt.Sprintf("pay%d", i)); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("GetPayment(pay%d) = %v: a repeat stored a payment", i, err)
		}
	}
}

// A sweep with more due than one transaction may remove goes on, batch
// by batch, until nothing due is left.
func TestLedger_sweepRemovesMoreThanOneBatch(t *testing.T) {
	f := newFixture(t)
	clock := now
	ledger := payment.NewLedger(f.st, func() string { f.ids++; return fmt.Sprintf("pay%d", f.ids) }, func() time.Time { return clock },
		payment.LedgerLimits{Retention: time.Hour})
	const due = 2*payment.SweepBatch + 1
	for i := range due {
		if _, err := ledger.Create(t.Context(), consumer, supplier, *usd(1), fmt.Sprintf("r%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	clock = now.Add(payment.RequestRetention + time.Second)
	if n, err := ledger.Sweep(t.Context()); err != nil || n != due {
		t.Errorf("Sweep = %d, %v; want %d payments removed", n, err, due)
	}
	// Every request id is forgotten too: r0 and the last create anew.
	for _, id := range []string{"r0", fmt.Sprintf("r%d", due-1)} {
		p, err := ledger.Create(t.Context(), consumer, supplier, *usd(1), id)
		if err != nil || p.CreateTime != clock {
			t.Errorf("Create(%s) after the sweep = %+v, %v; want a new payment", id, p, err)
		}
	}
}

// TestLedger_sweepRemovesSpendsInBatches: the periodic sweep removes the
// spend records of the days that ended more than Retention ago, more than
// one batch of them, and never today's or yesterday's, even when
// Retention is shorter than a day.
func TestLedger_sweepRemovesSpendsInBatches(t *testing.T) {
	f := newFixture(t)
	ctx := t.Context()
	day := func(daysAgo int) string { return now.AddDate(0, 0, -daysAgo).Format(time.DateOnly) }
	spend := func(order string, daysAgo int) store.Spend {
		return store.Spend{Agent: consumer, Day: day(daysAgo), Order: order, AmountMicros: 1}
	}
	// With a Retention of 3 days at 12:00, the days 4 and more days ago
	// have ended more than 3 days ago; 3 days ago has not.
	const due = 2*payment.SweepBatch + 1
	var kept []store.Spend
	for i := range due {
		if err := f.st.AddSpend(ctx, spend(fmt.Sprintf("old%d", i), 4+i%40), func(int64) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	for i, ago := range []int{3, 1, 1, 0, 0} {
		sp := spend(fmt.Sprintf("new%d", i), ago)
		kept = append(kept, sp)
		if err := f.st.AddSpend(ctx, sp, func(int64) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	counted := func(sp store.Spend) bool {
		t.Helper()
		probe := errors.New("probe")
		err := f.st.AddSpend(ctx, sp, func(int64) error { return probe })
		if err != nil && !errors.Is(err, probe) {
			t.Fatal(err)
		}
		return err == nil
	}
	sweep := func(retention time.Duration) {
		t.Helper()
		ledger := payment.NewLedger(f.st, func() string { return "unused" }, func() time.Time { return now }, payment.LedgerLimits{Retention: retention})
		if _, err := ledger.Sweep(ctx); err != nil {
			t.Fatal(err)
		}
	}
	sweep(3 * 24 * time.Hour)
	for i := range due {
		if sp := spend(fmt.Sprintf("old%d", i), 4+i%40); counted(sp) {
			t.Errorf("after Sweep: %s of %s is still counted, want it removed", sp.Order, sp.Day)
		}
	}
	for _, sp := range kept {
		if !counted(sp) {
			t.Errorf("after Sweep: %s of %s is no longer counted, want it kept", sp.Order, sp.Day)
		}
	}
	// A Retention of an hour at 12:00 would reach into today: yesterday's
	// and today's records stay all the same, 3 days ago's go.
	sweep(time.Hour)
	for _, sp := range kept {
		if gone := !counted(sp); gone != (sp.Day == day(3)) {
			t.Errorf("after Sweep(Retention 1h): %s of %s gone = %t, want %t", sp.Order, sp.Day, gone, sp.Day == day(3))
		}
	}
	// No Retention keeps the spend records, as it keeps the payments.
	if err := f.st.AddSpend(ctx, spend("old0", 4), func(int64) error { return nil }); err != nil {
		t.Fatal(err)
	}
	sweep(0)
	if !counted(spend("old0", 4)) {
		t.Error("after Sweep(no Retention): old0 is no longer counted, want it kept")
	}
}
