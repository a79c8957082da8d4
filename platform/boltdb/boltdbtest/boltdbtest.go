// Package boltdbtest is test support for the stores built on
// platform/boltdb: the durability check each boltstore runs on its writes.
package boltdbtest

import (
	"testing"

	"github.com/parleyhq/parley/platform/boltdb"
)

// Write is one acknowledged write of a store, named for messages.
type Write struct {
	Name string
	Do   func() error
}

// SyncedWrites checks that every write returns only after a commit that
// bbolt fsynced. A kill -9 test cannot see a missing fsync (the page cache
// outlives the process), so this checks the two things durability rests
// on: db is opened with every sync on (bbolt's Tx.Commit then fsyncs the
// data and the meta page before returning), and each write, run in order,
// returns only after a read-write transaction holding it committed with
// that fsync (db.Commits counts them), with no unsynced commit.
func SyncedWrites(t testing.TB, db *boltdb.DB, writes []Write) {
	t.Helper()
	if err := db.Durable(); err != nil {
		t.Fatal(err)
	}
	for _, w := range writes {
		before := db.Commits()
		if err := w.Do(); err != nil {
			t.Fatalf("%s: %v", w.Name, err)
		}
		if after := db.Commits(); after.Synced == before.Synced || after.Unsynced != 0 {
			t.Errorf("%s: commits went %+v -> %+v; want it to return after a synced commit, and no unsynced one", w.Name, before, after)
		}
	}
}
