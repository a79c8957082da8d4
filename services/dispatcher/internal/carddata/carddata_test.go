package carddata

import "testing"

func TestFind(t *testing.T) {
	cases := []struct {
		name, body, want string // want: the JSON pointer found; "-" for none
	}{
		{"a card number string", `{"payment":{"number":"4111111111111111"}}`, "/payment/number"},
		{"grouped with spaces", `{"note":"card 4111 1111 1111 1111 exp 12/29"}`, "/note"},
		{"grouped with dashes", `["x","5500-0000-0000-0004"]`, "/1"},
		{"a JSON number", `{"pan":4111111111111111}`, "/pan"},
		{"13 digits", `{"n":"4222222222222"}`, "/n"},
		{"19 digits", `{"n":"6011000990139424006"}`, "-"}, // not Luhn-valid
		{"19 digits valid", `{"n":"4000000000000000006"}`, "/n"},
		{"a CVV field", `{"payment":{"ref":"ledger:1","cvv":"123"}}`, "/payment/cvv"},
		{"a CVC field in another case", `{"CVC2":"12"}`, "/CVC2"},
		{"a key with an escape", `{"c\u0076v":1}`, "/cvv"},
		{"a top-level string", `"4111111111111111"`, ""},
		{"Luhn-invalid", `{"n":"4111111111111112"}`, "-"},
		{"12 digits", `{"n":"411111111116"}`, "-"},
		{"20 digits", `{"n":"41111111111111111113"}`, "-"},
		{"a payment reference", `{"payment":{"reference":"ledger:7f3a","amount":12.5}}`, "-"},
		{"an order id of hex", `{"order":"4e6168c5b2a14d9e"}`, "-"},
		{"a digit run inside a hex id", `{"id":"ab4111111111111111cd"}`, "-"},
		{"a timestamp", `{"t":1764650000}`, "-"},
		{"no JSON object", `"hello"`, "-"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, found := Find([]byte(tc.body))
			if !found {
				got = "-"
			}
			if got != tc.want {
				t.Errorf("Find(%s) = %q, %v; want %q", tc.body, got, found, tc.want)
			}
		})
	}
}
