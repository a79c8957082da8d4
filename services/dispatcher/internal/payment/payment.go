// Package payment enforces the money side of service transactions at
// acceptance: payments by reference only (the server refuses card data in
// any body, internal/carddata), the payment providers those references
// belong to, the owner's spending limits, and
// the owner's signed approval (internal/approval) when an acceptance needs
// one.
//
// An offer states its terms in its body (Terms): a price, and whether it
// needs payment and a person's approval. An acceptance carries a payment
// reference ({"provider": "ledger", "reference": ID}) and, when needed,
// an approval (human_authorization). Gate.Accept checks one acceptance
// against the offer it accepts and the consumer's owner, and counts it
// against the owner's daily spending; a refusal names the rule broken and
// changes nothing.
//
// Amounts are integers in millionths of the currency's unit
// (amount_micros). The owner's limits are in micro-USD, so an owner with
// limits may accept only USD prices.
package payment

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/parleyhq/parley/services/dispatcher/internal/approval"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

// Rule names why an acceptance was refused; stable UPPER_SNAKE. The
// approval rules are approval.Rule values.
type Rule string

// The rules Gate.Accept enforces.
const (
	RuleTerms           Rule = "OFFER_TERMS"       // the offer's terms are malformed
	RulePaymentMissing  Rule = "PAYMENT_MISSING"   // the offer needs payment and none came
	RulePaymentProvider Rule = "PAYMENT_PROVIDER"  // no such provider here
	RulePaymentRef      Rule = "PAYMENT_REFERENCE" // the reference does not pay these terms
	RuleSpendingLimit   Rule = "SPENDING_LIMIT"    // over the owner's hard limit
)

// Refusal is an acceptance refused.
type Refusal struct {
	Rule   Rule
	Detail string // one sentence for the sender
}

func (r *Refusal) Error() string { return r.Detail }

func refuse(rule Rule, format string, a ...any) error {
	return &Refusal{Rule: rule, Detail: fmt.Sprintf(format, a...)}
}

// Price is an amount of a currency.
type Price struct {
	AmountMicros int64  `json:"amount_micros"`
	Currency     string `json:"currency"`
}

// Terms are the money terms an offer states in its body.
type Terms struct {
	Price                      *Price `json:"price,omitempty"`
	PaymentRequired            bool   `json:"payment_required,omitempty"`
	HumanAuthorizationRequired bool   `json:"human_authorization_required,omitempty"`
}

var currencyPattern = regexp.MustCompile(`^[A-Z]{3}$`)

// ValidCurrency reports whether code is an ISO 4217 code: three uppercase
// letters. It is the one currency rule, for offers and the Payments API.
func ValidCurrency(code string) bool { return currencyPattern.MatchString(code) }

// ParseTerms reads the terms of an offer body. A body that states none
// (no price, no flags) has zero Terms; a malformed price is a Refusal.
func ParseTerms(body []byte) (Terms, bool, error) {
	var t Terms
	if json.Unmarshal(body, &t) != nil {
		return Terms{}, false, nil // not an object, or fields of other types: no terms
	}
	if t == (Terms{}) {
		return t, false, nil
	}
	if err := t.check(); err != nil {
		return Terms{}, false, err
	}
	return t, true, nil
}

func (t Terms) check() error {
	switch {
	case t.Price == nil && t.PaymentRequired:
		return refuse(RuleTerms, "an offer with payment_required must state a price")
	case t.Price == nil:
		return nil
	case t.Price.AmountMicros <= 0:
		return refuse(RuleTerms, "the offer's price.amount_micros must be above 0, not %d", t.Price.AmountMicros)
	case !ValidCurrency(t.Price.Currency):
		return refuse(RuleTerms, "the offer's price.currency %q must be an ISO 4217 code, three uppercase letters", t.Price.Currency)
	}
	return nil
}

// Reference names a payment at a provider; it is what an acceptance's
// payment field holds.
type Reference struct {
	Provider  string `json:"provider"`
	Reference string `json:"reference"`
}

// Charge is what an acceptance asks a payment to cover.
type Charge struct {
	Order        string
	Payer, Payee string
	Price
}

// Provider is a payment provider the network trusts to vouch for
// payment references.
type Provider interface {
	// Reserve checks that ref is a payment by c.Payer to c.Payee of
	// exactly c.Price, not used for another order, and holds it for
	// c.Order. Reserving it again for the same order is harmless. A
	// reference that does not pay c is a *Refusal (RulePaymentRef).
	Reserve(ctx context.Context, ref string, c Charge) error
	// Release undoes a Reserve of ref for order; releasing one not
	// reserved is no error.
	Release(ctx context.Context, ref, order string) error
}

// Owner is what a consumer's owner set in the registry.
type Owner struct {
	ApprovalKey ed25519.PublicKey // nil when none registered
	// TransactionLimit and DailyLimit are hard limits in micro-USD; 0
	// means none.
	TransactionLimit, DailyLimit int64
	// AutomatedPerTransaction and AutomatedPerDay, in micro-USD: above
	// them an acceptance needs the owner's approval. nil means no such
	// limit; 0 means every priced acceptance needs one.
	AutomatedPerTransaction, AutomatedPerDay *int64
}

func (o Owner) hasLimits() bool {
	return o.TransactionLimit > 0 || o.DailyLimit > 0 || o.AutomatedPerTransaction != nil || o.AutomatedPerDay != nil
}

