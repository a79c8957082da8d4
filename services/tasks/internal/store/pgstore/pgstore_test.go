package pgstore_test

import (
	"testing"

	"github.com/parleyhq/parley/platform/pgdb/pgdbtest"
	"github.com/parleyhq/parley/services/tasks/internal/store"
	"github.com/parleyhq/parley/services/tasks/internal/store/pgstore"
	"github.com/parleyhq/parley/services/tasks/internal/store/storetest"
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

func TestBlobsConformance(t *testing.T) {
	storetest.RunBlobs(t, func(t *testing.T) store.Blobs { return open(t).Blobs() })
}
