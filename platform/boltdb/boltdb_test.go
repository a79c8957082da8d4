package boltdb

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

var bucketThings = []byte("things")

func open(t *testing.T, path string, opts Options) *DB {
	t.Helper()
	if opts.SchemaVersion == 0 {
		opts.SchemaVersion = 1
	}
	if opts.Buckets == nil {
		opts.Buckets = [][]byte{bucketThings}
	}
	opts.LockTimeout = time.Second
	d, err := Open(path, opts)
	if err != nil {
		t.Fatalf("Open(%s) = %v", path, err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func get(t *testing.T, d *DB, bucket []byte, key string) string {
	t.Helper()
	var v []byte
	if err := d.View(func(tx *Tx) error {
		v = append(v, tx.Bucket(bucket).Get([]byte(key))...)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return string(v)
}

func put(key, value string) func(*Tx) error {
	return func(tx *Tx) error { return tx.Bucket(bucketThings).Put([]byte(key), []byte(value)) }
}

func TestOpen_createsDirectoryBucketsAndVersion(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a", "b", "x.db")
	d := open(t, path, Options{SchemaVersion: 3})
	if err := d.Update(put("k", "v")); err != nil {
		t.Fatalf("Update = %v", err)
	}
	if got := get(t, d, bucketMeta, "schema_version"); got != "3" {
		t.Errorf("schema_version = %q, want %q", got, "3")
	}
	d.Close()
	d = open(t, path, Options{SchemaVersion: 3})
	if got := get(t, d, bucketThings, "k"); got != "v" {
		t.Errorf("after reopen, k = %q, want %q", got, "v")
	}
}

func TestOpen_schemaVersions(t *testing.T) {
	errRefused := errors.New("refused")
	tests := []struct {
		name    string
		stored  string
		migrate func(tx *Tx, from int) error
		wantErr string // empty: opens and records version 2
	}{
		{name: "same", stored: "2"},
		{name: "older, migrated", stored: "1", migrate: func(tx *Tx, from int) error {
			if from != 1 {
				return errors.New("wrong from")
			}
			return tx.Bucket(bucketThings).Put([]byte("migrated"), []byte("yes"))
		}},
		{name: "older, no migration", stored: "1", wantErr: "schema version 1 is not supported (want 2)"},
		{name: "older, migration refuses", stored: "1", migrate: func(*Tx, int) error { return errRefused }, wantErr: "refused"},
		{name: "newer", stored: "3", wantErr: "schema version 3 is not supported (want 2)"},
		{name: "garbage", stored: "two", wantErr: `schema version "two" is not a version`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "x.db")
			d := open(t, path, Options{})
			if err := d.Update(func(tx *Tx) error { return tx.Bucket(bucketMeta).Put(keySchemaVersion, []byte(tt.stored)) }); err != nil {
				t.Fatal(err)
			}
			d.Close()
			d, err := Open(path, Options{Buckets: [][]byte{bucketThings}, SchemaVersion: 2, Migrate: tt.migrate, LockTimeout: time.Second})
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Open(stored %s) = %v, want an error containing %q", tt.stored, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Open(stored %s) = %v", tt.stored, err)
			}
			defer d.Close()
			if got := get(t, d, bucketMeta, "schema_version"); got != "2" {
				t.Errorf("schema_version = %q, want 2", got)
			}
			if tt.migrate != nil && get(t, d, bucketThings, "migrated") != "yes" {
				t.Errorf("Migrate's write is missing")
			}
		})
	}
}

func TestOpen_refusesALockedFileAfterLockTimeout(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.db")
	open(t, path, Options{})
	// bbolt's flock is per open file, so a second Open in this process
	// waits like another process would.
	_, err := Open(path, Options{SchemaVersion: 1, LockTimeout: 50 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "locked by another process") {
		t.Fatalf("second Open(%s) = %v, want a 'locked by another process' error", path, err)
	}
}

func TestUpdate_failingWriteLeavesNothingAndSparesTheGroup(t *testing.T) {
	d := open(t, filepath.Join(t.TempDir(), "x.db"), Options{})
	errBad := errors.New("bad write")
	var wg sync.WaitGroup
	errs := make([]error, 40)
	for i := range errs {
		wg.Go(func() {
			key := string(rune('A' + i))
			errs[i] = d.Update(func(tx *Tx) error {
				if err := put(key, "v")(tx); err != nil {
					return err
				}
				if i%4 == 0 {
					return errBad // after a put: it must be rolled back
				}
				return nil
			})
		})
	}
	wg.Wait()
	for i, err := range errs {
		key := string(rune('A' + i))
		got := get(t, d, bucketThings, key)
		if i%4 == 0 {
			if !errors.Is(err, errBad) || got != "" {
				t.Errorf("failing write %s: Update = %v, stored %q; want %v and nothing stored", key, err, got, errBad)
			}
			continue
		}
		if err != nil || got != "v" {
			t.Errorf("write %s: Update = %v, stored %q; want nil and %q", key, err, got, "v")
		}
	}
}

// A commit that fails must reach every writer in its group as an error, and
// what they wrote must not be visible. The failure is a real one: the
// database file is closed under bbolt, so its page writes fail as a dying
// disk's would (reads go through the mmap and still work).
func TestUpdate_failedCommitReachesTheWriter(t *testing.T) {
	var file *os.File
	d, err := Open(filepath.Join(t.TempDir(), "x.db"), Options{
		Buckets: [][]byte{bucketThings}, SchemaVersion: 1, LockTimeout: time.Second,
		openFile: func(name string, flag int, perm os.FileMode) (*os.File, error) {
			f, err := os.OpenFile(name, flag, perm)
			file = f
			return f, err
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.Update(put("before", "v")); err != nil {
		t.Fatalf("Update on a healthy file = %v", err)
	}
	before := d.Commits()
	if err := file.Close(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Go(func() { errs[i] = d.Update(put(string(rune('a'+i)), "v")) })
	}
	wg.Wait()
	for i, err := range errs {
		if !errors.Is(err, os.ErrClosed) {
			t.Errorf("Update #%d over a failing commit = %v, want %v", i, err, os.ErrClosed)
		}
		if got := get(t, d, bucketThings, string(rune('a'+i))); got != "" {
			t.Errorf("write #%d is visible after its commit failed: %q", i, got)
		}
	}
	if after := d.Commits(); after != before {
		t.Errorf("Commits() went %+v -> %+v over failed commits, want no change", before, after)
	}
}

func TestUpdate_returnsOnlyAfterASyncedCommit(t *testing.T) {
	d := open(t, filepath.Join(t.TempDir(), "x.db"), Options{})
	if err := d.Durable(); err != nil {
		t.Fatalf("Durable() = %v", err)
	}
	for i := range 5 {
		before := d.Commits()
		if err := d.Update(put("k", "v")); err != nil {
			t.Fatal(err)
		}
		after := d.Commits()
		if after.Synced <= before.Synced || after.Unsynced != 0 {
			t.Fatalf("write %d: Commits() went %+v -> %+v, want one more synced and no unsynced", i, before, after)
		}
	}
}

// The seam must see NoSync, or the stores' durability tests prove nothing.
func TestCommits_seesNoSync(t *testing.T) {
	d := open(t, filepath.Join(t.TempDir(), "x.db"), Options{})
	d.db.NoSync = true
	if err := d.Durable(); err == nil {
		t.Errorf("Durable() on a NoSync DB = nil, want an error")
	}
	if err := d.Update(put("k", "v")); err != nil {
		t.Fatal(err)
	}
	if c := d.Commits(); c.Unsynced != 1 || c.Synced != 0 {
		t.Errorf("Commits() after a NoSync write = %+v, want {Synced:0 Unsynced:1}", c)
	}
}

func TestUpdate_afterCloseFails(t *testing.T) {
	d := open(t, filepath.Join(t.TempDir(), "x.db"), Options{})
	d.Close()
	if err := d.Update(put("k", "v")); !errors.Is(err, ErrClosed) {
		t.Errorf("Update after Close = %v, want %v", err, ErrClosed)
	}
}

// holdCommitter blocks the committer inside a write until release is
// closed, so that the test can line up the next group.
func holdCommitter(t *testing.T, d *DB) (release func(), done <-chan error) {
	t.Helper()
	entered, hold := make(chan struct{}), make(chan struct{})
	errc := make(chan error, 1)
	var once sync.Once
	go func() {
		errc <- d.Update(func(tx *Tx) error {
			once.Do(func() { close(entered) })
			<-hold
			return put("held", "v")(tx)
		})
	}()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the committer did not start the holding write within 10s")
	}
	return func() { close(hold) }, errc
}

// waitQueued waits until n writes wait in the committer's queue.
func waitQueued(t *testing.T, d *DB, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for len(d.commit.ops) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d writes queued after 10s, want %d", len(d.commit.ops), n)
		}
		time.Sleep(time.Millisecond) // polling the queue
	}
}

func TestUpdate_writesQueuedDuringACommitShareTheNext(t *testing.T) {
	d := open(t, filepath.Join(t.TempDir(), "x.db"), Options{})
	release, held := holdCommitter(t, d)
	const n = 10
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { errs[i] = d.Update(put(string(rune('a'+i)), "v")) })
	}
	waitQueued(t, d, n)
	before := d.Commits()
	release()
	wg.Wait()
	if err := <-held; err != nil {
		t.Fatalf("holding write: %v", err)
	}
	for i, err := range errs {
		if err != nil {
			t.Errorf("queued write %d: %v", i, err)
		}
	}
	if got := d.Commits().Synced - before.Synced; got != 2 {
		t.Errorf("%d queued writes took %d commits after the held one began, want 2 (it and one group)", n, got)
	}
}

