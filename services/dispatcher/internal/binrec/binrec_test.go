package binrec

import (
	"encoding/binary"
	"errors"
	"testing"
	"time"
)

func TestRecord_roundTrip(t *testing.T) {
	at := time.Date(2026, 12, 2, 11, 45, 0, 123456789, time.UTC)
	v := AppendString(nil, "dialogue")
	v = AppendBytes(v, []byte(`{"a":1}`))
	v = AppendString(v, "")
	v = AppendTime(v, at)
	v = binary.BigEndian.AppendUint64(v, 42)
	v = append(v, 7)
	r := NewReader(v)
	s, b, empty, when, u, c := r.String(), r.Bytes(), r.String(), r.Time(), r.Uint64(), r.Byte()
	if err := r.End(); err != nil {
		t.Fatalf("End() = %v", err)
	}
	if s != "dialogue" || string(b) != `{"a":1}` || empty != "" || !when.Equal(at) || when.Location() != time.UTC || u != 42 || c != 7 {
		t.Errorf("read %q %q %q %v %d %d, want what was written", s, b, empty, when, u, c)
	}
}

// Every way a record can be wrong fails the read with ErrCorrupt, and
// reads after the failure return zero values instead of panicking.
func TestReader_corruptRecords(t *testing.T) {
	good := AppendTime(AppendString(nil, "abc"), time.Unix(5, 6))
	for name, v := range map[string][]byte{
		"empty":             nil,
		"truncated string":  good[:2],
		"truncated time":    good[:len(good)-1],
		"length past end":   {0x7f, 'a'},
		"overlong":          append(append([]byte{}, good...), 0),
		"nanoseconds ≥ 1e9": binary.AppendUvarint(binary.AppendVarint(AppendString(nil, "abc"), 1), 1e9),
		"bad uvarint":       {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
	} {
		t.Run(name, func(t *testing.T) {
			r := NewReader(v)
			_, _ = r.String(), r.Time()
			if s, n := r.String(), r.Uint64(); s != "" || n != 0 {
				t.Errorf("reads after a failure = %q, %d; want zero values", s, n)
			}
			if err := r.End(); !errors.Is(err, ErrCorrupt) {
				t.Errorf("End() = %v, want ErrCorrupt", err)
			}
		})
	}
}
