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
// the JSON pointer (RFC 6901) of the first value or member found, in body
// order. Of a body that is not JSON, only what precedes the first error
// is looked at (callers refuse such a body anyway).
func Find(body []byte) (string, bool) {
	if !mayHold(body) {
		return "", false
	}
	return findDecoded(body)
}

// findDecoded is Find without the byte scan: it reads body token by token
// and looks at every value (about 15 µs for a 200-byte body, where the
// scan takes well under one). Not decoded into a map: of a member named
// twice a map keeps the last value only, while the body is delivered as
// sent, where a reader may take the first.
func findDecoded(body []byte) (string, bool) {
	d := json.NewDecoder(bytes.NewReader(body))
	d.UseNumber()
	at, found, _ := find(d, "")
	return at, found
}

// find reads the value at d's next token, pointer at, up to the first card
// data in it.
func find(d *json.Decoder, at string) (string, bool, error) {
	tok, err := d.Token()
	if err != nil {
		return "", false, err
	}
	switch t := tok.(type) {
	case string:
		return at, HasCardNumber(t), nil
	case json.Number:
		n, whole := integerOf(string(t))
		return at, HasCardNumber(string(t)) || whole && HasCardNumber(n), nil
	case json.Delim: // '[' or '{': Token returns closing ones only after More is false
		for i := 0; d.More(); i++ {
			p := at + "/" + strconv.Itoa(i)
			if t == '{' {
				tok, err := d.Token()
				if err != nil {
					return "", false, err
				}
				k, _ := tok.(string)
				p = at + "/" + strings.ReplaceAll(strings.ReplaceAll(k, "~", "~0"), "/", "~1")
				if verificationKeys[strings.NewReplacer("_", "", "-", "").Replace(strings.ToLower(k))] {
					return p, true, nil
				}
			}
			if p, ok, err := find(d, p); ok || err != nil {
				return p, ok, err
			}
		}
		_, err := d.Token() // the closing delimiter
		return "", false, err
	}
	return "", false, nil // true, false, null
}

// integerOf returns the digits of the value of n, a JSON number written
// with a fraction or an exponent ("4.111111111111111e15"), when it is a
// whole number of 13 to 19 digits: its reader sees the same number as one
// written out. It never builds more than 19 digits, whatever the exponent.
func integerOf(n string) (string, bool) {
	mant, exp, hasExp := strings.Cut(strings.ToLower(strings.TrimPrefix(n, "-")), "e")
	whole, frac, _ := strings.Cut(mant, ".")
	e := 0
	if hasExp {
		var err error
		// Beyond ±len(n)+19 no zeros of the mantissa can bring the
		// value back to 19 digits or fewer.
		if e, err = strconv.Atoi(exp); err != nil || e > len(n)+19 || e < -len(n)-19 {
			return "", false
		}
	}
	digits, point := whole+frac, len(whole)+e // the value is 0.digits × 10^point
	for len(digits) > 0 && digits[0] == '0' {
		digits, point = digits[1:], point-1
	}
	digits = strings.TrimRight(digits, "0")
	if point < 13 || point > 19 || len(digits) > point {
		return "", false
	}
	return digits + strings.Repeat("0", point-len(digits)), true
}

// keyMarks are what every verification key holds once normalised (lower
// case, no _ or -): "cvv2" holds "cvv", "cardsecuritycode" holds
// "securitycode".
var keyMarks = [][]byte{[]byte("cvv"), []byte("cvc"), []byte("cvn"), []byte("securitycode"), []byte("cardverification")}

// mayHold reports whether body could hold card data by Find's rules,
// reading its bytes without decoding them: a sequence of 13 digits or more
// among spaces and dashes (where every card number lies), a number with an
// exponent (whose value may have more digits than it is written with), or
// a verification key's letters anywhere. It errs one way only: a body with
// a \u escape or a byte outside ASCII, which decoding or lower-casing could
// turn into digits or a key's letters, may hold some.
func mayHold(body []byte) bool {
	digits := 0
	norm := make([]byte, 0, len(body))
	inString, escaped := false, false // where c is, as JSON reads it
	for i, c := range body {
		switch {
		case escaped:
			escaped = false
		case inString && c == '\\':
			escaped = true
		case c == '"':
			inString = !inString
		}
		switch {
		case c >= 0x80 || c == '\\' && i+1 < len(body) && body[i+1] == 'u':
			return true
		case !inString && (c == 'e' || c == 'E') && i > 0 && (isDigit(body[i-1]) || body[i-1] == '.'):
			return true // outside strings, only a number's exponent
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
