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
		// A map keeps a repeated member's last value only, but the body
		// is delivered as sent: a reader keeping the first sees the card.
		{"a card number under a repeated key", `{"n":"4111111111111111","n":"x"}`, "/n"},
		{"a CVV under a repeated key", `{"p":{"cvv":"123"},"p":{}}`, "/p/cvv"},
		{"the first of several, in body order", `{"b":"4111111111111111","a":{"cvv":1}}`, "/b"},
		// A reader sees the number, however it is written.
		{"a number with an exponent", `{"pan":4.111111111111111e15}`, "/pan"},
		{"a number with a fraction and an exponent", `{"pan":4111.111111111111E+12}`, "/pan"},
		{"a number with a negative exponent", `[-41111111111111110e-1]`, "/0"},
		{"a number with trailing zeros in its fraction", `{"pan":4111111111111111.000}`, "/pan"},
		{"a short mantissa with an exponent", `{"pan":400000000002e4}`, "/pan"}, // 4000000000020000
		{"a short mantissa, Luhn-invalid", `{"pan":400000000001e4}`, "-"},
		{"a fraction", `{"x":4111.111111111111}`, "-"},
		{"a small number with an exponent", `{"x":1.5e3}`, "-"},
		{"a huge exponent", `{"x":1e999999999999999999999}`, "-"},
		{"a hex id with a digit then e", `{"id":"4e6168c5b2a14d9e"}`, "-"},
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

// FuzzFind_scanAgreesWithDecoding: the byte scan in front of the decode
// never changes Find's answer (`go test -fuzz FuzzFind_scanAgreesWithDecoding`
// explores; a plain test run checks the seeds).
func FuzzFind_scanAgreesWithDecoding(f *testing.F) {
	for _, s := range []string{
		`{"payment":{"number":"4111111111111111"}}`, `{"note":"card 4111 1111 1111 1111 exp 12/29"}`,
		`["x","5500-0000-0000-0004"]`, `{"pan":4111111111111111}`, `{"payment":{"cvv":"123"}}`,
		`{"CVC2":"12"}`, `{"c\u0076v":1}`, `{"Card_Security-Code":1}`, `{"n":"4\u0031111111111111111"}`,
		`{"n":"4111_1111_1111_1111"}`, `{"securİtycode":1}`, `{"a":"ok","b":[1,2,3],"c":{"d":null}}`,
		`{"t":1764650000}`, `{"id":"ab4111111111111111cd"}`, `"4111111111111111"`, `{"x":"c v v"}`,
		`{"pan":4.111111111111111e15}`, `[400000000002e4]`, `{"a":"x\"1e5","b":2E-3}`, `{"n":"4111111111111111","n":"x"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		gotAt, got := Find(body)
		wantAt, want := findDecoded(body)
		if got != want || gotAt != wantAt {
			t.Errorf("Find(%q) = %q, %v; decoding alone finds %q, %v", body, gotAt, got, wantAt, want)
		}
	})
}

func TestFind_scanSkipsDecodingOnlyWhenNothingCanMatch(t *testing.T) {
	for body, want := range map[string]bool{
		`{"type":"new_message","text":"see you at 10:30 on 2026-12-02","n":42}`: false,
		`{"ref":"ledger:7f3a","amount_micros":1250000}`:                         false,
		`{"n":"4111 1111 1111 1111"}`:                                           true,
		`{"n":"1234567890123"}`:                                                 true, // 13 digits: decoded, Luhn decides
		`{"CVV":1}`:                                                             true,
		`{"x":"\u0031"}`:                                                        true,
		`{"pan":41111.1111111e11}`:                                              true, // an exponent: decoded
		`{"id":"4e6168c5b2a14d9e","v":"1e5"}`:                                   false,
		`{"x":"é"}`:                                                             true,
	} {
		if got := mayHold([]byte(body)); got != want {
			t.Errorf("mayHold(%s) = %v, want %v", body, got, want)
		}
	}
}

// BenchmarkFind: a typical message body, with the byte scan and decoded.
func BenchmarkFind(b *testing.B) {
	body := []byte(`{"text":"Could you book two rooms in Lisbon from the 3rd to the 7th? Budget 180 EUR a night.","ref":"job-2026-12-02-0042","priority":2,"tags":["travel","hotel"]}`)
	b.Run("scan", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			Find(body)
		}
	})
	b.Run("decode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			findDecoded(body)
		}
	})
}