// The failing write is the first of its group; the others still commit.
func TestUpdate_failingFirstWriteOfAGroupSparesTheRest(t *testing.T) {
	d := open(t, filepath.Join(t.TempDir(), "x.db"), Options{})
	release, held := holdCommitter(t, d)
	errBad := errors.New("bad write")
	bad := make(chan error, 1)
	go func() {
		bad <- d.Update(func(tx *Tx) error {
			if err := put("bad", "v")(tx); err != nil {
				return err
			}
			return errBad
		})
	}()
	waitQueued(t, d, 1)
	var wg sync.WaitGroup
	errs := make([]error, 5)
	for i := range errs {
		wg.Go(func() { errs[i] = d.Update(put(string(rune('a'+i)), "v")) })
	}
	waitQueued(t, d, 1+len(errs))
	release()
	wg.Wait()
	if err := <-held; err != nil {
		t.Errorf("holding write = %v, want nil", err)
	}
	if err := <-bad; !errors.Is(err, errBad) {
		t.Errorf("failing write = %v, want %v", err, errBad)
	}
	if got := get(t, d, bucketThings, "bad"); got != "" {
		t.Errorf("the failing write's put is visible: %q", got)
	}
	for i, err := range errs {
		if got := get(t, d, bucketThings, string(rune('a'+i))); err != nil || got != "v" {
			t.Errorf("write %d after a failing one: Update = %v, stored %q; want nil and %q", i, err, got, "v")
		}
	}
}

