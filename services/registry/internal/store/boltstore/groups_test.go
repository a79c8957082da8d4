package boltstore_test

import (
	"testing"
	"time"

	"github.com/parleyhq/parley/services/registry/internal/store/boltstore"
	"github.com/parleyhq/parley/services/registry/internal/store/storetest"
)

// TestOutbox_keepsAtMostTheLimit appends past the outbox limit and checks
// that only the newest notifications remain, in order.
func TestOutbox_keepsAtMostTheLimit(t *testing.T) {
	s, err := boltstore.Open(t.TempDir(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	storetest.OutboxLimit(t, s, s.SetOutboxLimit)
}
