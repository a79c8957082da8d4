package mailbox

import "testing"

// takeHanded serves deliveries without a store read only when they
// continue the stream exactly; anything else sends the reader to the store.
func TestTakeHanded_onlyAnExactContinuation(t *testing.T) {
	d := func(cursors ...uint64) []Delivery {
		var out []Delivery
		for _, c := range cursors {
			out = append(out, Delivery{Agent: "a", Cursor: c})
		}
		return out
	}
	tests := []struct {
		name     string
		handed   []Delivery
		overflow bool
		next     uint64
		want     []uint64 // nil: read the store
	}{
		{"continues", d(5, 6), false, 4, []uint64{5, 6}},
		{"already sent ones dropped", d(3, 4, 5), false, 4, []uint64{5}},
		{"all already sent", d(3, 4), false, 4, nil},
		{"a gap", d(6), false, 4, nil},
		{"out of order", d(6, 5), false, 4, nil},
		{"overflowed", d(5), true, 4, nil},
		{"nothing handed", nil, false, 4, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &Conn{handed: tt.handed, overflow: tt.overflow}
			ds, ok := c.takeHanded(tt.next)
			var got []uint64
			for _, x := range ds {
				got = append(got, x.Cursor)
			}
			if ok != (tt.want != nil) || len(got) != len(tt.want) {
				t.Fatalf("takeHanded(%d) = %v, %v; want %v", tt.next, got, ok, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Errorf("takeHanded(%d) = %v, want %v", tt.next, got, tt.want)
				}
			}
			if c.handed != nil || c.overflow {
				t.Errorf("after takeHanded: handed %v, overflow %v; want both cleared", c.handed, c.overflow)
			}
		})
	}
}

// A connection holds at most maxHanded deliveries; more mark it overflowed.
func TestOffer_boundedThenOverflow(t *testing.T) {
	c := &Conn{wake: make(chan struct{}, 1)}
	for i := range maxHanded + 1 {
		c.offer(Delivery{Cursor: uint64(i + 1)})
	}
	if len(c.handed) != maxHanded || !c.overflow {
		t.Errorf("after %d offers: %d handed, overflow %v; want %d and true", maxHanded+1, len(c.handed), c.overflow, maxHanded)
	}
	if len(c.wake) != 1 {
		t.Errorf("wakeups pending = %d, want 1", len(c.wake))
	}
}