func TestUpdate_loneFailingWriteCommitsNothing(t *testing.T) {
	d := open(t, filepath.Join(t.TempDir(), "x.db"), Options{})
	before := d.Commits()
	errBad := errors.New("bad write")
	if err := d.Update(func(*Tx) error { return errBad }); !errors.Is(err, errBad) {
		t.Fatalf("Update = %v, want %v", err, errBad)
	}
	// A good write next: the committer handles one group at a time, so
	// anything the failing write had set off has committed by its return.
	if err := d.Update(put("k", "v")); err != nil {
		t.Fatal(err)
	}
	if after := d.Commits(); after.Synced != before.Synced+1 {
		t.Errorf("Commits() went %+v -> %+v for a failing write then a good one, want one commit", before, after)
	}
}

// TestUpdate_panickingWriteFailsAloneAndTheDatabaseGoesOn: a write
// function that panics runs on the committer's goroutine, where no caller
// can recover it; it must come back as that writer's error, write nothing,
// and leave the committer serving later writes.
func TestUpdate_panickingWriteFailsAloneAndTheDatabaseGoesOn(t *testing.T) {
	d := open(t, filepath.Join(t.TempDir(), "x.db"), Options{})
	err := d.Update(func(tx *Tx) error {
		if err := put("half", "done")(tx); err != nil {
			return err
		}
		panic("a bug in a store function")
	})
	if !errors.Is(err, ErrPanicked) || !strings.Contains(err.Error(), "a bug in a store function") {
		t.Fatalf("Update = %v, want ErrPanicked naming the panic", err)
	}
	if err := d.Update(put("k", "v")); err != nil {
		t.Fatalf("Update after a panicking write = %v", err)
	}
	if got := get(t, d, bucketThings, "half"); got != "" {
		t.Errorf("the panicking write left half = %q", got)
	}
	if got := get(t, d, bucketThings, "k"); got != "v" {
		t.Errorf("k = %q, want v", got)
	}
}

