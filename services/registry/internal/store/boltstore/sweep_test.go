package boltstore

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/parleyhq/parley/platform/boltdb"
)

// The request-id sweep checks an index entry against its record: a
// request id recorded again later whose entry of the earlier time was
// left behind (by a bug, or a version that did not move it) is not
// forgotten early by that entry. A sweep between the two times keeps the
// record, drops the stale entry and keeps the record's own; an entry
// naming no record goes and counts.
func TestSweepRequests_checksTheRecordsOwnTime(t *testing.T) {
	s, err := Open(t.TempDir(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	old := time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)
	cut, now := old.Add(time.Hour), old.Add(2*time.Hour)
	at := func(t time.Time) []byte { return binary.BigEndian.AppendUint64(nil, uint64(t.UnixNano())) } //nolint:gosec // after 1970
	// A time, then an agent (an empty name field).
	record := append(at(now), 0x0a, 0)
	own, stale := append(at(now), "r"...), append(at(old), "r"...)
	gone := append(at(old), "gone"...)
	if err := s.db.Update(func(tx *boltdb.Tx) error {
		for _, k := range [][]byte{own, stale, gone} {
			if err := tx.Bucket(bucketSweepRequests).Put(k, nil); err != nil {
				return err
			}
		}
		return tx.Bucket(bucketRequests).Put([]byte("r"), record)
	}); err != nil {
		t.Fatal(err)
	}
	if n, err := s.SweepRequests(t.Context(), cut, 10); err != nil || n != 2 {
		t.Errorf("SweepRequests(between) = %d, %v; want 2 (both stale entries consumed)", n, err)
	}
	if err := s.db.View(func(tx *boltdb.Tx) error {
		if tx.Bucket(bucketRequests).Get([]byte("r")) == nil {
			t.Error("request id r forgotten by an entry of an earlier time than its record's")
		}
		sweep := tx.Bucket(bucketSweepRequests)
		if sweep.Get(stale) != nil || sweep.Get(gone) != nil {
			t.Error("stale index entries kept, want them dropped")
		}
		if sweep.Get(own) == nil {
			t.Error("the record's own index entry missing after the sweep")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
