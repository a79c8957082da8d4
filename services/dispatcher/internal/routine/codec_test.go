package routine

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"go.starlark.net/starlark"

	"github.com/parleyhq/parley/platform/jsondepth"
)

// The fast JSON paths must give exactly what Starlark's json module gives:
// the same values (types included) and the same errors, except past the
// nesting limit, which they refuse (TestDepthLimit).

var decodeCorpus = []string{
	`null`, `true`, `false`, ` 0 `, `-0`, `7`, `-12`, `1.5`, `-0.25e-3`, `1e5`, `1E+2`,
	`9223372036854775807`, `9223372036854775808`, `-9223372036854775809`, `123456789012345678901234567890`,
	`""`, `"abc"`, `"a\"b\\c\/d\n\u00e9\ud83d\ude00"`, `"café ☕ 日本"`, "\"\xff\xfe\"", "\"tab\there\"",
	`[]`, `[1,"a",null,[true,{}]]`, `{}`, `{"a":1,"b":{"c":[1,2,{"d":null}]}}`, `{"a":1,"a":2}`,
	` { "date" : "2026-12-01" , "location" : "Paris" } `,
	strings.Repeat("[", maxFastDepth) + strings.Repeat("]", maxFastDepth),
	// Invalid: both must fail with json.decode's message.
	``, ` `, `nul`, `nullx`, `01`, `1.`, `.5`, `-`, `1e`, `1-2`, `+1`, `"abc`, `"\x"`, `[1,]`, `[1 2]`,
	`{"a" 1}`, `{"a":1,}`, `{1:2}`, `{"a":1`, `[`, `tru`, `{"a":1} x`, `[1]]`,
}

func TestDecodeJSON_matchesJSONModule(t *testing.T) {
	for _, doc := range decodeCorpus {
		checkDecode(t, doc)
	}
	// Plain documents take the fast path (else the test above proves nothing).
	for _, doc := range []string{`{"a":1,"b":{"c":[1,2.5,{"d":null}]}}`, `"café"`, `123456789012345678901234567890`} {
		d := decoder{s: []byte(doc)}
		if _, err := d.value(0); err != nil || d.i != len(doc) {
			t.Errorf("fast decode of %s = %v at %d, want the whole document", doc, err, d.i)
		}
	}
}

func FuzzDecodeJSON(f *testing.F) {
	for _, doc := range decodeCorpus {
		f.Add(doc)
	}
	f.Fuzz(func(t *testing.T, doc string) { checkDecode(t, doc) })
}

func checkDecode(t *testing.T, doc string) {
	t.Helper()
	thread := &starlark.Thread{}
	if jsondepth.CheckString(doc, maxFastDepth) != nil {
		if _, err := decodeJSON(thread, []byte(doc)); !errors.Is(err, jsondepth.ErrTooDeep) {
			t.Fatalf("decodeJSON(%q) error = %v, want too deep", doc, err)
		}
		return
	}
	want, wantErr := starlark.Call(thread, jsonDecode, starlark.Tuple{starlark.String(doc)}, nil)
	got, gotErr := decodeJSON(thread, []byte(doc))
	if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
		t.Fatalf("decodeJSON(%q) error = %v, want %v", doc, gotErr, wantErr)
	}
	if wantErr != nil {
		return
	}
	if g, w := describe(got), describe(want); g != w {
		t.Errorf("decodeJSON(%q) = %s, want %s", doc, g, w)
	}
}

// describe prints a value with the type of every part, so 1 and 1.0 differ.
func describe(v starlark.Value) string {
	switch x := v.(type) {
	case *starlark.List:
		var parts []string
		for i := range x.Len() {
			parts = append(parts, describe(x.Index(i)))
		}
		return "[" + strings.Join(parts, ",") + "]"
	case *starlark.Dict:
		var parts []string
		for _, it := range x.Items() {
			parts = append(parts, describe(it[0])+":"+describe(it[1]))
		}
		return "{" + strings.Join(parts, ",") + "}"
	}
	return v.Type() + "(" + v.String() + ")"
}

func TestEncodeJSON_matchesJSONModule(t *testing.T) {
	exprs := []string{
		`None`, `True`, `False`, `0`, `-7`, `1 << 70`, `-(1 << 64)`, `1.5`, `1.0`, `1e308 * 10`, `float("nan")`, `-0.0`, `1e-7`,
		`""`, `"abc"`, `"quote \" and \\ backslash"`, `"café ☕"`, `"\x7f del"`, `"line\nbreak"`, `"\x01"`,
		`[]`, `()`, `[1, (2, 3), [None]]`, `{}`, `{"b": 1, "a": [1, {"d": 2, "c": 3}]}`,
		`{1: 2}`, `{"a": set([1])}`, `set([1])`, `range(3)`, `{"f": len}`, `nest(64)`,
	}
	predeclared := starlark.StringDict{
		"set": starlark.Universe["set"],
		"nest": starlark.NewBuiltin("nest", func(_ *starlark.Thread, _ *starlark.Builtin, args starlark.Tuple, _ []starlark.Tuple) (starlark.Value, error) {
			n, _ := starlark.AsInt32(args[0])
			var v starlark.Value = starlark.MakeInt(1)
			for range n {
				v = starlark.NewList([]starlark.Value{v})
			}
			return v, nil
		}),
		"cyclic": starlark.NewBuiltin("cyclic", func(*starlark.Thread, *starlark.Builtin, starlark.Tuple, []starlark.Tuple) (starlark.Value, error) {
			l := starlark.NewList(nil)
			_ = l.Append(l)
			return l, nil
		}),
	}
	fast := 0
	for _, expr := range exprs {
		thread := &starlark.Thread{}
		v, err := starlark.EvalOptions(fileOptions, thread, "expr", expr, predeclared)
		if err != nil {
			t.Fatalf("eval %s: %v", expr, err)
		}
		want, wantErr := starlark.Call(thread, jsonEncode, starlark.Tuple{v}, nil)
		got, gotErr := encodeJSON(thread, v, 1<<20)
		if _, err := appendJSON(nil, v, 0); err == nil {
			fast++
		}
		if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
			t.Errorf("encodeJSON(%s) error = %v, want %v", expr, gotErr, wantErr)
			continue
		}
		if wantErr == nil && string(got) != string(want.(starlark.String)) {
			t.Errorf("encodeJSON(%s) = %s, want %s", expr, got, want)
		}
	}
	// Deeper values, cycles included, are refused before encoding.
	for _, expr := range []string{`nest(65)`, `cyclic()`} {
		v, err := starlark.EvalOptions(fileOptions, &starlark.Thread{}, "expr", expr, predeclared)
		if err != nil {
			t.Fatalf("eval %s: %v", expr, err)
		}
		if _, err := encodeJSON(&starlark.Thread{}, v, 1<<20); !errors.Is(err, errTooDeep) {
			t.Errorf("encodeJSON(%s) error = %v, want errTooDeep", expr, err)
		}
	}
	if want := 24; fast != want {
		t.Errorf("%d expressions took the fast path, want %d", fast, want)
	}
}