// Ping answers while the file is open, and fails once it is closed or the
// caller has given up: the readiness check every boltstore serves.
func TestPing(t *testing.T) {
	d, err := Open(filepath.Join(t.TempDir(), "x.db"), Options{SchemaVersion: 1, Buckets: [][]byte{bucketThings}, LockTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Ping(t.Context()); err != nil {
		t.Errorf("Ping on an open database = %v", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := d.Ping(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Ping with a cancelled context = %v, want context.Canceled", err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if err := d.Ping(t.Context()); err == nil {
		t.Error("Ping on a closed database = nil, want an error")
	}
}

// Commits().Pages counts what a commit wrote: a put into a small bucket
// (kept inline in the root) dirties the root page, and every commit
// writes the meta page too. A write that fails writes nothing.
func TestCommits_countsThePagesWritten(t *testing.T) {
	d := open(t, filepath.Join(t.TempDir(), "x.db"), Options{})
	before := d.Commits()
	if err := d.Update(put("k", "v")); err != nil {
		t.Fatal(err)
	}
	after := d.Commits()
	if got := after.Pages - before.Pages; got < 2 {
		t.Errorf("a put wrote %d pages, want at least the root page and the meta page", got)
	}
	before = after
	if err := d.Update(func(*Tx) error { return errors.New("refused") }); err == nil {
		t.Fatal("a failing write succeeded")
	}
	if after := d.Commits(); after.Pages != before.Pages {
		t.Errorf("a failed write moved Pages %d -> %d, want no change", before.Pages, after.Pages)
	}
}

// A commit writes no freelist: bbolt rebuilds it from the tree when the
// file is opened, so a put into a small bucket writes the root page and
// the meta page, nothing more.
func TestUpdate_writesNoFreelistPage(t *testing.T) {
	d := open(t, filepath.Join(t.TempDir(), "x.db"), Options{})
	before := d.Commits()
	if err := d.Update(put("k", "v")); err != nil {
		t.Fatal(err)
	}
	if got := d.Commits().Pages - before.Pages; got != 2 {
		t.Errorf("a put into an inline bucket wrote %d pages, want 2 (the root and the meta page)", got)
	}
}

// Pages freed before a close are free again after it: the freelist the
// commits no longer write is rebuilt on open, so the file does not grow
// by what was deleted, and every key kept survives.
func TestOpen_rebuildsTheFreelist(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.db")
	d := open(t, path, Options{})
	big := strings.Repeat("x", 1000)
	fill := func(round int) {
		t.Helper()
		for i := range 400 {
			if err := d.Update(put(fmt.Sprintf("r%d-%04d", round, i), big)); err != nil {
				t.Fatal(err)
			}
		}
	}
	fill(0)
	if err := d.Update(func(tx *Tx) error {
		b := tx.Bucket(bucketThings)
		for i := range 400 {
			if err := b.Delete(fmt.Appendf(nil, "r0-%04d", i)); err != nil {
				return err
			}
		}
		return b.Put([]byte("kept"), []byte("yes"))
	}); err != nil {
		t.Fatal(err)
	}
	d.Close()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	d = open(t, path, Options{})
	if got := get(t, d, bucketThings, "kept"); got != "yes" {
		t.Fatalf("after reopen, kept = %q, want %q", got, "yes")
	}
	fill(1)
	d.Close()
	st2, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st2.Size() > st.Size() {
		t.Errorf("refilling what was deleted grew the file %d -> %d bytes; want the freed pages reused", st.Size(), st2.Size())
	}
}

// A file written by a release that synced the freelist opens, and a file
// written now opens in bbolt's default mode (an older release): each
// side reads the other's commits.
func TestOpen_freelistModesInterchange(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.db")
	old, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := old.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(bucketThings)
		if err != nil {
			return err
		}
		return b.Put([]byte("old"), []byte("1"))
	}); err != nil {
		t.Fatal(err)
	}
	old.Close()
	d := open(t, path, Options{})
	if err := d.Update(put("new", "2")); err != nil {
		t.Fatal(err)
	}
	d.Close()
	old, err = bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if err := old.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketThings)
		if string(b.Get([]byte("old"))) != "1" || string(b.Get([]byte("new"))) != "2" {
			t.Errorf("reopened by default bbolt: old=%q new=%q, want 1 and 2", b.Get([]byte("old")), b.Get([]byte("new")))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
