package boltdbtest_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/parleyhq/parley/platform/boltdb"
	"github.com/parleyhq/parley/platform/boltdb/boltdbtest"
)

// fakeT records failures instead of failing the test.
type fakeT struct {
	testing.TB
	failed bool
}

func (f *fakeT) Helper()               {}
func (f *fakeT) Errorf(string, ...any) { f.failed = true }
func (f *fakeT) Fatalf(string, ...any) { f.failed = true }
func (f *fakeT) Fatal(...any)          { f.failed = true }

func TestSyncedWrites(t *testing.T) {
	db, err := boltdb.Open(filepath.Join(t.TempDir(), "x.db"), boltdb.Options{Buckets: [][]byte{[]byte("b")}, SchemaVersion: 1, LockTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	put := func(tx *boltdb.Tx) error { return tx.Bucket([]byte("b")).Put([]byte("k"), []byte("v")) }
	ok := boltdbtest.Write{Name: "put", Do: func() error { return db.Update(put) }}
	read := boltdbtest.Write{Name: "a read", Do: func() error { return db.View(func(*boltdb.Tx) error { return nil }) }}

	f := &fakeT{TB: t}
	boltdbtest.SyncedWrites(f, db, []boltdbtest.Write{ok})
	if f.failed {
		t.Error("SyncedWrites failed a write that commits with fsync")
	}
	f = &fakeT{TB: t}
	boltdbtest.SyncedWrites(f, db, []boltdbtest.Write{read})
	if !f.failed {
		t.Error("SyncedWrites passed a 'write' that commits nothing")
	}
}
