package server

import (
	"testing"

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
