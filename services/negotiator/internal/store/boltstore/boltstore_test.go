package boltstore_test

import (
	"testing"
	"time"

	"github.com/parleyhq/parley/services/negotiator/internal/store"
	"github.com/parleyhq/parley/services/negotiator/internal/store/boltstore"
	"github.com/parleyhq/parley/services/negotiator/internal/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		s, err := boltstore.Open(t.TempDir(), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	})
}

func TestOpen_reopenKeepsLedger(t *testing.T) {
	dir := t.TempDir()
	s, err := boltstore.Open(dir, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.AppendLedgerEntry(t.Context(), nil, []string{"all"}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s, err = boltstore.Open(dir, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	tot, err := s.Totals(t.Context(), "all")
	if err != nil || tot.GetCalls() != 1 {
		t.Errorf("Totals after reopen = %v, %v; want 1 call", tot, err)
	}
}
