package protocolcontrol

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// pairFormat1 starts a pair's state in the binary form that Check and
// Expire store: after it the strings InitiatorRole, CounterpartRole,
// State, Outcome and Expired; a byte of flags (1 Ended, 2 Order); the
// number of deadlines, and for each its Name, At (a varint of Unix seconds
// and a uvarint of nanoseconds), the number of its Guards and each, and
// SetBy. A string is a uvarint length and its bytes, a number a uvarint.
// A state stored before the binary form is JSON, which starts with '{';
// Inspect reads both. Decoding the JSON was about 5 µs of each deadline
// expiry's CPU, and every message checked decoded and encoded it.
const pairFormat1 = 1

const (
	flagEnded = 1 << iota
	flagOrder
)

// encodePair returns p's stored form.
func encodePair(p Pair) []byte {
	n := 1 + 5 + len(p.InitiatorRole) + len(p.CounterpartRole) + len(p.State) + len(p.Outcome) + len(p.Expired) + 2
	for _, d := range p.Deadlines {
		n += 4 + len(d.Name) + len(d.SetBy) + 2*binary.MaxVarintLen64
		for _, g := range d.Guards {
			n += 1 + len(g)
		}
	}
	v := append(make([]byte, 0, n), pairFormat1)
	for _, s := range []string{p.InitiatorRole, p.CounterpartRole, p.State, string(p.Outcome), p.Expired} {
		v = appendString(v, s)
	}
	var flags byte
	if p.Ended {
		flags |= flagEnded
	}
	if p.Order {
		flags |= flagOrder
	}
	v = append(v, flags)
	v = binary.AppendUvarint(v, uint64(len(p.Deadlines)))
	for _, d := range p.Deadlines {
		v = appendString(v, d.Name)
		v = binary.AppendVarint(v, d.At.Unix())
		v = binary.AppendUvarint(v, uint64(d.At.Nanosecond())) //nolint:gosec // 0 to 999,999,999
		v = binary.AppendUvarint(v, uint64(len(d.Guards)))
		for _, g := range d.Guards {
			v = appendString(v, g)
		}
		v = appendString(v, d.SetBy)
	}
	return v
}

func appendString(v []byte, s string) []byte {
	v = binary.AppendUvarint(v, uint64(len(s)))
	return append(v, s...)
}

// errCorrupt reports a binary state that ends early, runs on or holds an
// impossible value.
var errCorrupt = errors.New("truncated or corrupt")

// decodePair reads a stored state in either form.
func decodePair(state []byte) (Pair, error) {
	var p Pair
	if state[0] == '{' {
		err := json.Unmarshal(state, &p)
		return p, err
	}
	if state[0] != pairFormat1 {
		return Pair{}, fmt.Errorf("unknown form %d", state[0])
	}
	r := reader{rest: state[1:]}
	p.InitiatorRole, p.CounterpartRole, p.State = r.string(), r.string(), r.string()
	p.Outcome, p.Expired = Outcome(r.string()), r.string()
	flags := r.byte()
	p.Ended, p.Order = flags&flagEnded != 0, flags&flagOrder != 0
	n := r.count()
	if n > 0 {
		p.Deadlines = make([]Deadline, n)
	}
	for i := range p.Deadlines {
		d := &p.Deadlines[i]
		d.Name = r.string()
		sec, nsec := r.varint(), r.uvarint()
		if nsec >= 1e9 {
			r.fail()
		}
		d.At = time.Unix(sec, int64(nsec)).UTC() //nolint:gosec // below 1e9
		if g := r.count(); g > 0 {
			d.Guards = make([]string, g)
		}
		for j := range d.Guards {
			d.Guards[j] = r.string()
		}
		d.SetBy = r.string()
	}
	if err := r.end(); err != nil {
		return Pair{}, err
	}
	return p, nil
}

// reader reads a binary state front to back; the first failure sticks,
// and every read after it returns zero values.
type reader struct {
	rest []byte
	err  error
}

func (r *reader) fail() {
	if r.err == nil {
		r.err = errCorrupt
	}
	r.rest = nil
}

func (r *reader) byte() byte {
	if len(r.rest) < 1 {
		r.fail()
		return 0
	}
	b := r.rest[0]
	r.rest = r.rest[1:]
	return b
}

func (r *reader) uvarint() uint64 {
	u, w := binary.Uvarint(r.rest)
	if w <= 0 {
		r.fail()
		return 0
	}
	r.rest = r.rest[w:]
	return u
}

func (r *reader) varint() int64 {
	i, w := binary.Varint(r.rest)
	if w <= 0 {
		r.fail()
		return 0
	}
	r.rest = r.rest[w:]
	return i
}

// count reads a number of items that follow, each at least a byte long.
func (r *reader) count() int {
	n := r.uvarint()
	if n > uint64(len(r.rest)) {
		r.fail()
		return 0
	}
	return int(n)
}

func (r *reader) string() string {
	n := r.count()
	s := string(r.rest[:n])
	r.rest = r.rest[n:]
	return s
}

func (r *reader) end() error {
	if len(r.rest) > 0 {
		r.fail()
	}
	return r.err
}
