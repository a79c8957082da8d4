package dialogue

import (
	"regexp"
	"testing"
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
