package boltstore

import (
	"encoding/binary"
	"errors"
)

// The binary record forms (timers, mailbox messages) are built from
// length-prefixed strings: a uvarint length, then the bytes.

// errShort reports a binary record that ends early or runs on.
var errShort = errors.New("truncated or overlong")

// appendString appends s, length-prefixed.
func appendString(v []byte, s string) []byte {
	v = binary.AppendUvarint(v, uint64(len(s)))
	return append(v, s...)
}

// appendBytes appends b, length-prefixed.
func appendBytes(v, b []byte) []byte {
	v = binary.AppendUvarint(v, uint64(len(b)))
	return append(v, b...)
}

// reader reads a binary record front to back; the first failure sticks
// (err), and every read after it returns zero values.
type reader struct {
	rest []byte
	err  error
}

// bytes returns the next length-prefixed bytes, aliasing the record.
func (r *reader) bytes() []byte {
	if r.err != nil {
		return nil
	}
	n, w := binary.Uvarint(r.rest)
	if w <= 0 || n > uint64(len(r.rest)-w) {
		r.err = errShort
		return nil
	}
	b := r.rest[w : w+int(n)]
	r.rest = r.rest[w+int(n):]
	return b
}

// string returns the next length-prefixed string, copied.
func (r *reader) string() string { return string(r.bytes()) }

// uint64 returns the next 8 bytes, big-endian.
func (r *reader) uint64() uint64 {
	if r.err != nil {
		return 0
	}
	if len(r.rest) < 8 {
		r.err = errShort
		return 0
	}
	u := binary.BigEndian.Uint64(r.rest)
	r.rest = r.rest[8:]
	return u
}

// uvarint returns the next uvarint.
func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	u, w := binary.Uvarint(r.rest)
	if w <= 0 {
		r.err = errShort
		return 0
	}
	r.rest = r.rest[w:]
	return u
}

// varint returns the next varint.
func (r *reader) varint() int64 {
	if r.err != nil {
		return 0
	}
	i, w := binary.Varint(r.rest)
	if w <= 0 {
		r.err = errShort
		return 0
	}
	r.rest = r.rest[w:]
	return i
}

// end fails the read when bytes are left over, and returns its error.
func (r *reader) end() error {
	if r.err == nil && len(r.rest) > 0 {
		r.err = errShort
	}
	return r.err
}
