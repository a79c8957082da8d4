// Package boltstore is the dispatcher's embedded bbolt backend: one file,
// dispatcher.db, in the data directory.
package boltstore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// FileName is the database file inside the data directory.
const FileName = "dispatcher.db"

// Buckets, created by Open.
var (
	// bucketMeta holds schema_version.
	bucketMeta = []byte("meta")
)

const schemaVersion = 1

// Store is the bbolt-backed store.
type Store struct {
	db *bolt.DB
}

// Open opens (creating if needed) the database in dir. If another process
// holds the file, it fails after lockTimeout instead of waiting forever.
func Open(dir string, lockTimeout time.Duration) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("data directory %s is unusable: %w", dir, err)
	}
	path := filepath.Join(dir, FileName)
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: lockTimeout})
	if errors.Is(err, berrors.ErrTimeout) {
		return nil, fmt.Errorf("%s is locked by another process (is another parley using data directory %s?)", path, dir)
	}
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return err
		}
		if v := meta.Get([]byte("schema_version")); v != nil && string(v) != fmt.Sprint(schemaVersion) {
			return fmt.Errorf("schema version %s is not supported (want %d)", v, schemaVersion)
		}
		return meta.Put([]byte("schema_version"), []byte(fmt.Sprint(schemaVersion)))
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("initialise %s: %w", path, err)
	}
	return &Store{db: db}, nil
}

// Ping reports whether the database is open.
func (s *Store) Ping(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.View(func(*bolt.Tx) error { return nil })
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }
