package main

import (
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
)

// ceiling is what the disk under the run allows one writer that waits for
// each write to be durable before the next, as a lone sender does: bare
// bbolt commits (the engine Parley's stores use: two ordered fdatasyncs per
// commit) and bare appends to a file each followed by one fdatasync (the
// floor of a one-sync log such as JetStream's with SyncAlways).
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
	db, err := bolt.Open(filepath.Join(dir, "ceiling.db"), 0o600, nil)
	if err != nil {
		return c, err
	}
	defer db.Close()
	bucket := []byte("messages")
	n := 0
	start := time.Now()
	for time.Since(start) < d {
		if err := db.Update(func(tx *bolt.Tx) error {
			b, err := tx.CreateBucketIfNotExists(bucket)
			if err != nil {
				return err
			}
			return b.Put([]byte(rand.Text()), value) // a random key, as a message id is
		}); err != nil {
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
