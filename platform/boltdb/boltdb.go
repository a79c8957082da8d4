// Package boltdb is the one way Parley opens a bbolt database: it creates the
// data directory and the buckets, checks and migrates the schema version, and
// sends every write through one group committer (commit.go), so concurrent
// writers share an fsync and each returns only once its write is on disk:
// through bbolt's own fsyncs, or with Options.Journal through a write-ahead
// journal beside the file (journal.go, ADR 0008). Stores reach bbolt only
// through Tx, Bucket and Cursor (tx.go), which can record a write
// transaction's changes for replay (record.go).
//
// Each service keeps its own buckets, keys and migrations in its boltstore;
// this package knows none of them. Together with the boltstores it is the only
// code that imports go.etcd.io/bbolt (e2e/arch_bbolt_test.go checks that).
//
// The schema version lives in bucket "meta", key "schema_version", as a
// decimal string. A new database gets Options.SchemaVersion; an older one is
// handed to Options.Migrate; a newer one is refused.
package boltdb

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

var (
	bucketMeta       = []byte("meta")
	keySchemaVersion = []byte("schema_version")
)

// Options says what a store needs from its database.
type Options struct {
	// Buckets are created when missing. The "meta" bucket is this package's
	// and is always created.
	Buckets [][]byte
	// SchemaVersion is the version the store writes (1 or more).
	SchemaVersion int
	// Migrate upgrades a database written at version from (from <
	// SchemaVersion) inside the opening transaction; Open then records
	// SchemaVersion. An error refuses the database and says why. Nil means
	// no older version can be upgraded.
	Migrate func(tx *Tx, from int) error
	// LockTimeout bounds the wait for a file that another process holds
	// open; zero waits forever.
	LockTimeout time.Duration

	// Journal, when set, makes commits durable through a write-ahead
	// journal (journal.go, ADR 0008) in the file at the database's path
	// plus JournalSuffix: one fdatasync of a short append per commit
	// instead of bbolt's two ordered ones of the changed pages. The journal
	// is part of the database: a copy or a backup needs both files, and a
	// database whose journal is lost after a crash may lose acknowledged
	// writes. 64-bit platforms only.
	Journal *JournalOptions

	// openFile replaces os.OpenFile: tests keep the file to make its
	// writes fail.
	openFile func(string, int, os.FileMode) (*os.File, error)
}

// DB is an open database. Reads use View, writes Update.
type DB struct {
	db     *bolt.DB
	commit *committer
	// synced and unsynced count committed write transactions by whether
	// bbolt fsynced them (see Commits).
	synced, unsynced atomic.Uint64
	// pages counts the pages synced commits wrote (see CommitStats.Pages).
	pages atomic.Uint64
	// record makes every write transaction record its changes (record.go)
	// for afterCommit. Off unless the journal (ADR 0008) turns it on; set
	// before the first Update.
	record bool
	// journal is the write-ahead journal, or nil (Options.Journal).
	journal *journal
	// lastPages is the pages the last commit wrote (committer goroutine
	// only).
	lastPages int64
	// syncs counts bbolt's fdatasyncs (two per synced commit); the
	// journal counts its own.
	syncs atomic.Uint64
	// closed is set by the first Close (with the journal: a second one
	// must not checkpoint a closed file).
	closed atomic.Bool
}

