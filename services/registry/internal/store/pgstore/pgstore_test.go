package pgstore_test

import (
	"testing"

	"github.com/parleyhq/parley/platform/pgdb/pgdbtest"
	"github.com/parleyhq/parley/services/registry/internal/store"
	"github.com/parleyhq/parley/services/registry/internal/store/pgstore"
	"github.com/parleyhq/parley/services/registry/internal/store/storetest"
)

// open opens a store in a fresh schema.
func open(t *testing.T) *pgstore.Store {
	t.Helper()
	url, schema := pgdbtest.Schema(t)
	s, err := pgstore.Open(t.Context(), url, schema, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return open(t) })
}

// TestOutbox_keepsAtMostTheLimit appends past the outbox limit and checks
// that only the newest notifications remain, in order.
func TestOutbox_keepsAtMostTheLimit(t *testing.T) {
	s := open(t)
	storetest.OutboxLimit(t, s, s.SetOutboxLimit)
}
