package routine

import (
	"encoding/json"
	"errors"
	"math"
	"math/big"
	"slices"
	"strconv"
	"unicode/utf8"

	"go.starlark.net/starlark"

	"github.com/parleyhq/parley/platform/jsondepth"
)

// The hot path moves every query, tool result, reply and memory across the
// JSON boundary. Starlark's json module does it through a Starlark call,
// fmt and big.Int for every integer, and a reflective sort; these fast paths
// cover plain JSON data (None, bools, ints, floats, strings, lists, tuples
// and dicts with string keys) and give exactly the json module's results.
// Anything else (a cycle, a non-string key, a struct, invalid input) takes
// the json module, so errors and exotic values behave as before.

// errSlowPath sends a value or document to the json module.
var errSlowPath = errors.New("not plain JSON data")

// maxFastDepth bounds the nesting of JSON in and out of routines (the
// arguments, tool results, json.decode, the result and memory): deeper
// input is refused before any parser recurses into it, a deeper result (or
// a cycle) is refused before it is encoded.
const maxFastDepth = jsondepth.Max

// errTooDeep is a value nested deeper than maxFastDepth.
var errTooDeep = errors.New("value nested too deeply")

// decodeJSON parses one JSON document into Starlark values, as json.decode
// does.
func decodeJSON(thread *starlark.Thread, raw []byte) (starlark.Value, error) {
	if err := jsondepth.Check(raw, maxFastDepth); err != nil {
		return nil, err
	}
	d := decoder{s: raw}
	v, err := d.value(0)
	if err == nil {
		d.space()
		if d.i == len(d.s) {
			return v, nil
		}
	}
	return starlark.Call(thread, jsonDecode, starlark.Tuple{starlark.String(raw)}, nil)
}

type decoder struct {
	s []byte
	i int
}

