// Package agora reads and writes the Agora wire format: envelopes, hashes
// and the reply shapes of each dialect (specs/agora.md, sections 1, 2 and 8).
//
// Reading is tolerant: a missing or null protocolHash, protocolSources that
// are absent, null, [] or [null], hex or base64 hashes, any JSON body and
// unknown keys are all accepted. Writing is conservative and depends on the
// peer's Dialect. Bodies stay raw JSON bytes throughout.
package agora

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/parleyhq/parley/platform/jsondepth"
)

// ErrMalformed marks a request that is not a valid Agora envelope.
var ErrMalformed = errors.New("malformed envelope")

// HashForm is how a request spelled its protocol hash.
type HashForm int

// Hash spellings.
const (
	HashNone HashForm = iota
	HashHex
	HashBase64
	HashNegotiation // the reference library's "negotiation" exchange
)

// Envelope is a parsed Agora request.
type Envelope struct {
	// Hash is the 20-byte SHA-1, nil when no protocol is given.
	Hash []byte
	// Form is how the hash was written.
	Form HashForm
	// HadHashKey and HadSourcesKey tell whether the keys were present (pylib
	// sends both, even when null).
	HadHashKey, HadSourcesKey bool
	// Sources are the usable protocolSources, in order.
	Sources []string
	// Body is the raw JSON of body; "null" when absent.
	Body json.RawMessage
	// Multiround is the multiround flag.
	Multiround bool
}

// HexHash returns the hash as 40 lowercase hex characters, or "".
func (e *Envelope) HexHash() string {
	if e.Hash == nil {
		return ""
	}
	return hex.EncodeToString(e.Hash)
}

type wireEnvelope struct {
	ProtocolHash    json.RawMessage `json:"protocolHash"`
	ProtocolSources json.RawMessage `json:"protocolSources"`
	Body            json.RawMessage `json:"body"`
	Multiround      json.RawMessage `json:"multiround"`
}

var null = json.RawMessage("null")

// Parse reads an envelope from raw request bytes.
func Parse(data []byte) (*Envelope, error) {
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return nil, fmt.Errorf("%w: the request must be a JSON object", ErrMalformed)
	}
	// Before any parser recurses into it (the body reaches routines too).
	if err := jsondepth.Check(trimmed, jsondepth.Max); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	var w wireEnvelope
	if !json.Valid(trimmed) || !w.scan(trimmed) {
		// The slow path: encoding/json's result, and its error message.
		w = wireEnvelope{}
		if err := json.Unmarshal(trimmed, &w); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrMalformed, err)
		}
	}
	e := &Envelope{Body: w.Body, HadHashKey: w.ProtocolHash != nil, HadSourcesKey: w.ProtocolSources != nil}
	if e.Body == nil {
		e.Body = null
	}
	if !isNull(w.ProtocolHash) {
		s, err := jsonString(w.ProtocolHash)
		if err != nil {
			return nil, fmt.Errorf("%w: protocolHash must be a string or null", ErrMalformed)
		}
		h, form, err := ParseHash(s)
		if err != nil {
			return nil, err
		}
		e.Hash, e.Form = h, form
	}
	if !isNull(w.ProtocolSources) {
		var raw []json.RawMessage
		if err := json.Unmarshal(w.ProtocolSources, &raw); err != nil {
			return nil, fmt.Errorf("%w: protocolSources must be a list or null", ErrMalformed)
		}
		for _, r := range raw {
			var s string
			if json.Unmarshal(r, &s) == nil && s != "" {
				e.Sources = append(e.Sources, s)
			}
		}
	}
	if !isNull(w.Multiround) {
		if err := json.Unmarshal(w.Multiround, &e.Multiround); err != nil {
			return nil, fmt.Errorf("%w: multiround must be a boolean", ErrMalformed)
		}
	}
	return e, nil
}

// ParseHash reads a SHA-1 written as 40 hex characters (any case) or 28
// base64 characters. "" means no protocol; "negotiation" is the reference
// library's negotiation exchange.
func ParseHash(s string) ([]byte, HashForm, error) {
	switch {
	case s == "":
		return nil, HashNone, nil
	case s == "negotiation":
		return nil, HashNegotiation, nil
	case len(s) == 40:
		h, err := hex.DecodeString(s)
		if err == nil {
			return h, HashHex, nil
		}
	case len(s) == 28:
		h, err := base64.StdEncoding.DecodeString(s)
		if err == nil && len(h) == 20 {
			return h, HashBase64, nil
		}
	}
	return nil, HashNone, fmt.Errorf("%w: protocolHash %q is neither 40 hex nor 28 base64 characters", ErrMalformed, s)
}

