package server

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/platform/grpcerr"
)

func (e *serviceEnv) createPayment(payer, payee string, amount int64) *dispatcherv1.Payment {
	e.t.Helper()
	p, err := e.client.CreatePayment(e.t.Context(), &dispatcherv1.CreatePaymentRequest{
		Parent: payer, Payment: &dispatcherv1.Payment{Payee: payee, AmountMicros: amount, Currency: "USD"},
	})
	if err != nil {
		e.t.Fatalf("CreatePayment error = %v", err)
	}
	return p
}

// A payment is read by its payer and payee only, each under its own name,
// and captured by its payee only once an acceptance reserved it.
func TestPayments_createGetCapture(t *testing.T) {
	e := startService(t)
	p := e.createPayment(netAlice, netBob, 2_500_000)
	_, id, _ := cutPayment(p.GetName())
	if p.GetPayer() != netAlice || p.GetPayee() != netBob || p.GetState() != dispatcherv1.PaymentState_PAYMENT_STATE_AUTHORIZED ||
		p.GetName() != netAlice+"/payments/"+id || len(id) != 32 {
		t.Fatalf("CreatePayment = %v, want alice's authorized payment to bob", p)
	}
	for _, agent := range []string{netAlice, netBob} {
		if got, err := e.client.GetPayment(t.Context(), &dispatcherv1.GetPaymentRequest{Name: agent + "/payments/" + id}); err != nil || got.GetAmountMicros() != 2_500_000 {
			t.Errorf("GetPayment(%s's view) = %v, %v", agent, got, err)
		}
	}
	if _, err := e.client.GetPayment(t.Context(), &dispatcherv1.GetPaymentRequest{Name: netCarol + "/payments/" + id}); status.Code(err) != codes.NotFound {
		t.Errorf("GetPayment(carol's view) error = %v, want NOT_FOUND", err)
	}
	if _, err := e.client.CapturePayment(t.Context(), &dispatcherv1.CapturePaymentRequest{Name: netBob + "/payments/" + id}); status.Code(err) != codes.FailedPrecondition ||
		grpcerr.Reason(err) != "PAYMENT_NOT_RESERVED" {
		t.Errorf("CapturePayment(not reserved) error = %v, want FAILED_PRECONDITION PAYMENT_NOT_RESERVED", err)
	}
	if _, err := e.client.CapturePayment(t.Context(), &dispatcherv1.CapturePaymentRequest{Name: netAlice + "/payments/" + id}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("CapturePayment(by the payer) error = %v, want PERMISSION_DENIED", err)
	}
}

func TestPayments_refusesBadInput(t *testing.T) {
	e := startService(t)
	for _, c := range []struct {
		name string
		req  *dispatcherv1.CreatePaymentRequest
	}{
		{"bad parent", &dispatcherv1.CreatePaymentRequest{Parent: "alice", Payment: &dispatcherv1.Payment{Payee: netBob, AmountMicros: 1, Currency: "USD"}}},
		{"no payment", &dispatcherv1.CreatePaymentRequest{Parent: netAlice}},
		{"bad payee", &dispatcherv1.CreatePaymentRequest{Parent: netAlice, Payment: &dispatcherv1.Payment{Payee: "bob", AmountMicros: 1, Currency: "USD"}}},
		{"paying oneself", &dispatcherv1.CreatePaymentRequest{Parent: netAlice, Payment: &dispatcherv1.Payment{Payee: netAlice, AmountMicros: 1, Currency: "USD"}}},
		{"zero amount", &dispatcherv1.CreatePaymentRequest{Parent: netAlice, Payment: &dispatcherv1.Payment{Payee: netBob, Currency: "USD"}}},
		{"bad currency", &dispatcherv1.CreatePaymentRequest{Parent: netAlice, Payment: &dispatcherv1.Payment{Payee: netBob, AmountMicros: 1, Currency: "usd"}}},
		{"bad request_id", &dispatcherv1.CreatePaymentRequest{Parent: netAlice, Payment: &dispatcherv1.Payment{Payee: netBob, AmountMicros: 1, Currency: "USD"}, RequestId: "a b"}},
		{"long request_id", &dispatcherv1.CreatePaymentRequest{Parent: netAlice, Payment: &dispatcherv1.Payment{Payee: netBob, AmountMicros: 1, Currency: "USD"}, RequestId: strings.Repeat("a", 65)}},
	} {
		if _, err := e.client.CreatePayment(t.Context(), c.req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("CreatePayment(%s) error = %v, want INVALID_ARGUMENT", c.name, err)
		}
	}
	for _, name := range []string{"", netAlice + "/payments/", netAlice + "/payments/x/y", "alice/payments/0123"} {
		if _, err := e.client.GetPayment(t.Context(), &dispatcherv1.GetPaymentRequest{Name: name}); status.Code(err) != codes.InvalidArgument {
			t.Errorf("GetPayment(%q) error = %v, want INVALID_ARGUMENT", name, err)
		}
		if _, err := e.client.CapturePayment(t.Context(), &dispatcherv1.CapturePaymentRequest{Name: name}); status.Code(err) != codes.InvalidArgument {
			t.Errorf("CapturePayment(%q) error = %v, want INVALID_ARGUMENT", name, err)
		}
	}
}

