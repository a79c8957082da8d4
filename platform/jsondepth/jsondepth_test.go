package jsondepth

import (
	"errors"
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	nest := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	for _, tc := range []struct {
		name string
		doc  string
		deep bool
	}{
		{"flat", `{"a":1,"b":[1,2]}`, false},
		{"at the limit", nest(Max), false},
		{"one past", nest(Max + 1), true},
		{"objects", strings.Repeat(`{"a":`, Max+1) + "1" + strings.Repeat("}", Max+1), true},
		{"brackets in strings do not count", `["` + strings.Repeat("[", 1000) + `"]`, false},
		{"escaped quote keeps the string open", `["\"` + strings.Repeat("[", 1000) + `"]`, false},
		{"half a megabyte of brackets", strings.Repeat("[", 500000), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Check([]byte(tc.doc), Max)
			if errors.Is(err, ErrTooDeep) != tc.deep {
				t.Errorf("Check = %v, want too deep %v", err, tc.deep)
			}
			if err2 := CheckString(tc.doc, Max); (err2 == nil) != (err == nil) {
				t.Errorf("CheckString = %v, Check = %v", err2, err)
			}
		})
	}
}
