// Package pd understands Agora protocol documents (PDs): their SHA-1
// identity in both textual forms, and their metadata block in both layouts,
// including Parley's machine-readable parts (JSON Schemas for bodies and a
// message state machine).
//
// A PD is addressed by the SHA-1 of its exact bytes. Nothing in this package
// trims, normalises or re-encodes content: hashes are always over the bytes
// as received (specs/agora.md, section 3).
package pd

import (
	"crypto/sha1" //nolint:gosec // SHA-1 is the Agora interop id; SHA-256 guards against collisions
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// ErrMalformedHash reports text that is neither 40 hex characters nor the
// 28-character padded base64 form of a SHA-1.
var ErrMalformedHash = errors.New("malformed protocol hash")

// Hash is the SHA-1 of a protocol document: its Agora identity. Compare and
// key by Hash; encode only at the edges.
type Hash [sha1.Size]byte

// Sum returns the SHA-1 of content.
func Sum(content []byte) Hash { return Hash(sha1.Sum(content)) } //nolint:gosec // see import

// Sum256 returns the SHA-256 of content.
func Sum256(content []byte) [sha256.Size]byte { return sha256.Sum256(content) }

// Hex returns the 40-character lowercase hex form (the Working Standard's).
func (h Hash) Hex() string { return hex.EncodeToString(h[:]) }

// Base64 returns the 28-character padded standard base64 form (the Python
// reference library's).
func (h Hash) Base64() string { return base64.StdEncoding.EncodeToString(h[:]) }

// String returns the hex form.
func (h Hash) String() string { return h.Hex() }

// ParseHash accepts a SHA-1 as 40 hex characters in any case, or as the
// 28-character padded standard base64 form. A base64 hash that arrived
// percent-encoded (it holds '+', '/' and '=', which travel escaped in URLs)
// is unescaped first.
func ParseHash(s string) (Hash, error) {
	var h Hash
	if strings.Contains(s, "%") {
		u, err := url.PathUnescape(s)
		if err != nil {
			return h, fmt.Errorf("%q: %w", s, ErrMalformedHash)
		}
		s = u
	}
	switch len(s) {
	case 2 * len(h):
		if _, err := hex.Decode(h[:], []byte(s)); err != nil {
			return h, fmt.Errorf("%q is not 40 hex characters: %w", s, ErrMalformedHash)
		}
		return h, nil
	case base64.StdEncoding.EncodedLen(len(h)):
		b, err := base64.StdEncoding.Strict().DecodeString(s)
		if err != nil || len(b) != len(h) {
			return h, fmt.Errorf("%q is not a 28-character base64 SHA-1: %w", s, ErrMalformedHash)
		}
		copy(h[:], b)
		return h, nil
	default:
		return h, fmt.Errorf("%q has %d characters, want 40 (hex) or 28 (base64): %w", s, len(s), ErrMalformedHash)
	}
}
