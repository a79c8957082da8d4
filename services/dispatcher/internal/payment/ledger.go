package payment

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/parleyhq/parley/platform/sweep"
	"github.com/parleyhq/parley/services/dispatcher/internal/fault"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

// LedgerName is the built-in provider's name in a payment reference.
const LedgerName = "ledger"

// Ledger is the built-in payment provider, for demos and tests: payments
// are entries in the dispatcher's store and no money moves. A payer
// creates a payment to a payee (its id is the reference), an acceptance
// reserves it for an order, and the payee captures it.
type Ledger struct {
	store  store.PaymentStore
	newID  func() string
	now    func() time.Time
	limits LedgerLimits
}

// LedgerLimits bound what the ledger keeps.
type LedgerLimits struct {
	// MaxOpen is the most open (authorized or reserved) payments a payer
	// may hold; 0 means no bound.
	MaxOpen int
	// Retention is how long a payment not reserved (captured, or
	// authorized and unused) is kept after its last change before
	// SweepPayments removes it, and the spend records of a UTC day after
	// it ended (Sweep); 0 keeps both forever.
	Retention time.Duration
}

// RequestRetention is how long a CreatePayment request_id is remembered.
const RequestRetention = 24 * time.Hour

// SweepBatch bounds the payments, and the request ids, that one sweep
// transaction removes, so that a backlog never makes one long write.
const SweepBatch = sweep.Batch

// NewLedger returns a Ledger keeping payments in st within limits, naming
// them with newID (unguessable ids) and stamping them with now.
func NewLedger(st store.PaymentStore, newID func() string, now func() time.Time, limits LedgerLimits) *Ledger {
	return &Ledger{store: st, newID: newID, now: now, limits: limits}
}

// Errors of the ledger's own operations.
var (
	// ErrNotReserved: a capture of a payment no acceptance reserved.
	ErrNotReserved = errors.New("no acceptance has reserved this payment")
	// ErrNotPayee: a capture by someone other than the payee.
	ErrNotPayee = errors.New("only the payee captures a payment")
	// ErrOpenLimit: a create by a payer holding the most open payments
	// allowed.
	ErrOpenLimit = errors.New("too many open payments")
	// ErrRequestReused: a create repeating a request_id of the payer's
	// for a different payment.
	ErrRequestReused = errors.New("request_id already used for a different payment")
)

// Create records a payment by payer to payee of price. With a requestID,
// a repeat by the same payer (within RequestRetention) returns the first
// payment as it stands, or ErrRequestReused when that one has another
// payee or price. A payer already holding the most open payments allowed
// is refused ErrOpenLimit; a repeat is not.
func (l *Ledger) Create(ctx context.Context, payer, payee string, price Price, requestID string) (store.Payment, error) {
	now := l.now().UTC()
	p := store.Payment{
		ID: l.newID(), Payer: payer, Payee: payee, AmountMicros: price.AmountMicros, Currency: price.Currency,
		State: store.PaymentAuthorized, CreateTime: now, UpdateTime: now,
	}
	var check func(int) error
	if l.limits.MaxOpen > 0 {
		check = func(open int) error {
			if open >= l.limits.MaxOpen {
				return fault.New(ErrOpenLimit, fmt.Sprintf("the payer already has %d open payments, the most allowed; capture or use them first", open))
			}
			return nil
		}
	}
	out, created, err := l.store.CreatePayment(ctx, p, requestID, check)
	switch {
	case err != nil:
		return store.Payment{}, err
	case !created && (out.Payee != payee || out.AmountMicros != price.AmountMicros || out.Currency != price.Currency):
		return store.Payment{}, fault.New(ErrRequestReused, fmt.Sprintf(
			"request_id %q already created payment %s of %d micro-%s to %s; use a new request_id for another payment",
			requestID, out.ID, out.AmountMicros, out.Currency, out.Payee))
	}
	return out, nil
}

// Sweep forgets the request_ids older than RequestRetention and removes
// the payments not reserved and unchanged for the limits' Retention (an
// authorized payment no acceptance used is then unknown to the ledger).
// It also removes the spend records (the Gate's, in the same store) of
// the UTC days that ended more than Retention ago, and never today's or
// yesterday's: only today's total is checked, and an acceptance counted
// just before midnight may be undone just after. It returns how many
// payments it removed.
func (l *Ledger) Sweep(ctx context.Context) (int, error) {
	now := l.now()
	_, err := sweep.InBatches(ctx, now.Add(-RequestRetention), l.store.SweepPaymentRequests)
	if l.limits.Retention <= 0 {
		return 0, err
	}
	n, perr := sweep.InBatches(ctx, now.Add(-l.limits.Retention), l.store.SweepPayments)
	_, serr := sweep.InBatches(ctx, spendCut(now, l.limits.Retention), l.store.SweepSpends)
	return n, errors.Join(err, perr, serr)
}

// spendCut is the time before which a UTC day must have ended for its
// spend records to be swept: retention ago, but no later than the start
// of yesterday (UTC), so that yesterday and today are always kept.
func spendCut(now time.Time, retention time.Duration) time.Time {
	yesterday := now.UTC().Truncate(24*time.Hour).AddDate(0, 0, -1)
	if cut := now.Add(-retention); cut.Before(yesterday) {
		return cut
	}
	return yesterday
}

// Capture moves a reserved payment to its payee; capturing a captured one
// returns it unchanged.
func (l *Ledger) Capture(ctx context.Context, id, payee string) (store.Payment, error) {
	return l.store.UpdatePayment(ctx, id, func(p *store.Payment) error {
		switch {
		case p.Payee != payee:
			return ErrNotPayee
		case p.State == store.PaymentCaptured:
			return nil
		case p.State != store.PaymentReserved:
			return ErrNotReserved
		}
		p.State, p.UpdateTime = store.PaymentCaptured, l.now().UTC()
		return nil
	})
}

// Reserve implements Provider.
func (l *Ledger) Reserve(ctx context.Context, ref string, c Charge) error {
	_, err := l.store.UpdatePayment(ctx, ref, func(p *store.Payment) error {
		switch {
		case p.Payer != c.Payer:
			return refuse(RulePaymentRef, "payment %s is not the consumer's", ref)
		case p.Payee != c.Payee || p.AmountMicros != c.AmountMicros || p.Currency != c.Currency:
			return refuse(RulePaymentRef, "payment %s is of %d micro-%s to %s, but the offer is of %d micro-%s to %s",
				ref, p.AmountMicros, p.Currency, p.Payee, c.AmountMicros, c.Currency, c.Payee)
		case p.Order == c.Order:
			return nil
		case p.State != store.PaymentAuthorized:
			return refuse(RulePaymentRef, "payment %s is already used for another order", ref)
		}
		p.State, p.Order, p.UpdateTime = store.PaymentReserved, c.Order, l.now().UTC()
		return nil
	})
	if errors.Is(err, store.ErrNotFound) {
		return refuse(RulePaymentRef, "payment %s is unknown to the ledger", ref)
	}
	return err
}

// Release implements Provider.
func (l *Ledger) Release(ctx context.Context, ref, order string) error {
	_, err := l.store.UpdatePayment(ctx, ref, func(p *store.Payment) error {
		if p.State != store.PaymentReserved || p.Order != order {
			return errNothing
		}
		p.State, p.Order, p.UpdateTime = store.PaymentAuthorized, "", l.now().UTC()
		return nil
	})
	if errors.Is(err, errNothing) || errors.Is(err, store.ErrNotFound) {
		return nil
	}
	return err
}

var errNothing = fmt.Errorf("nothing to release")
