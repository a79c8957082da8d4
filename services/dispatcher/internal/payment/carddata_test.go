package payment_test

import (
	"errors"
	"testing"

	"github.com/parleyhq/parley/services/dispatcher/internal/payment"
)

func TestCheckCardData(t *testing.T) {
	for _, c := range []struct {
		name, body string
		refused    bool
	}{
		{"a ledger reference", `{"payment":{"provider":"ledger","reference":"9f3c0a7d1e2b4c5d6e7f8091a2b3c4d5"}}`, false},
		{"no payment field", `{"offer":{"number":"4111111111111111"}}`, false},
		{"not an object", `[1,2]`, false},
		{"a card number", `{"payment":{"reference":"4111111111111111"}}`, true},
		{"a card number with spaces", `{"payment":{"card":"4111 1111 1111 1111"}}`, true},
		{"a card number with dashes, nested", `{"payment":{"x":[{"y":"pan 5500-0000-0000-0004 exp"}]}}`, true},
		{"a card number as a JSON number", `{"payment":{"n":4111111111111111}}`, true},
		{"a CVV field", `{"payment":{"reference":"r1","cvv":"123"}}`, true},
		{"a CVC field, any case", `{"payment":{"reference":"r1","Card_CVC":"1234"}}`, true},
		{"a payment that is the number itself", `{"payment":"378282246310005"}`, true},
		{"a digit run failing Luhn", `{"payment":{"reference":"4111111111111112"}}`, false},
		{"a 12-digit run", `{"payment":{"reference":"411111111111"}}`, false},
		{"a 20-digit run", `{"payment":{"reference":"41111111111111111110"}}`, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := payment.CheckCardData([]byte(c.body))
			var r *payment.Refusal
			if got := errors.As(err, &r) && r.Rule == payment.RuleCardData; got != c.refused {
				t.Errorf("CheckCardData(%s) = %v, refused %v, want %v", c.body, err, got, c.refused)
			}
		})
	}
}