func (d *decoder) space() {
	for d.i < len(d.s) {
		switch d.s[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

func (d *decoder) literal(word string, v starlark.Value) (starlark.Value, error) {
	if len(d.s)-d.i >= len(word) && string(d.s[d.i:d.i+len(word)]) == word {
		d.i += len(word)
		return v, nil
	}
	return nil, errSlowPath
}

func (d *decoder) value(depth int) (starlark.Value, error) {
	if depth > maxFastDepth {
		return nil, errSlowPath
	}
	d.space()
	if d.i >= len(d.s) {
		return nil, errSlowPath
	}
	switch c := d.s[d.i]; {
	case c == '"':
		return d.str()
	case c == 'n':
		return d.literal("null", starlark.None)
	case c == 't':
		return d.literal("true", starlark.True)
	case c == 'f':
		return d.literal("false", starlark.False)
	case c == '-' || '0' <= c && c <= '9':
		return d.number()
	case c == '[':
		d.i++
		var elems []starlark.Value
		d.space()
		if d.i < len(d.s) && d.s[d.i] == ']' {
			d.i++
			return starlark.NewList(elems), nil
		}
		for {
			v, err := d.value(depth + 1)
			if err != nil {
				return nil, err
			}
			elems = append(elems, v)
			d.space()
			if d.i >= len(d.s) {
				return nil, errSlowPath
			}
			d.i++
			switch d.s[d.i-1] {
			case ',':
			case ']':
				return starlark.NewList(elems), nil
			default:
				return nil, errSlowPath
			}
		}
	case c == '{':
		d.i++
		dict := new(starlark.Dict)
		d.space()
		if d.i < len(d.s) && d.s[d.i] == '}' {
			d.i++
			return dict, nil
		}
		for {
			d.space()
			if d.i >= len(d.s) || d.s[d.i] != '"' {
				return nil, errSlowPath
			}
			k, err := d.str()
			if err != nil {
				return nil, err
			}
			d.space()
			if d.i >= len(d.s) || d.s[d.i] != ':' {
				return nil, errSlowPath
			}
			d.i++
			v, err := d.value(depth + 1)
			if err != nil {
				return nil, err
			}
			if err := dict.SetKey(k, v); err != nil {
				return nil, err
			}
			d.space()
			if d.i >= len(d.s) {
				return nil, errSlowPath
			}
			d.i++
			switch d.s[d.i-1] {
			case ',':
			case '}':
				return dict, nil
			default:
				return nil, errSlowPath
			}
		}
	}
	return nil, errSlowPath
}

// str reads a string literal; escapes and non-ASCII are decoded the way
// json.decode does (through encoding/json).
func (d *decoder) str() (starlark.Value, error) {
	start := d.i
	safe := true
	for j := start + 1; j < len(d.s); j++ {
		switch c := d.s[j]; {
		case c == '\\':
			safe = false
			j++
		case c == '"':
			d.i = j + 1
			lit := d.s[start:d.i]
			if safe {
				return starlark.String(lit[1 : len(lit)-1]), nil
			}
			if !utf8.Valid(lit) {
				return nil, errSlowPath
			}
			var s string
			if json.Unmarshal(lit, &s) != nil {
				return nil, errSlowPath
			}
			return starlark.String(s), nil
		case c < 0x20:
			return nil, errSlowPath // json.decode's error message
		case c >= utf8.RuneSelf:
			safe = false
		}
	}
	return nil, errSlowPath
}

// number reads a JSON number: an int (Starlark's arbitrary precision) when
// it has no fraction or exponent, else a float.
func (d *decoder) number() (starlark.Value, error) {
	start := d.i
	if d.s[d.i] == '-' {
		d.i++
	}
	digits := d.i
	for d.i < len(d.s) && '0' <= d.s[d.i] && d.s[d.i] <= '9' {
		d.i++
	}
	n := d.i - digits
	if n == 0 || n > 1 && d.s[digits] == '0' {
		return nil, errSlowPath
	}
	isFloat := false
	if d.i < len(d.s) && d.s[d.i] == '.' {
		isFloat = true
		d.i++
		if !d.digits() {
			return nil, errSlowPath
		}
	}
	if d.i < len(d.s) && (d.s[d.i] == 'e' || d.s[d.i] == 'E') {
		isFloat = true
		d.i++
		if d.i < len(d.s) && (d.s[d.i] == '+' || d.s[d.i] == '-') {
			d.i++
		}
		if !d.digits() {
			return nil, errSlowPath
		}
	}
	num := string(d.s[start:d.i])
	if isFloat {
		f, err := strconv.ParseFloat(num, 64)
		if err != nil {
			return nil, errSlowPath
		}
		return starlark.Float(f), nil
	}
	if x, err := strconv.ParseInt(num, 10, 64); err == nil {
		return starlark.MakeInt64(x), nil
	}
	x, ok := new(big.Int).SetString(num, 10)
	if !ok {
		return nil, errSlowPath
	}
	return starlark.MakeBigInt(x), nil
}

func (d *decoder) digits() bool {
	start := d.i
	for d.i < len(d.s) && '0' <= d.s[d.i] && d.s[d.i] <= '9' {
		d.i++
	}
	return d.i > start
}

// errTooLarge is a value whose encoding would pass the caller's cap.
var errTooLarge = errors.New("encoded value too large")

// encodeJSON encodes v as json.encode does, or fails with errTooLarge when
// the encoding would pass maxBytes, found before encoding by a walk that
// stops at the cap.
func encodeJSON(thread *starlark.Thread, v starlark.Value, maxBytes int) ([]byte, error) {
	if sizeOf(v, int64(maxBytes)) > int64(maxBytes) {
		return nil, errTooLarge
	}
	buf, err := appendJSON(make([]byte, 0, 256), v, 0)
	if err == nil || errors.Is(err, errTooDeep) {
		return buf, err
	}
	enc, err := starlark.Call(thread, jsonEncode, starlark.Tuple{v}, nil)
	if err != nil {
		return nil, err
	}
	return []byte(enc.(starlark.String)), nil
}

func appendJSON(buf []byte, v starlark.Value, depth int) ([]byte, error) {
	if depth > maxFastDepth {
		return nil, errTooDeep
	}
	switch x := v.(type) {
	case starlark.NoneType:
		return append(buf, "null"...), nil
	case starlark.Bool:
		return strconv.AppendBool(buf, bool(x)), nil
	case starlark.Int:
		if i, ok := x.Int64(); ok {
			return strconv.AppendInt(buf, i, 10), nil
		}
		return append(buf, x.String()...), nil
	case starlark.Float:
		f := float64(x)
		if math.IsInf(f, 0) || math.IsNaN(f) {
			return nil, errSlowPath
		}
		return append(buf, x.String()...), nil
	case starlark.String:
		return appendString(buf, string(x)), nil
	case *starlark.List:
		return appendArray(buf, x, x.Len(), depth)
	case starlark.Tuple:
		return appendArray(buf, x, x.Len(), depth)
	case *starlark.Dict:
		items := x.Items()
		for _, it := range items {
			if _, ok := it[0].(starlark.String); !ok {
				return nil, errSlowPath
			}
		}
		slices.SortFunc(items, func(a, b starlark.Tuple) int {
			ka, kb := a[0].(starlark.String), b[0].(starlark.String)
			switch {
			case ka < kb:
				return -1
			case ka > kb:
				return 1
			}
			return 0
		})
		buf = append(buf, '{')
		for i, it := range items {
			if i > 0 {
				buf = append(buf, ',')
			}
			buf = appendString(buf, string(it[0].(starlark.String)))
			buf = append(buf, ':')
			var err error
			if buf, err = appendJSON(buf, it[1], depth+1); err != nil {
				return nil, err
			}
		}
		return append(buf, '}'), nil
	}
	return nil, errSlowPath
}

func appendArray(buf []byte, x starlark.Indexable, n, depth int) ([]byte, error) {
	buf = append(buf, '[')
	for i := range n {
		if i > 0 {
			buf = append(buf, ',')
		}
		var err error
		if buf, err = appendJSON(buf, x.Index(i), depth+1); err != nil {
			return nil, err
		}
	}
	return append(buf, ']'), nil
}

// appendString quotes s as json.encode does: strconv quoting for printable
// ASCII, encoding/json for the rest.
func appendString(buf []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] >= 0x80 {
			b, _ := json.Marshal(s)
			return append(buf, b...)
		}
	}
	return strconv.AppendQuote(buf, s)
}
