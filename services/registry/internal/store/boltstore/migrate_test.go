package boltstore

import (
	"encoding/binary"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/boltdb"
)

// A schema-1 database (no index of the request ids by time) is migrated
// on open: the sweep then forgets the ids recorded before its time, and
// only those; a record too short to hold a time is due at once.
func TestOpen_migratesSchema1RequestSweepIndex(t *testing.T) {
	dir := t.TempDir()
	buckets := slices.DeleteFunc(slices.Clone(allBuckets), func(b []byte) bool { return string(b) == string(bucketSweepRequests) })
	old, err := boltdb.Open(filepath.Join(dir, FileName), boltdb.Options{Buckets: buckets, SchemaVersion: 1, LockTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	recorded := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	err = old.Update(func(tx *boltdb.Tx) error {
		b := tx.Bucket(bucketRequests)
		for i, id := range []string{"r-old", "r-new"} {
			data, err := proto.Marshal(&registryv1.Agent{Name: "clients/acme/agents/" + id})
			if err != nil {
				return err
			}
			at := recorded.Add(time.Duration(i) * time.Hour)
			if err := b.Put([]byte(id), append(binary.BigEndian.AppendUint64(nil, uint64(at.UnixNano())), data...)); err != nil {
				return err
			}
		}
		return b.Put([]byte("r-short"), []byte{1})
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	s, err := Open(dir, time.Second)
	if err != nil {
		t.Fatalf("Open(schema 1): %v", err)
	}
	defer s.Close()
	for _, want := range []int{2, 0} {
		if n, err := s.SweepRequests(t.Context(), recorded.Add(time.Minute), 10); err != nil || n != want {
			t.Errorf("SweepRequests after the migration = %d, %v; want %d (r-short, r-old)", n, err, want)
		}
	}
	if n, err := s.SweepRequests(t.Context(), recorded.Add(2*time.Hour), 10); err != nil || n != 1 {
		t.Errorf("SweepRequests(all) after the migration = %d, %v; want 1 (r-new)", n, err)
	}
}
