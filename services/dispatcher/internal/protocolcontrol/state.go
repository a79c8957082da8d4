package protocolcontrol

import (
	"encoding/binary"
	"encoding/json"
	"fmt"

	"github.com/parleyhq/parley/services/dispatcher/internal/binrec"
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
		v = binrec.AppendString(v, s)
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
		v = binrec.AppendString(v, d.Name)
		v = binrec.AppendTime(v, d.At)
		v = binary.AppendUvarint(v, uint64(len(d.Guards)))
		for _, g := range d.Guards {
			v = binrec.AppendString(v, g)
		}
		v = binrec.AppendString(v, d.SetBy)
	}
	return v
}

// decodePair reads a stored state (not empty: Inspect reads that as no
// state) in either form.
func decodePair(state []byte) (Pair, error) {
	var p Pair
	if state[0] == '{' {
		err := json.Unmarshal(state, &p)
		return p, err
	}
	if state[0] != pairFormat1 {
		return Pair{}, fmt.Errorf("unknown form %d", state[0])
	}
	r := binrec.NewReader(state[1:])
	p.InitiatorRole, p.CounterpartRole, p.State = r.String(), r.String(), r.String()
	p.Outcome, p.Expired = Outcome(r.String()), r.String()
	flags := r.Byte()
	p.Ended, p.Order = flags&flagEnded != 0, flags&flagOrder != 0
	n := r.Count()
	if n > 0 {
		p.Deadlines = make([]Deadline, n)
	}
	for i := range p.Deadlines {
		d := &p.Deadlines[i]
		d.Name = r.String()
		d.At = r.Time()
		if g := r.Count(); g > 0 {
			d.Guards = make([]string, g)
		}
		for j := range d.Guards {
			d.Guards[j] = r.String()
		}
		d.SetBy = r.String()
	}
	if err := r.End(); err != nil {
		return Pair{}, err
	}
	return p, nil
}