// Acceptance is one acceptance of an offer, as the gate checks it.
type Acceptance struct {
	Order    string // the order it forms
	Consumer string // who accepts and pays
	Supplier string // the payee
	Terms    Terms  // the accepted offer's
	Body     []byte // the accept message's body
	Owner    Owner  // the consumer's owner
	Time     time.Time
}

// acceptBody is what an acceptance's body may carry.
type acceptBody struct {
	Payment            *Reference         `json:"payment"`
	HumanAuthorization *approval.Approval `json:"human_authorization"`
}

// parseAccept reads the fields of an acceptance's body one by one: a
// field of another shape (a boolean human_authorization, say) counts as
// absent.
func parseAccept(b []byte) acceptBody {
	var (
		fields map[string]json.RawMessage
		out    acceptBody
	)
	if json.Unmarshal(b, &fields) != nil {
		return out
	}
	if json.Unmarshal(fields["payment"], &out.Payment) != nil {
		out.Payment = nil
	}
	if json.Unmarshal(fields["human_authorization"], &out.HumanAuthorization) != nil {
		out.HumanAuthorization = nil
	}
	return out
}

// Gate checks acceptances.
type Gate struct {
	spends    store.PaymentStore
	providers map[string]Provider
}

// NewGate returns a Gate counting spending in st and trusting providers
// by name.
func NewGate(st store.PaymentStore, providers map[string]Provider) *Gate {
	return &Gate{spends: st, providers: providers}
}

// Accept checks a, in this order: the payment the terms require (present, at a known provider, paying exactly
// these terms); the owner's hard limits; the owner's approval when the
// offer asks for one or a passes an automated limit. It then counts a
// against the owner's day and reserves its payment. A refusal is a
// *Refusal or an *approval.Refusal, and changes nothing.
func (g *Gate) Accept(ctx context.Context, a Acceptance) error {
	body := parseAccept(a.Body)
	if a.Terms.Price == nil {
		if a.Terms.HumanAuthorizationRequired {
			return approval.Verify(a.Owner.ApprovalKey, body.HumanAuthorization, approval.Terms{Order: a.Order, Payee: a.Supplier}, a.Time)
		}
		return nil
	}
	price := *a.Terms.Price
	var provider Provider
	if a.Terms.PaymentRequired {
		if body.Payment == nil || body.Payment.Reference == "" {
			return refuse(RulePaymentMissing, "the offer requires payment: accept_offer must carry payment {provider, reference}")
		}
		if provider = g.providers[body.Payment.Provider]; provider == nil {
			return refuse(RulePaymentProvider, "payment provider %q is not one this network accepts", body.Payment.Provider)
		}
	}
	if a.Owner.hasLimits() && price.Currency != "USD" {
		return refuse(RuleSpendingLimit, "the consumer's owner sets spending limits in USD, so it cannot accept a price in %s", price.Currency)
	}
	if l := a.Owner.TransactionLimit; l > 0 && price.AmountMicros > l {
		return refuse(RuleSpendingLimit, "%d micro-USD is over the owner's transaction_limit_micro_usd of %d", price.AmountMicros, l)
	}
	terms := approval.Terms{Order: a.Order, AmountMicros: price.AmountMicros, Currency: price.Currency, Payee: a.Supplier}
	if a.Terms.HumanAuthorizationRequired || overAutomated(a.Owner.AutomatedPerTransaction, price.AmountMicros) {
		if err := approval.Verify(a.Owner.ApprovalKey, body.HumanAuthorization, terms, a.Time); err != nil {
			return err
		}
	}
	counted := a.Owner.hasLimits() // only an owner with limits has its days counted
	if counted {
		spend := store.Spend{Agent: a.Consumer, Day: a.Time.UTC().Format(time.DateOnly), Order: a.Order, AmountMicros: price.AmountMicros}
		err := g.spends.AddSpend(ctx, spend, func(day int64) error {
			after := day + spend.AmountMicros
			if l := a.Owner.DailyLimit; l > 0 && after > l {
				return refuse(RuleSpendingLimit, "%d micro-USD would bring today's spending to %d, over the owner's daily_limit_micro_usd of %d", price.AmountMicros, after, l)
			}
			if overAutomated(a.Owner.AutomatedPerDay, after) {
				return approval.Verify(a.Owner.ApprovalKey, body.HumanAuthorization, terms, a.Time)
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	if provider != nil {
		c := Charge{Order: a.Order, Payer: a.Consumer, Payee: a.Supplier, Price: price}
		if err := provider.Reserve(ctx, body.Payment.Reference, c); err != nil {
			if counted {
				if rerr := g.spends.RemoveSpend(ctx, a.Consumer, a.Order); rerr != nil {
					return errors.Join(err, rerr)
				}
			}
			return err
		}
	}
	return nil
}

// overAutomated reports whether amount passes an automated limit.
func overAutomated(limit *int64, amount int64) bool {
	return limit != nil && amount > *limit
}

// Undo takes back what Accept did for a, when the acceptance could not be
// delivered after all: its spend leaves the owner's day and its payment is
// released.
func (g *Gate) Undo(ctx context.Context, a Acceptance) error {
	var errs []error
	if a.Owner.hasLimits() {
		errs = append(errs, g.spends.RemoveSpend(ctx, a.Consumer, a.Order))
	}
	if body := parseAccept(a.Body); body.Payment != nil {
		if p := g.providers[body.Payment.Provider]; p != nil {
			errs = append(errs, p.Release(ctx, body.Payment.Reference, a.Order))
		}
	}
	return errors.Join(errs...)
}
