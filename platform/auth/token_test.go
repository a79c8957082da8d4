package auth

import (
	"strings"
	"testing"
)

func TestNewKey_parsesBackAndHashes(t *testing.T) {
	for _, kind := range []Kind{Agent, Client} {
		secret, id, hash, err := NewKey(kind)
		if err != nil {
			t.Fatalf("NewKey(%v): %v", kind, err)
		}
		gotKind, gotID, ok := ParseKey(secret)
		if !ok || gotKind != kind || gotID != id {
			t.Errorf("ParseKey(NewKey(%v)) = %v, %q, %v; want %v, %q, true", kind, gotKind, gotID, ok, kind, id)
		}
		if !SameHash(hash, HashSecret(secret)) {
			t.Errorf("NewKey(%v) hash differs from HashSecret(secret)", kind)
		}
		if other, _, _, _ := NewKey(kind); other == secret {
			t.Errorf("NewKey(%v) returned the same secret twice", kind)
		}
	}
	if _, _, _, err := NewKey(Operator); err == nil {
		t.Errorf("NewKey(Operator) succeeded, want an error")
	}
}

func TestParseKey_rejectsMalformed(t *testing.T) {
	good, _, _, _ := NewKey(Agent)
	tests := map[string]string{
		"empty":        "",
		"wrong prefix": "parley_xk_" + good[len(AgentKeyPrefix):],
		"operator":     "parley_op_" + strings.Repeat("a", 43),
		"short":        good[:len(good)-1],
		"long":         good + "a",
		"upper id":     AgentKeyPrefix + "ABCDEF0123456789" + good[len(AgentKeyPrefix)+16:],
		"bad sep":      good[:len(AgentKeyPrefix)+16] + "-" + good[len(AgentKeyPrefix)+17:],
		"bad base64":   good[:len(good)-1] + "!",
	}
	for name, in := range tests {
		t.Run(name, func(t *testing.T) {
			if _, _, ok := ParseKey(in); ok {
				t.Errorf("ParseKey(%q) ok, want refused", in)
			}
		})
	}
}

func TestNewOperatorToken_shape(t *testing.T) {
	tok, err := NewOperatorToken()
	if err != nil {
		t.Fatal(err)
	}
	if !validOperatorToken(tok) {
		t.Errorf("validOperatorToken(%q) = false", tok)
	}
}
