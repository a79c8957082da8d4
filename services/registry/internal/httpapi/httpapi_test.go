package httpapi

import "testing"

func TestEtagMatches(t *testing.T) {
	const tag = `"abc"`
	for _, tt := range []struct {
		header string
		want   bool
	}{
		{"", false},
		{`"abc"`, true},
		{`W/"abc"`, true},
		{`"x", "abc"`, true},
		{"*", true},
		{`"abcd"`, false},
		{`abc`, false},
	} {
		if got := etagMatches(tt.header, tag); got != tt.want {
			t.Errorf("etagMatches(%q, %s) = %v, want %v", tt.header, tag, got, tt.want)
		}
	}
}
