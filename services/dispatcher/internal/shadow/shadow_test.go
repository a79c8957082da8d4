package shadow

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestTopLevelNames(t *testing.T) {
	names, funcs, err := topLevelNames("A = 1\nb, (c, d) = 1, (2, 3)\ndef f(x):\n    y = x\n    return y\nif A:\n    g = 2\nfor i in []:\n    pass\n")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(names, ","), "A,b,c,d,f,g,i"; got != want {
		t.Errorf("names = %s, want %s", got, want)
	}
	if got := strings.Join(funcs, ","); got != "f" {
		t.Errorf("funcs = %s, want f", got)
	}
}

func TestSameJSON(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want bool
	}{
		{`{"a":1,"b":[1,2]}`, `{"b":[1,2.0],"a":1.0}`, true},
		{`"{\"a\":1}"`, `{"a":1}`, true},
		{`{"a":1}`, `{"a":2}`, false},
		{`"text"`, `"text"`, true},
		{`"text"`, `"Text"`, false},
		{`[1,2]`, `[2,1]`, false},
		{`not json`, `not json`, false},
	} {
		if got := SameJSON(json.RawMessage(tc.a), json.RawMessage(tc.b)); got != tc.want {
			t.Errorf("SameJSON(%s, %s) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}
