package boltdb

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

)

// journalOpts is a small journal that wraps, checkpoints and grows often.
func journalOpts() *JournalOptions {
	return &JournalOptions{Size: 1 << 20, CheckpointBytes: 24 << 10, CheckpointPages: 64, CheckpointEvery: time.Hour}
}

// diskImages keeps, for each file, its content as of its last fdatasync:
// what a power cut could not take away. The live files hold that plus
// later writes, any of which a power cut may or may not have let reach
// the disk.
type diskImages struct {
	mu      sync.Mutex
	db, jnl string
	durable map[string][]byte
	crash   func() // called in the journal's sync hook, with mu held, when set
}

func newDiskImages(dbPath string) *diskImages {
	return &diskImages{db: dbPath, jnl: dbPath + JournalSuffix, durable: map[string][]byte{}}
}

// sync is the journal's fdatasync: it syncs f and keeps the file's
// content as durable.
func (im *diskImages) sync(f *os.File, file string) error {
	if err := fdatasync(f); err != nil {
		return err
	}
	im.mu.Lock()
	defer im.mu.Unlock()
	path := im.db
	if file == "journal" {
		path = im.jnl
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	im.durable[path] = b
	if im.crash != nil && file == "journal" {
		im.crash()
	}
	return nil
}

// cut writes into dir the files a power cut could leave now: each unit of
// each file (a page of bbolt's file, a 512-byte sector of the journal)
// holds its durable content or its live one, at random.
func (im *diskImages) cut(t *testing.T, r *rand.Rand, dir string) string {
	t.Helper()
	im.mu.Lock()
	defer im.mu.Unlock()
	return im.cutLocked(t, r, dir)
}

func (im *diskImages) cutLocked(t *testing.T, r *rand.Rand, dir string) string {
	t.Helper()
	out := filepath.Join(dir, filepath.Base(im.db))
	for _, f := range []struct {
		path, to string
		unit     int
	}{{im.db, out, 4096}, {im.jnl, out + JournalSuffix, 512}} {
		live, err := os.ReadFile(f.path)
		if err != nil {
			t.Error(err) // maybe not on the test's goroutine
			return out
		}
		old := im.durable[f.path]
		img := make([]byte, len(live))
		for off := 0; off < len(live); off += f.unit {
			end := min(off+f.unit, len(live))
			switch {
			case r.IntN(2) == 0:
				copy(img[off:end], live[off:end])
			case off < len(old):
				copy(img[off:end], old[off:min(end, len(old))])
			}
		}
		if err := os.WriteFile(f.to, img, 0o600); err != nil {
			t.Error(err)
		}
	}
	return out
}

// journalWrite makes changes of every kind (randomWrite) and sometimes
// puts a value over a page, or one too big for the small journal (whose
// commit a checkpoint makes durable instead).
func journalWrite(r *rand.Rand) func(*Tx) error {
	seed, big := r.Uint64(), r.IntN(30)
	write := randomWrite(seed, false)
	return func(tx *Tx) error {
		if err := write(tx); err != nil {
			return err
		}
		switch big {
		case 0:
			return tx.Bucket(recordBuckets[0]).Put([]byte("big"), bytes.Repeat([]byte{byte(seed)}, 9000))
		case 1:
			return tx.Bucket(recordBuckets[0]).Put([]byte("huge"), bytes.Repeat([]byte{byte(seed)}, 300<<10))
		}
		return nil
	}
}

func openJournaled(t *testing.T, path string, j *JournalOptions) *DB {
	t.Helper()
	return open(t, path, Options{Buckets: recordBuckets, Journal: j})
}

// TestJournal_powerCutsLoseNoAcknowledgedWrite runs random writes through
// a journaled database and, at random moments, takes what a power cut
// could leave on disk (every write since each file's last sync kept or
// lost, page by page), opens it elsewhere and wants exactly the writes
// acknowledged so far: no fewer, and none half-applied. Some cuts fall
// inside a commit's journal sync, where that commit may be there or not.
// The small journal wraps, grows and checkpoints (in the background) many
// times over.
func TestJournal_powerCutsLoseNoAcknowledgedWrite(t *testing.T) {
	t.Run("checkpoints often", func(t *testing.T) { powerCuts(t, journalOpts(), 1200) })
	t.Run("the ring fills between checkpoints", func(t *testing.T) {
		powerCuts(t, &JournalOptions{Size: recordsStart + 48<<10, CheckpointBytes: 1 << 30, CheckpointPages: 1 << 30, CheckpointEvery: time.Hour}, 1200)
	})
}

func powerCuts(t *testing.T, opts *JournalOptions, writes int) {
	r := rand.New(rand.NewPCG(7, 13))
	path := filepath.Join(t.TempDir(), "x.db")
	im := newDiskImages(path)
	opts.sync = im.sync
	d := openJournaled(t, path, opts)

	var states [][]string // states[k]: the contents after k acknowledged writes
	states = append(states, dump(t, d))
	check := func(img string, allowed ...int) {
		t.Helper()
		o := *opts
		o.sync = nil
		c, err := Open(img, Options{SchemaVersion: 1, Buckets: recordBuckets, LockTimeout: time.Second, Journal: &o})
		if err != nil {
			t.Fatalf("open after a cut: %v", err)
		}
		got := dump(t, c)
		ok := false
		for _, k := range allowed {
			if fmt.Sprint(got) == fmt.Sprint(states[k]) {
				ok = true
			}
		}
		if !ok {
			t.Fatalf("after a cut with %d writes acknowledged: contents match none of states %v\n%s", len(states)-1, allowed, diffLines(states[allowed[0]], got))
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}

	cuts := 0
	for n := 1; n <= writes; n++ {
		var inside []string // images cut inside this write's syncs
		if r.IntN(60) == 0 {
			// Cuts inside this write's journal sync (or a checkpoint's
			// running meanwhile): the write may be there or not.
			cr := rand.New(rand.NewPCG(r.Uint64(), 2))
			dir := t.TempDir()
			im.mu.Lock()
			im.crash = func() {
				if len(inside) == 0 { // one cut is enough
					inside = append(inside, im.cutLocked(t, cr, dir))
				}
			}
			im.mu.Unlock()
		}
		if err := d.Update(journalWrite(r)); err != nil {
			t.Fatalf("write %d: %v", n, err)
		}
		im.mu.Lock() // waits for a cut being taken
		im.crash = nil
		im.mu.Unlock()
		states = append(states, dump(t, d))
		for _, img := range inside {
			check(img, len(states)-2, len(states)-1)
			cuts++
		}
		if r.IntN(40) == 0 {
			check(im.cut(t, r, t.TempDir()), len(states)-1)
			cuts++
		}
	}
	st := d.Commits()
	if st.Unsynced != 0 || st.Synced < uint64(writes) {
		t.Errorf("Commits() = %+v, want every write synced", st)
	}
	// Most commits journaled, not checkpointed: about one sync each.
	t.Logf("%d cuts; %d checkpoints; %+v", cuts, d.journal.ckpt, st)
	if d.journal.ckpt < 5 || d.journal.ckpt > uint64(writes/5) {
		t.Errorf("%d checkpoints for %d writes: want some, and most writes journaled", d.journal.ckpt, writes)
	}
}

// diffLines says how got differs from want, line by line.
func diffLines(want, got []string) string {
	in := func(lines []string) map[string]bool {
		m := map[string]bool{}
		for _, l := range lines {
			m[l] = true
		}
		return m
	}
	w, g := in(want), in(got)
	var b strings.Builder
	for _, l := range want {
		if !g[l] {
			fmt.Fprintf(&b, "- %s\n", l)
		}
	}
	for _, l := range got {
		if !w[l] {
			fmt.Fprintf(&b, "+ %s\n", l)
		}
	}
	return b.String()
}
