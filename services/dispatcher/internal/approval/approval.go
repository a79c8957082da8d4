// Package approval checks the signed human approvals that service
// transactions need: an agent's owner registers an Ed25519 public key in
// the registry (Owner.approval_public_key), and an acceptance that needs a
// person's consent (the offer asks for it, or it passes an automated
// spending limit) carries an Approval signed with the owner's private key
// over the order's id, amount, currency and payee, and an expiry. A
// boolean claim is not enough: the server verifies the signature.
//
// The signed bytes (SignedBytes) are a fixed text form, so that any client
// can produce them:
//
//	parley-approval-v1
//	order: <order id>
//	amount_micros: <integer>
//	currency: <ISO 4217 code>
//	payee: clients/<client>/agents/<agent>
//	expires: <Unix seconds>
//
// each line ending in "\n". In a message body an approval is the JSON
// object Approval (field human_authorization of accept_offer), its
// signature standard base64 with padding.
package approval

import (
	"crypto/ed25519"
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Terms are what an approval consents to.
type Terms struct {
	Order        string `json:"order"`
	AmountMicros int64  `json:"amount_micros"` // millionths of the currency's unit
	Currency     string `json:"currency"`
	Payee        string `json:"payee"`
}

// Approval is a signed consent to Terms until Expires.
type Approval struct {
	Terms
	Expires   int64  `json:"expires"`   // Unix seconds; the approval is void from then on
	Signature string `json:"signature"` // Ed25519 over SignedBytes, standard base64
}

// Rule names why an approval was refused; stable UPPER_SNAKE.
type Rule string

// The rules Verify enforces, in the order it checks them.
const (
	RuleNoKey     Rule = "APPROVAL_KEY_MISSING" // the owner registered no key
	RuleMissing   Rule = "APPROVAL_MISSING"     // the acceptance carries no approval
	RuleTerms     Rule = "APPROVAL_TERMS"       // it consents to other terms
	RuleSignature Rule = "APPROVAL_SIGNATURE"   // not signed by the owner's key over them
	RuleExpired   Rule = "APPROVAL_EXPIRED"     // its expiry has passed
)

// Refusal is an approval Verify refused.
type Refusal struct {
	Rule   Rule
	Detail string // one sentence for the sender
}

func (r *Refusal) Error() string { return r.Detail }

// SignedBytes returns the bytes an approval of t until expires signs.
func SignedBytes(t Terms, expires time.Time) []byte {
	var b strings.Builder
	b.WriteString("parley-approval-v1\n")
	b.WriteString("order: " + t.Order + "\n")
	b.WriteString("amount_micros: " + strconv.FormatInt(t.AmountMicros, 10) + "\n")
	b.WriteString("currency: " + t.Currency + "\n")
	b.WriteString("payee: " + t.Payee + "\n")
	b.WriteString("expires: " + strconv.FormatInt(expires.Unix(), 10) + "\n")
	return []byte(b.String())
}

// Sign returns an approval of t until expires, signed with key.
func Sign(key ed25519.PrivateKey, t Terms, expires time.Time) Approval {
	sig := ed25519.Sign(key, SignedBytes(t, expires))
	return Approval{Terms: t, Expires: expires.Unix(), Signature: base64.StdEncoding.EncodeToString(sig)}
}

// Verify checks that a is an approval of want, signed with key and not
// expired at now. It returns a *Refusal naming the first rule broken.
func Verify(key ed25519.PublicKey, a *Approval, want Terms, now time.Time) error {
	switch {
	case len(key) != ed25519.PublicKeySize:
		return &Refusal{RuleNoKey, "this acceptance needs the owner's signed approval, and the consumer's owner has registered no approval key"}
	case a == nil:
		return &Refusal{RuleMissing, fmt.Sprintf("this acceptance needs the owner's signed approval (human_authorization) of order %s: %s", want.Order, describe(want))}
	case a.Terms != want:
		return &Refusal{RuleTerms, fmt.Sprintf("the approval is of %s, but this acceptance is of %s", describe(a.Terms), describe(want))}
	}
	sig, err := base64.StdEncoding.DecodeString(a.Signature)
	if err != nil || !ed25519.Verify(key, SignedBytes(a.Terms, time.Unix(a.Expires, 0)), sig) {
		return &Refusal{RuleSignature, "the approval's signature is not the owner's over these terms and expiry"}
	}
	if exp := time.Unix(a.Expires, 0); !now.Before(exp) {
		return &Refusal{RuleExpired, fmt.Sprintf("the approval expired at %s", exp.UTC().Format(time.RFC3339))}
	}
	return nil
}

func describe(t Terms) string {
	return fmt.Sprintf("order %s, %d micro-%s to %s", t.Order, t.AmountMicros, t.Currency, t.Payee)
}
