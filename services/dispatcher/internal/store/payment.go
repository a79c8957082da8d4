package store

import (
	"context"
	"encoding/json"
	"time"
)

// PaymentState is where a ledger payment stands.
type PaymentState string

// The states of a ledger payment.
const (
	PaymentAuthorized PaymentState = "authorized" // created by its payer
	PaymentReserved   PaymentState = "reserved"   // an acceptance used it for an order
	PaymentCaptured   PaymentState = "captured"   // its payee took it
)

// Payment is one payment of the built-in ledger provider.
type Payment struct {
	ID           string       `json:"id"`
	Payer        string       `json:"payer"`
	Payee        string       `json:"payee"`
	AmountMicros int64        `json:"amountMicros"`
	Currency     string       `json:"currency"`
	State        PaymentState `json:"state"`
	Order        string       `json:"order,omitempty"` // set when reserved
	CreateTime   time.Time    `json:"createTime"`
	UpdateTime   time.Time    `json:"updateTime"`
}

// Spend is one acceptance counted against its agent's daily spending.
type Spend struct {
	Agent        string
	Day          string // the UTC day, YYYY-MM-DD
	Order        string
	AmountMicros int64 // micro-USD
}

// PaymentStore keeps the ledger provider's payments, the agents' daily
// spending, and the terms of the offers pairs are answering. Every method
// checks ctx first.
type PaymentStore interface {
	// CreatePayment stores a new payment p in one transaction and returns
	// it with created true; ErrAlreadyExists when its id is taken.
	//
	// requestID, when not empty, is p.Payer's AIP-155 key: if that payer
	// already created a payment with it (and SweepPaymentRequests has not
	// forgotten it), CreatePayment stores nothing and returns that payment
	// as it stands, with created false. Otherwise the id is recorded with
	// p, at p.CreateTime, in the same transaction.
	//
	// check, when not nil, sees how many of p.Payer's payments are open
	// (not captured) before p, and may refuse p: its error is returned as
	// is and nothing is written. A repeat does not call it.
	CreatePayment(ctx context.Context, p Payment, requestID string, check func(open int) error) (_ Payment, created bool, _ error)
	// SweepPayments removes at most limit of the payments last changed
	// (UpdateTime) before t, except reserved ones, the oldest first, in
	// one transaction, and returns how many it removed: fewer than limit
	// when no more are due, or (PostgreSQL) when the others due are being
	// changed at that moment. It reads only what it removes.
	SweepPayments(ctx context.Context, before time.Time, limit int) (int, error)
	// SweepPaymentRequests forgets at most limit of the request ids
	// recorded before t, the oldest first, in one transaction, and
	// returns how many it forgot: fewer than limit when no more are due
	// (or being changed, as above). It reads only what it forgets.
	SweepPaymentRequests(ctx context.Context, before time.Time, limit int) (int, error)
	// GetPayment returns a payment; ErrNotFound when absent.
	GetPayment(ctx context.Context, id string) (Payment, error)
	// UpdatePayment applies mutate to a payment in one transaction and
	// returns it as written. If mutate fails, nothing is written and its
	// error is returned as is. ErrNotFound when absent.
	UpdatePayment(ctx context.Context, id string, mutate func(*Payment) error) (Payment, error)
	// AddSpend adds s to its agent's spending of s.Day, in one transaction
	// with check, which sees the day's total before s and may refuse it
	// (its error is returned as is and nothing is written). An order
	// already counted is not counted again (check is not called).
	AddSpend(ctx context.Context, s Spend, check func(dayTotal int64) error) error
	// RemoveSpend takes an order's spend back out of its day; removing
	// one never added is no error.
	RemoveSpend(ctx context.Context, agent, order string) error
	// SweepSpends removes at most limit of the spend records of UTC days
	// that ended by t (days before t's UTC day), the oldest day first, in
	// one transaction, and returns how many it removed: fewer than limit
	// when no more are due (or being changed, as above). An order removed
	// is no longer counted (AddSpend counts it anew, RemoveSpend finds
	// nothing), and its day's total loses it. It reads only what it
	// removes.
	SweepSpends(ctx context.Context, before time.Time, limit int) (int, error)
	// SetOfferTerms records terms as those of the message id (an offer, a
	// payment_error) of the pair (dialogue, supplier), before the message
	// is delivered; setting them again replaces them. ErrNotFound, and
	// nothing is recorded, when dialogue is not stored (never, or swept):
	// the check and the write are one transaction that a concurrent
	// SweepDialogues is ordered with, so every record belongs to a stored
	// dialogue and goes with its sweep, whatever becomes of its message
	// (RemoveOfferTerms may never come: a crash, a failed undo).
	SetOfferTerms(ctx context.Context, dialogue, supplier, id string, terms json.RawMessage) error
	// RemoveOfferTerms removes the terms recorded for message id of the
	// pair, and no other's: its message was not delivered. Removing terms
	// never recorded is no error.
	RemoveOfferTerms(ctx context.Context, dialogue, supplier, id string) error
	// OfferTerms returns the terms recorded for message id of the pair
	// exactly; nil when it has none. There is no fallback to other
	// messages' terms: terms are recorded before their message is
	// delivered, so the pair's latest may be those of a message refused
	// (whose removal may never come). The terms of a message's chain are
	// the caller's to find. Id "" holds a pair's terms recorded before
	// terms were kept per message (the pair's last, then).
	OfferTerms(ctx context.Context, dialogue, supplier, id string) (json.RawMessage, error)
}
