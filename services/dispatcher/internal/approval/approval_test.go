package approval_test

import (
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"testing"
	"time"

	"github.com/parleyhq/parley/services/dispatcher/internal/approval"
)

func seeded(b byte) (ed25519.PublicKey, ed25519.PrivateKey) {
	seed := make([]byte, ed25519.SeedSize)
	seed[0] = b
	priv := ed25519.NewKeyFromSeed(seed)
	return priv.Public().(ed25519.PublicKey), priv
}

func TestVerify(t *testing.T) {
	pub, priv := seeded(1)
	otherPub, otherPriv := seeded(2)
	now := time.Unix(1_800_000_000, 0)
	terms := approval.Terms{Order: "0123abcd", AmountMicros: 2_500_000, Currency: "USD", Payee: "clients/s/agents/shop"}
	later := now.Add(time.Minute)
	good := approval.Sign(priv, terms, later)

	other := terms
	other.AmountMicros = 2_400_000
	signedOther := approval.Sign(priv, other, later)
	tampered := good
	tampered.AmountMicros = 1
	badSig := good
	badSig.Signature = base64.StdEncoding.EncodeToString(make([]byte, ed25519.SignatureSize))
	shortSig := good
	shortSig.Signature = "AAAA"

	for _, c := range []struct {
		name string
		key  ed25519.PublicKey
		a    *approval.Approval
		want approval.Rule // "" accepts
	}{
		{"signed by the owner over these terms", pub, &good, ""},
		{"no approval", pub, nil, approval.RuleMissing},
		{"owner registered no key", nil, &good, approval.RuleNoKey},
		{"signed by another key", otherPub, &good, approval.RuleSignature},
		{"another key's signature", pub, ptr(approval.Sign(otherPriv, terms, later)), approval.RuleSignature},
		{"signed over other terms", pub, &signedOther, approval.RuleTerms},
		{"terms edited after signing", pub, &tampered, approval.RuleTerms},
		{"zero signature", pub, &badSig, approval.RuleSignature},
		{"signature too short", pub, &shortSig, approval.RuleSignature},
		{"expiring now", pub, ptr(approval.Sign(priv, terms, now)), approval.RuleExpired},
		{"expired", pub, ptr(approval.Sign(priv, terms, now.Add(-time.Second))), approval.RuleExpired},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := approval.Verify(c.key, c.a, terms, now)
			if c.want == "" {
				if err != nil {
					t.Fatalf("Verify = %v, want nil", err)
				}
				return
			}
			var r *approval.Refusal
			if !errors.As(err, &r) || r.Rule != c.want {
				t.Fatalf("Verify = %v, want rule %s", err, c.want)
			}
		})
	}
}

// TestSignedBytes pins the signed payload: clients in other languages sign
// these bytes, so changing them breaks every approval in flight.
func TestSignedBytes(t *testing.T) {
	terms := approval.Terms{Order: "o1", AmountMicros: 12, Currency: "EUR", Payee: "clients/s/agents/p"}
	want := "parley-approval-v1\norder: o1\namount_micros: 12\ncurrency: EUR\npayee: clients/s/agents/p\nexpires: 1800000060\n"
	if got := string(approval.SignedBytes(terms, time.Unix(1_800_000_060, 0))); got != want {
		t.Errorf("SignedBytes = %q, want %q", got, want)
	}
}

func ptr[T any](v T) *T { return &v }
