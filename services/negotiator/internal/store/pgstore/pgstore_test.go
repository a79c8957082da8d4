package pgstore_test

import (
	"testing"

	"github.com/parleyhq/parley/platform/pgdb/pgdbtest"
	"github.com/parleyhq/parley/services/negotiator/internal/store"
	"github.com/parleyhq/parley/services/negotiator/internal/store/pgstore"
	"github.com/parleyhq/parley/services/negotiator/internal/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		url, schema := pgdbtest.Schema(t)
		s, err := pgstore.Open(t.Context(), url, schema, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	})
}
