// Package carddata finds payment card data in a message body, so that only
// payment references pass through the network (issue 14; socontra.md
// section 11: the original let card numbers and CVVs through its broker).
//
// Card data is a primary account number, a run of 13 to 19 digits that
// passes the Luhn check (grouped by single spaces or dashes, or not, and
// not touching a letter or another digit, so hex ids are not mistaken for
// one), in any string or number of the body; or a member named like a card
// verification code (cvv, cvc, cvv2, card_security_code, ...).
package carddata

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
)

// verificationKeys are member names, lower-cased without _ and -, that
// hold a card verification code.
var verificationKeys = map[string]bool{
	"cvv": true, "cvc": true, "cvv2": true, "cvc2": true, "cvn": true, "securitycode": true,
	"cardsecuritycode": true, "cardverificationvalue": true, "cardverificationcode": true,
}

// Find reports whether body, one JSON value, holds card data, and where:
// the JSON pointer (RFC 6901) of the first value or member found. A body
// that is not JSON holds none (callers refuse it for that).
func Find(body []byte) (string, bool) {
	if !mayHold(body) {
		return "", false
	}
	return findDecoded(body)
}

// findDecoded is Find without the byte scan: it decodes body and walks
// every value (about 15 µs for a 200-byte body, where the scan takes well
// under one).
func findDecoded(body []byte) (string, bool) {
	d := json.NewDecoder(bytes.NewReader(body))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return "", false
	}
	return find(v, "")
}

func find(v any, at string) (string, bool) {
	switch x := v.(type) {
	case string:
		return at, HasCardNumber(x)
	case json.Number:
		return at, HasCardNumber(string(x))
	case []any:
		for i, e := range x {
			if p, ok := find(e, at+"/"+strconv.Itoa(i)); ok {
				return p, true
			}
		}
	case map[string]any:
		for k, e := range x {
			p := at + "/" + strings.ReplaceAll(strings.ReplaceAll(k, "~", "~0"), "/", "~1")
			norm := strings.NewReplacer("_", "", "-", "").Replace(strings.ToLower(k))
			if verificationKeys[norm] {
				return p, true
			}
			if p, ok := find(e, p); ok {
				return p, true
			}
		}
	}
	return "", false
}

// keyMarks are what every verification key holds once normalised (lower
// case, no _ or -): "cvv2" holds "cvv", "cardsecuritycode" holds
// "securitycode".
var keyMarks = [][]byte{[]byte("cvv"), []byte("cvc"), []byte("cvn"), []byte("securitycode"), []byte("cardverification")}

// mayHold reports whether body could hold card data by Find's rules,
// reading its bytes without decoding them: a sequence of 13 digits or more
// among spaces and dashes (where every card number lies), or a
// verification key's letters anywhere. It errs one way only: a body with a
// \u escape or a byte outside ASCII, which decoding or lower-casing could
// turn into digits or a key's letters, may hold some.
func mayHold(body []byte) bool {
	digits := 0
	norm := make([]byte, 0, len(body))
	for i, c := range body {
		switch {
		case c >= 0x80 || c == '\\' && i+1 < len(body) && body[i+1] == 'u':
			return true
		case isDigit(c):
			if digits++; digits >= 13 {
				return true
			}
			continue
		case c == ' ' || c == '-' || c == '_':
			// Inside a card number (space, dash) or dropped from a
			// key's name (dash, underscore); either way skipped. Only
			// ever more bodies go to the full decode for it.
			continue
		case c >= 'A' && c <= 'Z':
			c += 'a' - 'A'
		}
		digits = 0
		norm = append(norm, c)
	}
	for _, m := range keyMarks {
		if bytes.Contains(norm, m) {
			return true
		}
	}
	return false
}

// HasCardNumber reports whether s holds a Luhn-valid run of 13 to 19
// digits standing alone.
func HasCardNumber(s string) bool {
	for i := 0; i < len(s); i++ {
		if !isDigit(s[i]) || (i > 0 && isAlnum(s[i-1])) {
			continue
		}
		digits, end := run(s, i)
		if len(digits) >= 13 && len(digits) <= 19 && (end == len(s) || !isAlnum(s[end])) && luhn(digits) {
			return true
		}
		i = end
	}
	return false
}

// run reads the digits from s[i] on, allowing one space or dash between
// two digits, and returns them and the index after the last digit.
func run(s string, i int) ([]byte, int) {
	var digits []byte
	for i < len(s) {
		switch {
		case isDigit(s[i]):
			digits = append(digits, s[i])
			i++
		case (s[i] == ' ' || s[i] == '-') && i+1 < len(s) && isDigit(s[i+1]):
			i++
		default:
			return digits, i
		}
	}
	return digits, i
}

// luhn reports whether digits pass the Luhn check.
func luhn(digits []byte) bool {
	sum := 0
	for i := range digits {
		d := int(digits[len(digits)-1-i] - '0')
		if i%2 == 1 {
			d *= 2
			if d > 9 {
				d -= 9
			}
		}
		sum += d
	}
	return sum%10 == 0
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func isAlnum(c byte) bool { return isDigit(c) || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
