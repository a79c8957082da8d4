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
	var w wireEnvelope
	if err := json.Unmarshal(trimmed, &w); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	e := &Envelope{Body: w.Body, HadHashKey: w.ProtocolHash != nil, HadSourcesKey: w.ProtocolSources != nil}
	if e.Body == nil {
		e.Body = null
	}
	if !isNull(w.ProtocolHash) {
		var s string
		if err := json.Unmarshal(w.ProtocolHash, &s); err != nil {
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
