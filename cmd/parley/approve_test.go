package main

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/parleyhq/parley/sdk"
)

// keygen writes a key pair; approve signs with the file, and the signature
// verifies with the public key over the sdk's signed bytes (the bytes the
// dispatcher checks); the order id comes from the dialogue and payee.
func TestKeygenAndApprove(t *testing.T) {
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "owner.key")
	var out bytes.Buffer
	if err := run([]string{"keygen", keyFile}, noEnv, &out, io.Discard); err != nil {
		t.Fatalf("parley keygen: %v", err)
	}
	pub, err := base64.StdEncoding.DecodeString(strings.TrimSpace(out.String()))
	if err != nil || len(pub) != ed25519.PublicKeySize {
		t.Fatalf("parley keygen printed %q, want a base64 public key", out.String())
	}
	if st, err := os.Stat(keyFile); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("the private key file: %v, %v; want mode 0600", st, err)
	}
	if err := run([]string{"keygen", keyFile}, noEnv, io.Discard, io.Discard); err == nil {
		t.Error("parley keygen over an existing file succeeded; it must not overwrite a key")
	}

	out.Reset()
	before := time.Now()
	err = run([]string{"approve", "--key", keyFile, "--dialogue", "d1", "--payee", "beta:supplier", "--amount-micros", "2500000", "--expires", "5m"}, noEnv, &out, io.Discard)
	if err != nil {
		t.Fatalf("parley approve: %v", err)
	}
	var a sdk.Approval
	if err := json.Unmarshal(out.Bytes(), &a); err != nil {
		t.Fatalf("parley approve printed %q: %v", out.String(), err)
	}
	want := sdk.ApprovalTerms{Order: sdk.OrderID("d1", "clients/beta/agents/supplier"), AmountMicros: 2_500_000, Currency: "USD", Payee: "clients/beta/agents/supplier"}
	sig, _ := base64.StdEncoding.DecodeString(a.Signature)
	if a.ApprovalTerms != want || a.Expires < before.Add(5*time.Minute).Unix() ||
		!ed25519.Verify(pub, sdk.ApprovalSignedBytes(a.ApprovalTerms, time.Unix(a.Expires, 0)), sig) {
		t.Errorf("parley approve = %+v; want %+v, expiring in 5m, signed by the key", a, want)
	}

	for _, bad := range [][]string{
		{"approve", "--dialogue", "d1", "--payee", "beta:supplier", "--amount-micros", "1"},                                      // no key
		{"approve", "--key", keyFile, "--payee", "beta:supplier", "--amount-micros", "1"},                                        // no order
		{"approve", "--key", keyFile, "--dialogue", "d1", "--order", "o1", "--payee", "beta:supplier", "--amount-micros", "1"},   // both
		{"approve", "--key", keyFile, "--dialogue", "d1", "--payee", "beta:supplier"},                                            // no amount
		{"approve", "--key", keyFile, "--dialogue", "d1", "--payee", "supplier", "--amount-micros", "1"},                         // bad payee
		{"approve", "--key", keyFile + ".pub", "--dialogue", "d1", "--payee", "beta:supplier", "--amount-micros", "1"},           // not a private key
		{"approve", "--key", keyFile, "--dialogue", "d1", "--payee", "beta:supplier", "--amount-micros", "1", "--currency", "$"}, // bad currency
	} {
		if err := run(bad, noEnv, io.Discard, io.Discard); err == nil {
			t.Errorf("parley %q succeeded, want an error", bad)
		}
	}
}

// agent owner sets the approval key and limits and keeps the rest.
func TestAgentOwner(t *testing.T) {
	s := startCLISuite(t)
	must := s.must(t)
	must(s.operator, "client", "create", "acme")
	must(s.operator, "agent", "create", "acme:buyer")
	keyFile := filepath.Join(t.TempDir(), "owner.key")
	pub := must("", "keygen", keyFile)
	must(s.operator, "agent", "owner", "acme:buyer", "--daily-limit", "9000000")
	must(s.operator, "agent", "owner", "acme:buyer", "--approval-key", keyFile+".pub", "--automated-limit-per-transaction", "0")
	var a struct {
		Owner struct {
			ApprovalPublicKey string  `json:"approvalPublicKey"`
			DailyLimit        string  `json:"dailyLimitMicroUsd"`
			AutomatedPerTx    *string `json:"automatedLimitPerTransactionMicroUsd"`
		} `json:"owner"`
	}
	if err := json.Unmarshal([]byte(must(s.operator, "agent", "get", "acme:buyer")), &a); err != nil {
		t.Fatal(err)
	}
	if a.Owner.ApprovalPublicKey != pub || a.Owner.DailyLimit != "9000000" || a.Owner.AutomatedPerTx == nil || *a.Owner.AutomatedPerTx != "0" {
		t.Errorf("owner after parley agent owner = %+v; want the key, the daily limit kept and a per-transaction automated limit of 0", a.Owner)
	}
	if _, err := s.call(s.operator, "agent", "owner", "acme:buyer", "--approval-key", "bm90IGEga2V5"); err == nil {
		t.Error("parley agent owner --approval-key (not 32 bytes) succeeded")
	}
}