// Without a payment store the RPCs say so.
func TestPayments_unavailableWithoutAStore(t *testing.T) {
	c, _ := startOrders(t, true)
	_, err := c.CreatePayment(t.Context(), &dispatcherv1.CreatePaymentRequest{Parent: netAlice, Payment: &dispatcherv1.Payment{Payee: netBob, AmountMicros: 1, Currency: "USD"}})
	if status.Code(err) != codes.Unavailable {
		t.Errorf("CreatePayment(no store) error = %v, want UNAVAILABLE", err)
	}
}

// A retried CreatePayment with the same request_id returns the first
// payment; the same id for another payment is FAILED_PRECONDITION; another
// payer's id is its own; the sweep forgets ids a day old.
func TestPayments_requestID(t *testing.T) {
	e := startService(t)
	req := func(payer string, amount int64, id string) *dispatcherv1.CreatePaymentRequest {
		return &dispatcherv1.CreatePaymentRequest{Parent: payer, Payment: &dispatcherv1.Payment{Payee: netCarol, AmountMicros: amount, Currency: "USD"}, RequestId: id}
	}
	first, err := e.client.CreatePayment(t.Context(), req(netAlice, 5, "retry-1"))
	if err != nil {
		t.Fatal(err)
	}
	again, err := e.client.CreatePayment(t.Context(), req(netAlice, 5, "retry-1"))
	if err != nil || again.GetName() != first.GetName() {
		t.Errorf("CreatePayment(retry) = %v, %v; want %s again", again, err, first.GetName())
	}
	_, err = e.client.CreatePayment(t.Context(), req(netAlice, 6, "retry-1"))
	if status.Code(err) != codes.FailedPrecondition || grpcerr.Reason(err) != "REQUEST_ID_REUSED" {
		t.Errorf("CreatePayment(retry-1 for another amount) error = %v, want FAILED_PRECONDITION REQUEST_ID_REUSED", err)
	}
	bobs, err := e.client.CreatePayment(t.Context(), req(netBob, 5, "retry-1"))
	if err != nil || strings.TrimPrefix(bobs.GetName(), netBob) == strings.TrimPrefix(first.GetName(), netAlice) {
		t.Errorf("CreatePayment(bob's retry-1) = %v, %v; want a payment of bob's own", bobs, err)
	}
	e.clock.Advance(25 * time.Hour)
	if _, err := e.srv.Sweep(t.Context()); err != nil {
		t.Fatal(err)
	}
	later, err := e.client.CreatePayment(t.Context(), req(netAlice, 6, "retry-1"))
	if err != nil || later.GetName() == first.GetName() {
		t.Errorf("CreatePayment(retry-1 a day later) = %v, %v; want a new payment", later, err)
	}
}

// A payer at --payment-max-open open payments is refused another with
// RESOURCE_EXHAUSTED; other payers are not.
func TestPayments_openLimit(t *testing.T) {
	e := startServiceWith(t, Options{PaymentMaxOpen: 2})
	e.createPayment(netAlice, netBob, 1)
	e.createPayment(netAlice, netBob, 2)
	_, err := e.client.CreatePayment(t.Context(), &dispatcherv1.CreatePaymentRequest{
		Parent: netAlice, Payment: &dispatcherv1.Payment{Payee: netBob, AmountMicros: 3, Currency: "USD"},
	})
	if status.Code(err) != codes.ResourceExhausted || grpcerr.Reason(err) != "OPEN_PAYMENTS_LIMIT" {
		t.Errorf("CreatePayment(third open) error = %v, want RESOURCE_EXHAUSTED OPEN_PAYMENTS_LIMIT", err)
	}
	e.createPayment(netBob, netAlice, 1)
}

// The sweep removes a payment unchanged for --payment-retention that no
// acceptance reserved, which frees its place under --payment-max-open.
func TestPayments_retention(t *testing.T) {
	e := startServiceWith(t, Options{PaymentMaxOpen: 1, PaymentRetention: 48 * time.Hour})
	p := e.createPayment(netAlice, netBob, 1)
	_, err := e.client.CreatePayment(t.Context(), &dispatcherv1.CreatePaymentRequest{
		Parent: netAlice, Payment: &dispatcherv1.Payment{Payee: netBob, AmountMicros: 2, Currency: "USD"},
	})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("CreatePayment(second open) error = %v, want RESOURCE_EXHAUSTED", err)
	}
	e.clock.Advance(47 * time.Hour)
	if _, err := e.srv.Sweep(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.GetPayment(t.Context(), &dispatcherv1.GetPaymentRequest{Name: p.GetName()}); err != nil {
		t.Errorf("GetPayment(47h old) error = %v, want it kept", err)
	}
	e.clock.Advance(2 * time.Hour)
	if _, err := e.srv.Sweep(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.GetPayment(t.Context(), &dispatcherv1.GetPaymentRequest{Name: p.GetName()}); status.Code(err) != codes.NotFound {
		t.Errorf("GetPayment(49h old) error = %v, want NOT_FOUND", err)
	}
	e.createPayment(netAlice, netBob, 2)
}
