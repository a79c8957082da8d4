package sdk

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"strconv"
	"time"
)

// ApprovalTerms are what an owner's approval of an acceptance consents to:
// the order (OrderID), the amount in millionths of the currency's unit,
// the ISO 4217 currency and the payee (clients/{c}/agents/{a}).
type ApprovalTerms struct {
	Order        string `json:"order"`
	AmountMicros int64  `json:"amount_micros"`
	Currency     string `json:"currency"`
	Payee        string `json:"payee"`
}

// Approval is an owner's signed consent, the value of an accept_offer's
// human_authorization field. The dispatcher verifies it against the owner's
// approval_public_key in the registry.
type Approval struct {
	ApprovalTerms
	Expires   int64  `json:"expires"`   // Unix seconds; void from then on
	Signature string `json:"signature"` // Ed25519 over ApprovalSignedBytes, standard base64
}

// ApprovalSignedBytes returns the bytes an approval of t until expires
// signs: "parley-approval-v1", then order, amount_micros, currency, payee
// and expires (Unix seconds) as "name: value" lines, each ending in "\n".
func ApprovalSignedBytes(t ApprovalTerms, expires time.Time) []byte {
	return []byte("parley-approval-v1\n" +
		"order: " + t.Order + "\n" +
		"amount_micros: " + strconv.FormatInt(t.AmountMicros, 10) + "\n" +
		"currency: " + t.Currency + "\n" +
		"payee: " + t.Payee + "\n" +
		"expires: " + strconv.FormatInt(expires.Unix(), 10) + "\n")
}

// SignApproval returns an approval of t until expires signed with the
// owner's key.
func SignApproval(key ed25519.PrivateKey, t ApprovalTerms, expires time.Time) Approval {
	sig := ed25519.Sign(key, ApprovalSignedBytes(t, expires))
	return Approval{ApprovalTerms: t, Expires: expires.Unix(), Signature: base64.StdEncoding.EncodeToString(sig)}
}

// OrderID returns the id of the order that the pair (dialogue, supplier)
// forms: the server fixes it by the pair, so an approval can name it
// before the acceptance.
func OrderID(dialogue, supplier string) string {
	sum := sha256.Sum256([]byte("parley-order\x00" + dialogue + "\x00" + supplier))
	return hex.EncodeToString(sum[:16])
}
