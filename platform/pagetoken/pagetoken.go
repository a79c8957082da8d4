// Package pagetoken encodes the opaque, versioned page tokens of AIP-158 list
// methods. A token carries the key to resume after and a checksum of the
// request parameters it was issued for, so a token reused with other
// parameters, or forged, is rejected.
package pagetoken

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"hash/fnv"
)

const version = 1

// ErrInvalid reports a token that is malformed, from another version, or was
// issued for different request parameters.
var ErrInvalid = errors.New("invalid page token")

// Encode returns a token resuming after key for a request whose filtering
// parameters are params.
func Encode(key string, params ...string) string {
	buf := make([]byte, 0, 1+8+len(key))
	buf = append(buf, version)
	buf = binary.BigEndian.AppendUint64(buf, checksum(params))
	buf = append(buf, key...)
	return base64.RawURLEncoding.EncodeToString(buf)
}

// Decode returns the key of a token issued by Encode with the same params.
// An empty token decodes to an empty key (the first page).
func Decode(token string, params ...string) (string, error) {
	if token == "" {
		return "", nil
	}
	raw, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil || len(raw) < 9 || raw[0] != version {
		return "", ErrInvalid
	}
	if binary.BigEndian.Uint64(raw[1:9]) != checksum(params) {
		return "", ErrInvalid
	}
	return string(raw[9:]), nil
}

func checksum(params []string) uint64 {
	h := fnv.New64a()
	for _, p := range params {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return h.Sum64()
}

// Size applies AIP-158 defaults: 0 means def, above max is clamped. A
// negative size is reported as false.
func Size(pageSize int32, def, maxSize int) (int, bool) {
	switch {
	case pageSize < 0:
		return 0, false
	case pageSize == 0:
		return def, true
	case int(pageSize) > maxSize:
		return maxSize, true
	default:
		return int(pageSize), true
	}
}
