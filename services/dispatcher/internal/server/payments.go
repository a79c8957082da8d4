package server

import (
	"context"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/platform/resource"
	"github.com/parleyhq/parley/services/dispatcher/internal/directory"
	"github.com/parleyhq/parley/services/dispatcher/internal/payment"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

var paymentStates = map[store.PaymentState]dispatcherv1.PaymentState{
	store.PaymentAuthorized: dispatcherv1.PaymentState_PAYMENT_STATE_AUTHORIZED,
	store.PaymentReserved:   dispatcherv1.PaymentState_PAYMENT_STATE_RESERVED,
	store.PaymentCaptured:   dispatcherv1.PaymentState_PAYMENT_STATE_CAPTURED,
}

// cutPayment splits clients/{c}/agents/{a}/payments/{id}.
func cutPayment(name string) (agent, id string, ok bool) {
	agent, id, ok = strings.Cut(name, "/payments/")
	return agent, id, ok && directory.ValidAgentName(agent) && validMessageID(id)
}

// beginPayments starts a payment call once its request is valid; its
// context carries the dialogue calls' time limit.
func (s *Server) beginPayments(ctx context.Context, v grpcerr.Violations) (context.Context, context.CancelFunc, error) {
	if err := v.Err("INVALID_ARGUMENT", Domain); err != nil {
		return nil, nil, err
	}
	if s.ledger == nil {
		return nil, nil, status.Error(codes.Unavailable, "payments are not available on this server: it has no payment store")
	}
	ctx, cancel := context.WithTimeout(ctx, s.opts.MessageTimeout)
	return ctx, cancel, nil
}

// partyPayment reads the payment a name clients/{c}/agents/{a}/payments/{id}
// names, as its agent sees it: an agent that is neither payer nor payee
// gets NOT_FOUND, as for a payment that does not exist. The caller
// cancels the returned context.
func (s *Server) partyPayment(ctx context.Context, name string) (context.Context, context.CancelFunc, string, store.Payment, error) {
	var v grpcerr.Violations
	agent, id, ok := cutPayment(name)
	if !ok {
		v.Add("name", "must be clients/{client}/agents/{agent}/payments/{payment}")
	}
	ctx, cancel, err := s.beginPayments(ctx, v)
	if err != nil {
		return nil, func() {}, "", store.Payment{}, err
	}
	p, err := s.opts.Payments.GetPayment(ctx, id)
	if err == nil && p.Payer != agent && p.Payee != agent {
		err = resource.NotFound("payment", name)
	}
	if err != nil {
		return ctx, cancel, "", store.Payment{}, s.toStatus(ctx, err)
	}
	return ctx, cancel, agent, p, nil
}

// CreatePayment implements DispatcherService. The policy admits only the
// payer named in parent (or the operator).
func (s *Server) CreatePayment(ctx context.Context, req *dispatcherv1.CreatePaymentRequest) (*dispatcherv1.Payment, error) {
	var v grpcerr.Violations
	payer, p := req.GetParent(), req.GetPayment()
	if !directory.ValidAgentName(payer) {
		v.Add("parent", "must be clients/{client}/agents/{agent}")
	}
	switch {
	case p == nil:
		v.Add("payment", "is required")
	case !directory.ValidAgentName(p.GetPayee()):
		v.Add("payment.payee", "must be clients/{client}/agents/{agent}")
	case p.GetPayee() == payer:
		v.Add("payment.payee", "must not be the payer")
	}
	if p != nil && p.GetAmountMicros() <= 0 {
		v.Add("payment.amount_micros", "must be above 0")
	}
	if p != nil && !payment.ValidCurrency(p.GetCurrency()) {
		v.Add("payment.currency", "must be an ISO 4217 code, three uppercase letters")
	}
	if id := req.GetRequestId(); id != "" && !validMessageID(id) {
		v.Add("request_id", "must be letters, digits, - and _, at most 64")
	}
	ctx, cancel, err := s.beginPayments(ctx, v)
	if err != nil {
		return nil, err
	}
	defer cancel()
	out, err := s.ledger.Create(ctx, payer, p.GetPayee(), payment.Price{AmountMicros: p.GetAmountMicros(), Currency: p.GetCurrency()}, req.GetRequestId())
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return paymentProto(payer, out), nil
}

// GetPayment implements DispatcherService.
func (s *Server) GetPayment(ctx context.Context, req *dispatcherv1.GetPaymentRequest) (*dispatcherv1.Payment, error) {
	_, cancel, agent, p, err := s.partyPayment(ctx, req.GetName())
	defer cancel()
	if err != nil {
		return nil, err
	}
	return paymentProto(agent, p), nil
}

// CapturePayment implements DispatcherService.
func (s *Server) CapturePayment(ctx context.Context, req *dispatcherv1.CapturePaymentRequest) (*dispatcherv1.Payment, error) {
	ctx, cancel, agent, p, err := s.partyPayment(ctx, req.GetName())
	defer cancel()
	if err != nil {
		return nil, err
	}
	p, err = s.ledger.Capture(ctx, p.ID, agent)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return paymentProto(agent, p), nil
}

func paymentProto(agent string, p store.Payment) *dispatcherv1.Payment {
	return &dispatcherv1.Payment{
		Name: agent + "/payments/" + p.ID, Payer: p.Payer, Payee: p.Payee, AmountMicros: p.AmountMicros, Currency: p.Currency,
		State: paymentStates[p.State], Order: p.Order, CreateTime: timestamppb.New(p.CreateTime), UpdateTime: timestamppb.New(p.UpdateTime),
	}
}
