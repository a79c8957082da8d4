package dialogue

import (
	"regexp"
	"testing"
	"time"
)

// TestNewID_neverReadsAsAFlag: ids are typed on command lines (parley reply
// MESSAGE_ID), where a leading "-" would be taken for a flag. With base64url
// about one id in 32 started with one.
func TestNewID_neverReadsAsAFlag(t *testing.T) {
	hex32 := regexp.MustCompile(`^[0-9a-f]{32}$`)
	seen := map[string]bool{}
	for range 2000 {
		id := NewID()
		if !hex32.MatchString(id) {
			t.Fatalf("NewID() = %q, want 32 lowercase hex digits", id)
		}
		if seen[id] {
			t.Fatalf("NewID() repeated %q", id)
		}
		seen[id] = true
	}
}

// Ids made in a later millisecond sort after earlier ones (so a store's
// B+trees keyed by id take new records at their right edge, not on a
// random page each), and the 80 bits after the time differ between ids of
// the same millisecond.
func TestNewIDAt_sortsByTimeAndStaysUnguessable(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	prev := newIDAt(t0)
	for i := 1; i < 1000; i++ {
		id := newIDAt(t0.Add(time.Duration(i) * time.Millisecond))
		if id <= prev {
			t.Fatalf("id at +%d ms %q sorts before or with the one a millisecond earlier %q", i, id, prev)
		}
		prev = id
	}
	a, b := newIDAt(t0), newIDAt(t0)
	if a[:12] != b[:12] || a[12:] == b[12:] {
		t.Errorf("two ids of one millisecond %q, %q: want the same 12-digit time and different random parts", a, b)
	}
}
