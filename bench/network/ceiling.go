package main

import (
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/parleyhq/parley/platform/boltdb"
)

// ceiling is what the disk under the run allows one writer that waits for
// each write to be durable before the next, as a lone sender does: bare
// bbolt commits, opened and committed through platform/boltdb as Parley's
// stores are (two ordered fdatasyncs per commit; a put into one bucket
// writes a few pages where a send writes some twenty), and bare appends
// to a file each followed by one fdatasync (the floor of a one-sync log
// such as JetStream's with SyncAlways). platform/boltdb, not bbolt itself:
// only it and the boltstores import bbolt (e2e/arch_bbolt_test.go).
type ceiling struct {
	boltCommits float64 // per second
	appendSyncs float64 // per second
}

// measureCeiling runs each loop for d in dir, which must be on the disk
// the measured engines write to.
func measureCeiling(dir string, d time.Duration) (ceiling, error) {
	var c ceiling
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return c, err
	}
	value := make([]byte, 300) // about a direct message's mailbox record
	bucket := []byte("messages")
	db, err := boltdb.Open(filepath.Join(dir, "ceiling.db"), boltdb.Options{Buckets: [][]byte{bucket}, SchemaVersion: 1})
	if err != nil {
		return c, err
	}
	defer db.Close()
	n := 0
	start := time.Now()
	for time.Since(start) < d {
		key := []byte(rand.Text()) // a random key, as a message id is
		if err := db.Update(func(tx *boltdb.Tx) error { return tx.Bucket(bucket).Put(key, value) }); err != nil {
			return c, fmt.Errorf("bbolt commit: %w", err)
		}
		n++
	}
	c.boltCommits = float64(n) / time.Since(start).Seconds()

	f, err := os.OpenFile(filepath.Join(dir, "ceiling.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return c, err
	}
	defer f.Close()
	n = 0
	start = time.Now()
	for time.Since(start) < d {
		if _, err := f.Write(value); err != nil {
			return c, err
		}
		if err := f.Sync(); err != nil { // fsync(2): JetStream's SyncAlways calls File.Sync too
			return c, err
		}
		n++
	}
	c.appendSyncs = float64(n) / time.Since(start).Seconds()
	return c, nil
}
