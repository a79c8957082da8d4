// Package binrec writes and reads the dispatcher's compact binary record
// forms (stored timers, mailbox messages and protocol pair states): a
// string or byte slice is a uvarint length and its bytes, a count a
// uvarint, a time a varint of Unix seconds and a uvarint of nanoseconds.
// Each record's own first byte names its form; its package documents the
// fields in order.
package binrec

import (
	"encoding/binary"
	"errors"
	"time"
)

// ErrCorrupt reports a record that ends early, runs on, or holds an
// impossible value.
var ErrCorrupt = errors.New("truncated or corrupt")

// AppendString appends s, length-prefixed.
func AppendString(v []byte, s string) []byte {
	v = binary.AppendUvarint(v, uint64(len(s)))
	return append(v, s...)
}

// AppendBytes appends b, length-prefixed.
func AppendBytes(v, b []byte) []byte {
	v = binary.AppendUvarint(v, uint64(len(b)))
	return append(v, b...)
}

// AppendTime appends t as a varint of Unix seconds and a uvarint of
// nanoseconds; the location is not kept (Reader.Time returns UTC).
func AppendTime(v []byte, t time.Time) []byte {
	v = binary.AppendVarint(v, t.Unix())
	return binary.AppendUvarint(v, uint64(t.Nanosecond())) //nolint:gosec // 0 to 999,999,999
}

// Reader reads a record front to back. The first failure sticks: every
// read after it returns a zero value, and End returns ErrCorrupt.
type Reader struct {
	rest []byte
	err  error
}

// NewReader reads b (a record after its form byte).
func NewReader(b []byte) Reader { return Reader{rest: b} }

// Fail marks the record corrupt (a value read was impossible).
func (r *Reader) Fail() {
	r.err = ErrCorrupt
	r.rest = nil
}

// Byte returns the next byte.
func (r *Reader) Byte() byte {
	if len(r.rest) < 1 {
		r.Fail()
		return 0
	}
	b := r.rest[0]
	r.rest = r.rest[1:]
	return b
}

// Uint64 returns the next 8 bytes, big-endian.
func (r *Reader) Uint64() uint64 {
	if len(r.rest) < 8 {
		r.Fail()
		return 0
	}
	u := binary.BigEndian.Uint64(r.rest)
	r.rest = r.rest[8:]
	return u
}

// Uvarint returns the next uvarint.
func (r *Reader) Uvarint() uint64 {
	u, w := binary.Uvarint(r.rest)
	if w <= 0 {
		r.Fail()
		return 0
	}
	r.rest = r.rest[w:]
	return u
}

// Varint returns the next varint.
func (r *Reader) Varint() int64 {
	i, w := binary.Varint(r.rest)
	if w <= 0 {
		r.Fail()
		return 0
	}
	r.rest = r.rest[w:]
	return i
}

// Count returns the next count of items or bytes that follow, each at
// least a byte long: a count larger than what is left fails the read.
func (r *Reader) Count() int {
	n := r.Uvarint()
	if n > uint64(len(r.rest)) {
		r.Fail()
		return 0
	}
	return int(n)
}

// Bytes returns the next length-prefixed bytes, aliasing the record.
func (r *Reader) Bytes() []byte {
	n := r.Count()
	b := r.rest[:n:n]
	r.rest = r.rest[n:]
	return b
}

// String returns the next length-prefixed string, copied.
func (r *Reader) String() string { return string(r.Bytes()) }

// Time returns the next time written by AppendTime, in UTC.
func (r *Reader) Time() time.Time {
	sec, nsec := r.Varint(), r.Uvarint()
	if nsec >= 1e9 {
		r.Fail()
		return time.Time{}
	}
	return time.Unix(sec, int64(nsec)).UTC() //nolint:gosec // below 1e9
}

// End fails the read when bytes are left over, and returns its error.
func (r *Reader) End() error {
	if r.err == nil && len(r.rest) > 0 {
		r.Fail()
	}
	return r.err
}