// scan fills w from data, a valid JSON object, the way json.Unmarshal does
// (keys matched exactly or case-insensitively, the last duplicate wins,
// other keys skipped) without reflection. It reports false when it cannot,
// and the caller then uses json.Unmarshal.
func (w *wireEnvelope) scan(data []byte) bool {
	i := skipSpace(data, 1)
	if i < len(data) && data[i] == '}' {
		return true
	}
	for i < len(data) {
		if data[i] != '"' {
			return false
		}
		end := skipString(data, i)
		key, err := jsonString(data[i:end])
		if err != nil {
			return false
		}
		i = skipSpace(data, end)
		if i >= len(data) || data[i] != ':' {
			return false
		}
		start := skipSpace(data, i+1)
		end = skipValue(data, start)
		if end <= start {
			return false
		}
		switch v := json.RawMessage(data[start:end]); {
		case matchKey(key, "protocolHash"):
			w.ProtocolHash = v
		case matchKey(key, "protocolSources"):
			w.ProtocolSources = v
		case matchKey(key, "body"):
			w.Body = v
		case matchKey(key, "multiround"):
			w.Multiround = v
		}
		i = skipSpace(data, end)
		if i >= len(data) {
			return false
		}
		switch data[i] {
		case '}':
			return true
		case ',':
			i = skipSpace(data, i+1)
		default:
			return false
		}
	}
	return false
}

// matchKey is encoding/json's rule: exact, else case-insensitive.
func matchKey(key, field string) bool {
	return key == field || strings.EqualFold(key, field)
}

func skipSpace(data []byte, i int) int {
	for i < len(data) && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index after the string literal at data[i] (valid
// JSON).
func skipString(data []byte, i int) int {
	for j := i + 1; j < len(data); j++ {
		switch data[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	return len(data)
}

// skipValue returns the index after the JSON value at data[i] (valid JSON).
func skipValue(data []byte, i int) int {
	if i >= len(data) {
		return i
	}
	switch data[i] {
	case '"':
		return skipString(data, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(data); j++ {
			switch data[j] {
			case '"':
				j = skipString(data, j) - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return j + 1
				}
			}
		}
		return len(data)
	}
	j := i
	for j < len(data) && !strings.ContainsRune(",}] \t\n\r", rune(data[j])) {
		j++
	}
	return j
}

// jsonString reads a JSON string literal, without encoding/json when it has
// no escapes and is ASCII.
func jsonString(lit []byte) (string, error) {
	if n := len(lit); n >= 2 && lit[0] == '"' && lit[n-1] == '"' {
		plain := true
		for _, c := range lit[1 : n-1] {
			if c == '\\' || c == '"' || c < 0x20 || c >= 0x80 {
				plain = false
				break
			}
		}
		if plain {
			return string(lit[1 : n-1]), nil
		}
	}
	var s string
	err := json.Unmarshal(lit, &s)
	return s, err
}

func isNull(r json.RawMessage) bool {
	return r == nil || string(bytes.TrimSpace(r)) == "null"
}

// Query returns the body as routines see it: a JSON string holding a JSON
// object or list (how spec2024 and pylib peers send structured bodies) is
// unwrapped; anything else is returned as is.
func Query(body json.RawMessage) (json.RawMessage, bool) {
	b := bytes.TrimSpace(body)
	if len(b) == 0 || b[0] != '"' {
		return body, false
	}
	var s string
	if json.Unmarshal(b, &s) != nil {
		return body, false
	}
	t := strings.TrimSpace(s)
	if t == "" || (t[0] != '{' && t[0] != '[') || !json.Valid([]byte(t)) {
		return body, false
	}
	return json.RawMessage(t), true
}

// BodyAs writes a result for a peer: when asString (the peer sent its body as
// a string) a non-string result is sent as its JSON text in a string, as the
// spec page and the reference library expect; otherwise as is.
func BodyAs(result json.RawMessage, asString bool) json.RawMessage {
	r := bytes.TrimSpace(result)
	if !asString || len(r) == 0 || r[0] == '"' {
		return result
	}
	s, _ := json.Marshal(string(r))
	return s
}
