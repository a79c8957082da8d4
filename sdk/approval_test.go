package sdk_test

import (
	"crypto/ed25519"
	"encoding/base64"
	"testing"
	"time"

	"github.com/parleyhq/parley/sdk"
)

// The dispatcher verifies these bytes (its approval and order packages pin
// the same values): a change here breaks every approval.
func TestApprovalSignedBytes(t *testing.T) {
	terms := sdk.ApprovalTerms{Order: "o1", AmountMicros: 12, Currency: "EUR", Payee: "clients/s/agents/p"}
	want := "parley-approval-v1\norder: o1\namount_micros: 12\ncurrency: EUR\npayee: clients/s/agents/p\nexpires: 1800000060\n"
	if got := string(sdk.ApprovalSignedBytes(terms, time.Unix(1_800_000_060, 0))); got != want {
		t.Errorf("ApprovalSignedBytes = %q, want %q", got, want)
	}
	if got, want := sdk.OrderID("d1", "clients/beta/agents/supplier"), "20fd56ddbc4510d72cd75219c035bdd3"; got != want {
		t.Errorf("OrderID = %q, want %q", got, want)
	}
}

func TestSignApproval(t *testing.T) {
	key := ed25519.NewKeyFromSeed(make([]byte, ed25519.SeedSize))
	terms := sdk.ApprovalTerms{Order: "o1", AmountMicros: 12, Currency: "EUR", Payee: "clients/s/agents/p"}
	exp := time.Unix(1_800_000_060, 0)
	a := sdk.SignApproval(key, terms, exp)
	sig, err := base64.StdEncoding.DecodeString(a.Signature)
	if err != nil || a.ApprovalTerms != terms || a.Expires != exp.Unix() || !ed25519.Verify(key.Public().(ed25519.PublicKey), sdk.ApprovalSignedBytes(terms, exp), sig) {
		t.Errorf("SignApproval = %+v (%v), want the terms, the expiry and a signature over them", a, err)
	}
}
