// Package jsondepth bounds the nesting of JSON from outside before it is
// parsed: recursive parsers (encoding/json, Starlark's json module, schema
// compilers) spend stack and time in proportion to the depth, so a 1 MB
// document of brackets can cost gigabytes. Check is one pass over the bytes,
// allocation-free.
package jsondepth

import (
	"errors"
	"fmt"
)

// Max is the nesting limit for every JSON document Parley reads from
// outside: envelope bodies, tool results, schemas, json.decode in routines.
const Max = 64

// ErrTooDeep marks a document nested deeper than the limit.
var ErrTooDeep = errors.New("JSON nested too deeply")

// Check returns an error matching ErrTooDeep when data has arrays or
// objects nested deeper than limit. It does not validate data: text that
// is not JSON passes when its brackets are shallow enough, for the parser
// to refuse with its own message.
func Check(data []byte, limit int) error { return check(data, limit) }

// CheckString is Check for a string.
func CheckString(s string, limit int) error { return check(s, limit) }

// check is Check and CheckString: one pass, allocation-free.
func check[T string | []byte](data T, limit int) error {
	depth, inString := 0, false
	for i := 0; i < len(data); i++ {
		c := data[i]
		if inString {
			switch c {
			case '\\':
				i++
			case '"':
				inString = false
			}
			continue
		}
		switch c {
		case '"':
			inString = true
		case '[', '{':
			depth++
			if depth > limit {
				return fmt.Errorf("%w: more than %d levels of arrays and objects", ErrTooDeep, limit)
			}
		case ']', '}':
			depth--
		}
	}
	return nil
}
