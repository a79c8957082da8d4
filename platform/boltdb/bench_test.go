package boltdb

import (
	"encoding/binary"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// BenchmarkGroupCommit compares the two group-commit designs on the same
// disk in one run: bbolt's db.Batch (MaxBatchDelay 1ms, as the stores set
// it before this package) and the committer. Each op is one durable 128-byte
// put by one of N concurrent writers; ns/op is wall time per acknowledged
// write. Run: go test -run '^$' -bench GroupCommit -benchtime 3000x ./boltdb
func BenchmarkGroupCommit(b *testing.B) {
	value := make([]byte, 128)
	for _, writers := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("batch/writers=%d", writers), func(b *testing.B) {
			db, err := bolt.Open(filepath.Join(b.TempDir(), "b.db"), 0o600, &bolt.Options{Timeout: time.Second})
			if err != nil {
				b.Fatal(err)
			}
			defer db.Close()
			db.MaxBatchDelay = time.Millisecond
			if err := db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucket([]byte("b")); return err }); err != nil {
				b.Fatal(err)
			}
			var txs sync.Map // the distinct transactions: one per commit
			runWriters(b, writers, func(k []byte) error {
				return db.Batch(func(tx *bolt.Tx) error {
					txs.Store(tx, true)
					return tx.Bucket([]byte("b")).Put(k, value)
				})
			})
			commits := 0
			txs.Range(func(any, any) bool { commits++; return true })
			b.ReportMetric(float64(b.N)/float64(commits), "writes/commit")
		})
		b.Run(fmt.Sprintf("committer/writers=%d", writers), func(b *testing.B) {
			d, err := Open(filepath.Join(b.TempDir(), "c.db"), Options{Buckets: [][]byte{[]byte("b")}, SchemaVersion: 1, LockTimeout: time.Second})
			if err != nil {
				b.Fatal(err)
			}
			defer d.Close()
			before := d.Commits().Synced
			runWriters(b, writers, func(k []byte) error {
				return d.Update(func(tx *Tx) error { return tx.Bucket([]byte("b")).Put(k, value) })
			})
			b.ReportMetric(float64(b.N)/float64(d.Commits().Synced-before), "writes/commit")
		})
	}
}

// runWriters shares b.N writes among n goroutines, each writing unique keys.
func runWriters(b *testing.B, n int, write func(key []byte) error) {
	b.Helper()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, n)
	b.ResetTimer()
	for range n {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				if err := write(binary.BigEndian.AppendUint64(nil, uint64(i))); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
}

// BenchmarkJournal compares, on the same disk in one run, the committer
// with bbolt syncing every commit (two ordered fdatasyncs) and with the
// journal (one fdatasync of the commit's record; checkpoints in the
// background). Each op is one acknowledged write of five puts into a
// bucket of 20,000 keys, by one of N writers; syncs/op is fdatasyncs per
// write, both files counted. Run:
// go test -run '^$' -bench Journal -benchtime 3000x ./boltdb
func BenchmarkJournal(b *testing.B) {
	value := make([]byte, 300) // about a mailbox record
	for _, writers := range []int{1, 16} {
		for _, journal := range []bool{false, true} {
			name := "bbolt-syncs"
			var opts *JournalOptions
			if journal {
				name, opts = "journal", &JournalOptions{}
			}
			b.Run(fmt.Sprintf("%s/writers=%d", name, writers), func(b *testing.B) {
				d, err := Open(filepath.Join(b.TempDir(), "j.db"), Options{Buckets: [][]byte{[]byte("b")}, SchemaVersion: 1, LockTimeout: time.Second, Journal: opts})
				if err != nil {
					b.Fatal(err)
				}
				defer d.Close()
				for i := range 20 {
					if err := d.Update(func(tx *Tx) error {
						for k := range 1000 {
							if err := tx.Bucket([]byte("b")).Put(fmt.Appendf(nil, "%08d", i*1000+k), value); err != nil {
								return err
							}
						}
						return nil
					}); err != nil {
						b.Fatal(err)
					}
				}
				before := d.Commits()
				runWriters(b, writers, func(k []byte) error {
					return d.Update(func(tx *Tx) error {
						for i := range 5 {
							if err := tx.Bucket([]byte("b")).Put(append(k, byte(i)), value); err != nil {
								return err
							}
						}
						return nil
					})
				})
				after := d.Commits()
				b.ReportMetric(float64(after.Syncs-before.Syncs)/float64(b.N), "syncs/op")
			})
		}
	}
}