// Open opens, creating if needed, the database file at path and its
// directory. A write acknowledged by Update is on disk: bbolt syncs each
// commit, or, with Options.Journal, bbolt commits with NoSync and the
// journal syncs the commit's record (it never sets NoGrowSync or
// MmapFlags). It sets NoFreelistSync, which leaves the freelist out of
// commits (rebuilt on open), not any data. With the journal, Open first
// brings the file back to the journal's last checkpoint and replays the
// commits journaled after it.
func Open(path string, opts Options) (*DB, error) {
	if opts.SchemaVersion < 1 {
		return nil, fmt.Errorf("open %s: schema version %d is not positive", path, opts.SchemaVersion)
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("data directory %s is unusable: %w", dir, err)
	}
	bopts := &bolt.Options{
		Timeout:  opts.LockTimeout,
		OpenFile: opts.openFile,
		// A commit writes the freelist (one page or more, the whole list)
		// unless told not to; without it bbolt rebuilds the list by walking
		// the tree when it opens the file, which a crash cannot make wrong
		// (it reads only committed pages). Fewer pages for the first
		// fdatasync of every commit, a slower open of a large file. The
		// map form finds free runs without scanning an array.
		NoFreelistSync: true,
		FreelistType:   bolt.FreelistMapType,
	}
	if opts.Journal == nil {
		if err := leaveJournal(path, opts); err != nil {
			return nil, err
		}
	}
	var j *journal
	if opts.Journal != nil {
		var err error
		if j, err = openJournal(path, *opts.Journal, opts.LockTimeout); err != nil {
			return nil, err
		}
		bopts.NoSync, bopts.InitialMmapSize = true, j.mapSize
	}
	db, err := bolt.Open(path, 0o600, bopts)
	if err != nil {
		if j != nil {
			j.abandon()
		}
		if errors.Is(err, berrors.ErrTimeout) {
			return nil, fmt.Errorf("%s is locked by another process (is another parley using data directory %s?)", path, dir)
		}
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	// fail closes what Open opened and says which step failed.
	fail := func(step string, err error) (*DB, error) {
		if j != nil {
			j.abandon()
		}
		db.Close()
		return nil, fmt.Errorf("%s %s: %w", step, path, err)
	}
	if j != nil {
		if err := j.start(db); err != nil {
			return fail("open", err)
		}
	}
	if err := db.Update(func(tx *bolt.Tx) error { return initialise(&Tx{tx: tx}, opts) }); err != nil {
		return fail("initialise", err)
	}
	if j != nil {
		// The restored checkpoint, the replayed commits and initialise's
		// changes become the journal's first checkpoint.
		if err := j.checkpointNow(db, flagActive); err != nil {
			return fail("open", err)
		}
	}
	d := &DB{db: db, record: recordByDefault || j != nil, journal: j}
	d.commit = newCommitter(d)
	return d, nil
}

// leaveJournal readies a database that a run with the journal may have
// left for a run without it: if the journal file is there, the database is
// opened once through it (which restores and replays what it holds, and
// closes with an inactive checkpoint), and the journal is removed, so that
// no later run restores meta pages naming a tree this run overwrites.
func leaveJournal(path string, opts Options) error {
	jpath := path + JournalSuffix
	if _, err := os.Stat(jpath); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	opts.Journal = &JournalOptions{}
	d, err := Open(path, opts)
	if err != nil {
		return fmt.Errorf("open %s through its journal before opening it without: %w", path, err)
	}
	if err := d.Close(); err != nil {
		return fmt.Errorf("close %s after recovering it through its journal: %w", path, err)
	}
	if err := os.Remove(jpath); err != nil {
		return fmt.Errorf("remove %s: %w", jpath, err)
	}
	return syncDir(filepath.Dir(path), (*os.File).Sync)
}

// syncDir makes a removal or creation in dir durable with sync (File.Sync,
// or the journal's test hook).
func syncDir(dir string, sync func(*os.File) error) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := sync(f); err != nil {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	return nil
}

// initialise creates the buckets and brings the schema to opts.SchemaVersion.
// Its changes are not recorded: they come before any journal.
func initialise(tx *Tx, opts Options) error {
	for _, b := range append([][]byte{bucketMeta}, opts.Buckets...) {
		if _, err := tx.CreateBucketIfNotExists(b); err != nil {
			return fmt.Errorf("bucket %s: %w", b, err)
		}
	}
	meta := tx.Bucket(bucketMeta)
	want := []byte(strconv.Itoa(opts.SchemaVersion))
	if v := meta.Get(keySchemaVersion); v != nil {
		from, err := strconv.Atoi(string(v))
		switch {
		case err != nil || from < 1:
			return fmt.Errorf("schema version %q is not a version", v)
		case from > opts.SchemaVersion:
			return fmt.Errorf("schema version %d is not supported (want %d); was it written by a newer release?", from, opts.SchemaVersion)
		case from < opts.SchemaVersion && opts.Migrate == nil:
			return fmt.Errorf("schema version %d is not supported (want %d)", from, opts.SchemaVersion)
		case from < opts.SchemaVersion:
			if err := opts.Migrate(tx, from); err != nil {
				return fmt.Errorf("migrate schema version %d to %d: %w", from, opts.SchemaVersion, err)
			}
		}
	}
	return meta.Put(keySchemaVersion, want)
}

// View runs fn in a read-only transaction.
func (d *DB) View(fn func(*Tx) error) error {
	return d.db.View(func(tx *bolt.Tx) error { return fn(&Tx{tx: tx}) })
}

// Update runs fn in a read-write transaction shared with other concurrent
// writers and returns once that transaction is durable, or with fn's error
// (then none of fn's changes are written).
//
// fn may run more than once: when another write in its group fails, the group
// is retried without it. So fn must set its results afresh on each run and
// have no effect outside the transaction.
func (d *DB) Update(fn func(*Tx) error) error { return d.commit.update(fn) }

// Ping reports whether the database is open (a read transaction starts),
// or ctx's error: a store's readiness check.
func (d *DB) Ping(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return d.db.View(func(*bolt.Tx) error { return nil })
}

// Close finishes the writes already queued and closes the file (with the
// journal, after a last checkpoint, so that the next Open replays
// nothing). Later writes fail.
func (d *DB) Close() error {
	d.commit.close()
	if d.journal == nil {
		return d.db.Close()
	}
	if !d.closed.CompareAndSwap(false, true) {
		return nil // closed already
	}
	err := d.journal.checkpointAndRelease(d.db)
	err = errors.Join(err, d.db.Close())
	return errors.Join(err, d.journal.closeFile())
}

// beforeCommit reports why no write may commit now (the journal failed),
// or nil; the committer fails the group with it.
func (d *DB) beforeCommit() error {
	if d.journal == nil {
		return nil
	}
	return d.journal.refuse()
}

// afterCommit is handed the record of each write transaction once bbolt has
// committed it, before its writers are answered; an error fails every write
// of the group. rec is nil when recording is off, and is reused after
// afterCommit returns. With the journal, the record is made durable here.
func (d *DB) afterCommit(rec *recorder) error {
	if d.journal == nil || d.journal.stepped.Load() {
		return nil // bbolt synced it (countCommit)
	}
	if err := d.journal.commit(d.db, rec.bytes(), d.lastPages); err != nil {
		return err
	}
	d.synced.Add(1)
	d.pages.Add(uint64(d.lastPages)) //nolint:gosec // a count, never negative
	return nil
}

// CommitStats counts the write transactions that committed.
type CommitStats struct {
	// Synced committed durably: with bbolt's fsync of data and meta pages,
	// or with the journal's sync of their record (or a checkpoint's). With
	// the journal, a group of writes that changed nothing counts too,
	// though no transaction is made: its writes are durable as they are.
	Synced uint64
	// Unsynced committed without it (the DB had NoSync set): a crash could
	// lose them although their writers were told they succeeded.
	Unsynced uint64
	// Pages is how many page writes the synced commits made: the dirty
	// pages (every changed leaf and the branches above it, in each bucket
	// touched, and the root) and the meta page. With one writer the first
	// fdatasync of a commit writes all but the meta page, so on a disk
	// bound by bytes it costs about in proportion (docs/benchmarks.md).
	Pages uint64
	// Syncs is how many fdatasyncs the database and its journal made:
	// two per commit bbolt synced, one per journaled commit, two per
	// checkpoint, one per step of the journal's growth.
	Syncs uint64
}

// Commits reports the write transactions committed so far, by whether bbolt
// fsynced them. It is the durability seam: a kill -9 cannot show a missing
// fsync (the page cache outlives the process), so stores' tests check that
// every write ends in a synced commit and none in an unsynced one.
func (d *DB) Commits() CommitStats {
	s := CommitStats{Synced: d.synced.Load(), Unsynced: d.unsynced.Load(), Pages: d.pages.Load(), Syncs: d.syncs.Load()}
	if d.journal != nil {
		s.Syncs += d.journal.syncs.Load()
	}
	return s
}

// Durable reports an error when the database is set up to acknowledge writes
// that are not yet on disk. NoSync is durable with the journal on.
func (d *DB) Durable() error {
	if d.journal != nil {
		return nil // NoSync until the journal steps aside, then bbolt syncs: durable either way
	}
	if d.db.NoSync || d.db.NoGrowSync || d.db.MmapFlags != 0 {
		return fmt.Errorf("%s: NoSync=%v NoGrowSync=%v MmapFlags=%#x; want every sync on", d.db.Path(), d.db.NoSync, d.db.NoGrowSync, d.db.MmapFlags)
	}
	return nil
}

// countCommit records tx, which has committed. bbolt's Tx.Commit fsyncs
// unless NoSync is set (bar OpenBSD, where it always does); with the journal
// on, afterCommit counts the commit once its record is durable.
func (d *DB) countCommit(tx *Tx) {
	st := tx.Stats()
	d.lastPages = st.GetWrite()
	switch {
	case !d.db.NoSync:
		d.synced.Add(1)
		d.syncs.Add(2)
		d.pages.Add(uint64(d.lastPages)) //nolint:gosec // a count, never negative
	case d.journal == nil:
		d.unsynced.Add(1)
	}
}
