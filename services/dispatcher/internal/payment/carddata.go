package payment

import (
	"bytes"
	"encoding/json"
	"strings"
)

// CheckCardData refuses a message body whose payment field holds card
// data: a run of 13 to 19 digits (spaces and dashes between them allowed)
// that passes the Luhn check, or a field named like a card security code
// (cvv, cvc, cvv2, cvc2, security_code, in any case). Only payment
// references pass through the network. A body that is not a JSON object
// has no payment field.
func CheckCardData(body []byte) error {
	var top map[string]json.RawMessage
	if json.Unmarshal(body, &top) != nil {
		return nil
	}
	p, ok := top["payment"]
	if !ok {
		return nil
	}
	d := json.NewDecoder(bytes.NewReader(p))
	d.UseNumber()
	var v any
	if d.Decode(&v) != nil {
		return nil
	}
	if where := findCardData(v, "payment"); where != "" {
		return &Refusal{Rule: RuleCardData, Detail: "the payment field holds card data at " + where + "; send a payment provider's reference, never a card number or security code"}
	}
	return nil
}

// securityCodeNames are field names of card security codes, lower case.
var securityCodeNames = map[string]bool{"cvv": true, "cvc": true, "cvv2": true, "cvc2": true, "security_code": true, "securitycode": true, "csc": true}

// findCardData returns the path of the first card data in v, or "".
func findCardData(v any, path string) string {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			lk := strings.ToLower(k)
			if securityCodeNames[lk] || strings.HasSuffix(lk, "_cvv") || strings.HasSuffix(lk, "_cvc") {
				return path + "." + k
			}
			if w := findCardData(e, path+"."+k); w != "" {
				return w
			}
		}
	case []any:
		for _, e := range v {
			if w := findCardData(e, path+"[]"); w != "" {
				return w
			}
		}
	case string:
		if hasCardNumber(v) {
			return path
		}
	case json.Number:
		if hasCardNumber(v.String()) {
			return path
		}
	}
	return ""
}

// hasCardNumber reports whether s holds a Luhn-valid run of 13 to 19
// digits, spaces and dashes between digits allowed.
func hasCardNumber(s string) bool {
	var run []byte
	flush := func() bool {
		ok := len(run) >= 13 && len(run) <= 19 && luhn(run)
		run = run[:0]
		return ok
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= '0' && c <= '9':
			run = append(run, c)
		case (c == ' ' || c == '-') && len(run) > 0 && i+1 < len(s) && s[i+1] >= '0' && s[i+1] <= '9':
			// a separator inside a number
		default:
			if flush() {
				return true
			}
		}
	}
	return flush()
}

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
