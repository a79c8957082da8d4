package boltstore_test

import (
	"testing"
	"time"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/services/registry/internal/store"
	"github.com/parleyhq/parley/services/registry/internal/store/boltstore"
)

// TestOutbox_keepsAtMostTheLimit appends past the outbox limit and checks
// that only the newest notifications remain, in order.
func TestOutbox_keepsAtMostTheLimit(t *testing.T) {
	s, err := boltstore.Open(t.TempDir(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	s.SetOutboxLimit(3)
	for range 7 {
		if err := s.UpdateGroups(t.Context(), func(w store.GroupWriter) error {
			return w.Notify(&registryv1.Notification{Type: "followed"})
		}); err != nil {
			t.Fatal(err)
		}
	}
	notes, first, err := s.ListNotifications(t.Context(), 0, 10)
	if err != nil || len(notes) != 3 || first != 5 || notes[0].GetSequence() != 5 || notes[2].GetSequence() != 7 {
		t.Errorf("ListNotifications after 7 appends with limit 3 = %v, first %d, %v; want sequences 5 to 7", notes, first, err)
	}
}
