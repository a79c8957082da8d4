package boltstore_test

import (
	"testing"
	"time"

	"github.com/parleyhq/parley/services/tasks/internal/store"
	"github.com/parleyhq/parley/services/tasks/internal/store/boltstore"
	"github.com/parleyhq/parley/services/tasks/internal/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		s, err := boltstore.Open(t.TempDir(), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

func TestOpen_reportsLockedFile(t *testing.T) {
	dir := t.TempDir()
	s, err := boltstore.Open(dir, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s2, err := boltstore.Open(dir, 50*time.Millisecond); err == nil {
		s2.Close()
		t.Errorf("Open(%q) while open = nil error, want locked", dir)
	}
}
