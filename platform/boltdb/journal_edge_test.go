package boltdb

// The journal at its edges: runs with and without it, a refused Open, a
// commit outgrowing the map, Durable while stepping aside, a second Close,
// a database file older than its journal or written without it, power
// cuts in the first Open and over many lives. Each names the way the
// journal would lose a write, corrupt the file or hang without what it
// tests.

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// TestJournal_aPlainOpenAfterACleanCloseIsNotUndone: a journaled
// database closed cleanly, then opened without the journal (an older
// release after a rollback, a tool, a store's tests), keeps the writes
// made then when it is opened with the journal again. Close leaves an
// active checkpoint, so the next journaled Open writes that checkpoint's
// meta pages over the file's: the plain writes are gone, and the
// checkpoint's tree may have been overwritten by them (nothing pinned it).
func TestJournal_aPlainOpenAfterACleanCloseIsNotUndone(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.db")
	d := open(t, path, Options{Journal: journalOpts()})
	if err := d.Update(put("a", "1")); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	plain := open(t, path, Options{})
	for i := range 200 { // enough to reuse the pages the checkpoint's tree had
		if err := plain.Update(put("b"+strings.Repeat("x", i%50)+string(rune('0'+i%10)), strings.Repeat("v", 500))); err != nil {
			t.Fatal(err)
		}
	}
	if err := plain.Update(put("b", "2")); err != nil {
		t.Fatal(err)
	}
	if err := plain.Close(); err != nil {
		t.Fatal(err)
	}
	d = open(t, path, Options{Journal: journalOpts()})
	if a, b := get(t, d, bucketThings, "a"), get(t, d, bucketThings, "b"); a != "1" || b != "2" {
		t.Fatalf("journaled Open after a plain one: a = %q, b = %q; want \"1\" and \"2\" (the plain open's acknowledged write undone)", a, b)
	}
}

// TestJournal_aRefusedOpenLeavesTheDatabaseAlone: a journaled Open
// that cannot have the database (another process holds bbolt's lock: a
// plain open of the same file) must not write it. openJournal restores the
// checkpoint's meta pages before bbolt.Open takes bbolt's lock, so the
// holder's file is rewound under it: its acknowledged write is gone once
// it closes. The journal is left as a crash leaves it (copied while open),
// so that a clean Close ending in an inactive checkpoint (the fix for the
// test above) does not hide this.
func TestJournal_aRefusedOpenLeavesTheDatabaseAlone(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.db")
	d := open(t, path, Options{Journal: journalOpts()})
	if err := d.Update(put("a", "1")); err != nil {
		t.Fatal(err)
	}
	closeLeavingACrashedJournal(t, d, path)
	holder := open(t, path, Options{})
	if err := holder.Update(put("b", "2")); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(path, Options{Buckets: [][]byte{bucketThings}, SchemaVersion: 1, LockTimeout: 200 * time.Millisecond, Journal: journalOpts()}); err == nil {
		t.Fatal("a journaled Open of a file another handle holds succeeded")
	}
	if err := holder.Close(); err != nil {
		t.Fatal(err)
	}
	after := open(t, path, Options{})
	if b := get(t, after, bucketThings, "b"); b != "2" {
		t.Fatalf("after a refused journaled Open: b = %q, want \"2\" (the holder's acknowledged write was undone by the refused Open)", b)
	}
}

// TestJournal_aCommitThatOutgrowsTheMapDoesNotHang: the journal
// steps aside only when the size before the previous group passed half
// the map (refuse uses lastSize, set before the commit). A group that
// grows the file past the mapped size while the pin is held makes bbolt
// remap: mmap takes mmaplock for writing, the pin holds it for reading,
// and only the committer, now waiting in bbolt, would let the pin go.
// (With the production map, 16 GiB or 4× the file, this needs a group of
// several GiB; a smaller map shows it.)
func TestJournal_aCommitThatOutgrowsTheMapDoesNotHang(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.db")
	opts := journalOpts()
	opts.mapSize = 4 << 20
	d, err := Open(path, Options{Buckets: [][]byte{bucketThings}, SchemaVersion: 1, LockTimeout: time.Second, Journal: opts})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- d.Update(put("big", string(bytes.Repeat([]byte{'v'}, 6<<20)))) }()
	select {
	case err := <-done:
		if err != nil {
			t.Logf("the big write failed (acceptable): %v", err)
		}
		if err := d.Close(); err != nil {
			t.Error(err)
		}
	case <-time.After(20 * time.Second): // a hang detector, not a timing assertion
		t.Fatal("a write growing the file past the mapped size hung: bbolt's remap waits for the journal's pin, the pin for the committer (the database is left open)")
	}
}

// TestJournal_durableWhileTheJournalStepsAside: Durable (a store's
// readiness check may call it at any time) reads db.NoSync, which
// stepAside writes on the committer goroutine without synchronisation.
// Fails under -race only.
func TestJournal_durableWhileTheJournalStepsAside(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.db")
	opts := journalOpts()
	opts.mapSize = 4 << 20
	d := open(t, path, Options{Journal: opts})
	stop := make(chan struct{})
	checked := make(chan struct{})
	go func() {
		defer close(checked)
		for {
			select {
			case <-stop:
				return
			default:
				_ = d.Durable()
			}
		}
	}()
	value := strings.Repeat("v", 2000)
	for i := range 1500 {
		if err := d.Update(put(fmt.Sprintf("k%05d", i), value)); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	close(stop)
	<-checked
	if !d.journal.stepped.Load() {
		t.Fatal("the journal did not step aside; the test shows nothing")
	}
}

// TestJournal_aSecondCloseIsQuiet: without the journal a second Close
// returns nil (bbolt's does); with it, it reports "database not open" from
// a last checkpoint it tries on a closed bbolt, and "file already closed".
// Cleanups (t.Cleanup, deferred closes after an explicit one) hit this.
func TestJournal_aSecondCloseIsQuiet(t *testing.T) {
	for _, j := range []*JournalOptions{nil, journalOpts()} {
		d, err := Open(filepath.Join(t.TempDir(), "x.db"), Options{Buckets: [][]byte{bucketThings}, SchemaVersion: 1, Journal: j})
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Close(); err != nil {
			t.Fatal(err)
		}
		if err := d.Close(); err != nil {
			t.Errorf("journal %v: second Close = %v, want nil", j != nil, err)
		}
	}
}

// TestJournal_aDatabaseFileOlderThanItsJournalIsNotRewritten: the
// database file put back from an older copy (a backup restored without
// its journal, the journal left by a later run that crashed) gets the journal's
// later meta pages written over its own: they point at pages the old file
// has other data in. Open must refuse (the file's meta txids are below the
// checkpoint's) or leave the file as it was. It panics instead (bbolt's
// freelist rebuild, on a goroutine of its own: the process dies), so the
// scenario runs in a child process.
func TestJournal_aDatabaseFileOlderThanItsJournalIsNotRewritten(t *testing.T) {
	if os.Getenv("BOLTDB_JOURNAL_PANIC_CHILD") != "" {
		olderFileChild(t)
		return
	}
	runInChild(t, "Open of a database file older than its journal")
}

// runInChild runs the calling test again in a child process (a panic
// on one of bbolt's goroutines ends the process) and fails with its
// output up to the first goroutine dump.
func runInChild(t *testing.T, what string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.v")
	cmd.Env = append(os.Environ(), "BOLTDB_JOURNAL_PANIC_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		first, _, _ := strings.Cut(string(out), "\n\ngoroutine")
		t.Fatalf("%s: the child failed (%v):\n%s", what, err, first)
	}
}

func olderFileChild(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "x.db")
	d := open(t, path, Options{Journal: journalOpts()})
	if err := d.Update(put("old", "1")); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	backup, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	d = open(t, path, Options{Journal: journalOpts()})
	for i := range 300 {
		if err := d.Update(put(fmt.Sprintf("new%03d", i), strings.Repeat("n", 700))); err != nil {
			t.Fatal(err)
		}
	}
	closeLeavingACrashedJournal(t, d, path)
	if err := os.WriteFile(path, backup, 0o600); err != nil {
		t.Fatal(err)
	}
	d2, err := Open(path, Options{Buckets: [][]byte{bucketThings}, SchemaVersion: 1, LockTimeout: time.Second, Journal: journalOpts()})
	if err != nil {
		if !strings.Contains(err.Error(), JournalSuffix) || !strings.Contains(err.Error(), "remove the journal") {
			t.Errorf("Open of an older file = %v, want a refusal naming the journal and what to do", err)
		}
		return // refused: fine
	}
	defer d2.Close()
	var problems []string
	_ = d2.db.View(func(tx *bolt.Tx) error {
		for err := range tx.Check() {
			problems = append(problems, err.Error())
		}
		return nil
	})
	if old := get(t, d2, bucketThings, "old"); old != "1" || len(problems) > 0 {
		t.Fatalf("an older database file opened with a later journal: old = %q, consistency: %q; want the file as it was, or a refusal", old, problems)
	}
}

// TestJournal_aPowerCutInTheFirstJournaledOpenKeepsTheDatabase: the
// first journaled Open of a database (an upgrade from a release without
// the journal; also any Open after the journal stepped aside, whose slot
// is inactive) has no checkpoint to restore, yet commits initialise's
// changes (it always puts schema_version) with NoSync before its first
// checkpoint syncs the file. A power cut there may keep the new meta page
// and not the pages it points at; the next Open finds no active
// checkpoint, restores nothing, and bbolt opens a torn tree. The cut is
// taken in the checkpoint's sync of the database file: every page as last
// synced (the plain Close) but the meta pages, as written.
func TestJournal_aPowerCutInTheFirstJournaledOpenKeepsTheDatabase(t *testing.T) {
	if os.Getenv("BOLTDB_JOURNAL_PANIC_CHILD") != "" {
		firstOpenCutChild(t)
		return
	}
	runInChild(t, "a power cut in the first journaled Open")
}

func firstOpenCutChild(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.db")
	plain := open(t, path, Options{})
	for i := range 300 { // a history: freed pages with old content
		if err := plain.Update(put(fmt.Sprintf("k%03d", i%100), strings.Repeat(string(rune('a'+i/100)), 700))); err != nil {
			t.Fatal(err)
		}
	}
	pageSize := plain.db.Info().PageSize
	if err := plain.Close(); err != nil {
		t.Fatal(err)
	}
	durable, err := os.ReadFile(path) // bbolt synced every commit
	if err != nil {
		t.Fatal(err)
	}
	cut := filepath.Join(t.TempDir(), "x.db")
	taken := false
	opts := journalOpts()
	opts.sync = func(f *os.File, file string) error {
		if file == "db" && !taken {
			taken = true
			live, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			img := make([]byte, len(live))
			copy(img, durable)
			copy(img[:2*pageSize], live[:2*pageSize])
			jnl, err := os.ReadFile(path + JournalSuffix)
			if err != nil {
				return err
			}
			if err := os.WriteFile(cut, img, 0o600); err != nil {
				return err
			}
			if err := os.WriteFile(cut+JournalSuffix, jnl, 0o600); err != nil {
				return err
			}
		}
		return fdatasync(f)
	}
	d := open(t, path, Options{Journal: opts})
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if !taken {
		t.Fatal("no sync of the database file during Open; the test shows nothing")
	}
	after := open(t, cut, Options{Journal: journalOpts()})
	for i := range 100 {
		if got := get(t, after, bucketThings, fmt.Sprintf("k%03d", i)); got != strings.Repeat("c", 700) {
			t.Fatalf("after a power cut in the first journaled Open: k%03d = %.10q…, want the plain database's last value", i, got)
		}
	}
}

// TestJournal_powerCutsOverManyLives: each life opens what the
// last power cut left (so it recovers, then journals on from where the
// recovery put head, tail and seq), writes, and is cut at a random moment
// between writes; the next life must see exactly the writes acknowledged
// before the cut; a third of the recoveries are themselves cut (in their
// checkpoint's sync). The existing power-cut test recovers each cut only
// once, never cuts a recovery and never writes after one. It passes: kept
// as coverage. The child panics on a torn tree, so
// the lives run in a child process.
func TestJournal_powerCutsOverManyLives(t *testing.T) {
	if os.Getenv("BOLTDB_JOURNAL_PANIC_CHILD") == "" {
		runInChild(t, "power cuts over many lives")
		return
	}
	for name, opts := range map[string]func() *JournalOptions{
		"checkpoints often": journalOpts,
		"the ring fills between checkpoints": func() *JournalOptions {
			return &JournalOptions{Size: recordsStart + 48<<10, CheckpointBytes: 1 << 30, CheckpointPages: 1 << 30, CheckpointEvery: time.Hour}
		},
	} {
		t.Run(name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(11, 17))
			path := filepath.Join(t.TempDir(), "x.db")
			var want []string
			recoveriesCut := 0
			for life := range 12 {
				im := newDiskImages(path)
				for _, p := range []string{im.db, im.jnl} { // what the cut left is on disk
					if b, err := os.ReadFile(p); err == nil {
						im.durable[p] = b
					}
				}
				o := opts()
				o.sync = im.sync
				var inOpen string // a cut during the recovery itself (its checkpoint's slot sync)
				if life > 0 && r.IntN(3) == 0 {
					cr, dir := rand.New(rand.NewPCG(r.Uint64(), 3)), t.TempDir()
					im.crash = func() {
						if inOpen == "" {
							inOpen = im.cutLocked(t, cr, dir)
						}
					}
				}
				d, err := Open(path, Options{SchemaVersion: 1, Buckets: recordBuckets, LockTimeout: time.Second, Journal: o})
				if err != nil {
					t.Fatalf("life %d: open after a cut: %v", life, err)
				}
				im.mu.Lock()
				im.crash = nil
				im.mu.Unlock()
				if got := dump(t, d); want != nil && fmt.Sprint(got) != fmt.Sprint(want) {
					d.Close()
					t.Fatalf("life %d: after a cut: contents are not the acknowledged ones\n%s", life, diffLines(want, got))
				}
				if inOpen != "" {
					recoveriesCut++
					path = inOpen
					if err := d.Close(); err != nil {
						t.Fatal(err)
					}
					continue
				}
				cutAt := 20 + r.IntN(120)
				for n := range cutAt {
					if err := d.Update(journalWrite(r)); err != nil {
						t.Fatalf("life %d, write %d: %v", life, n, err)
					}
				}
				want = dump(t, d)
				path = im.cut(t, r, t.TempDir())
				if err := d.Close(); err != nil {
					t.Fatal(err)
				}
			}
			t.Logf("12 lives, %d recoveries cut", recoveriesCut)
		})
	}
}

// TestJournal_aFileWrittenWithoutItsJournalIsRefused: an older release
// (no journal) that opens the file after a crash leaves the journal in
// place and commits past it. Coming back, Open must not restore the
// journal's checkpoint over those commits: it refuses, names the journal
// and says how to go on (ADR 0008, Downgrades), and leaves both files as
// they are.
func TestJournal_aFileWrittenWithoutItsJournalIsRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.db")
	d := open(t, path, Options{Journal: journalOpts()})
	if err := d.Update(put("a", "1")); err != nil {
		t.Fatal(err)
	}
	closeLeavingACrashedJournal(t, d, path)
	older, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if err := older.Update(func(tx *bolt.Tx) error {
			return tx.Bucket(bucketThings).Put(fmt.Appendf(nil, "b%d", i), []byte("2"))
		}); err != nil {
			t.Fatal(err)
		}
	}
	if err := older.Close(); err != nil {
		t.Fatal(err)
	}
	_, err = Open(path, Options{Buckets: [][]byte{bucketThings}, SchemaVersion: 1, LockTimeout: time.Second, Journal: journalOpts()})
	if err == nil || !strings.Contains(err.Error(), path+JournalSuffix) || !strings.Contains(err.Error(), "remove the journal") {
		t.Fatalf("journaled Open of a file written without its journal = %v, want a refusal naming the journal and what to do", err)
	}
	if _, err := os.Stat(path + JournalSuffix); err != nil {
		t.Errorf("after the refusal: %v, want the journal left", err)
	}
	after, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer after.Close()
	if err := after.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bucketThings).Get([]byte("b4")); string(v) != "2" {
			t.Errorf("after the refusal: b4 = %q, want \"2\" (the file was rewound)", v)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// closeLeavingACrashedJournal closes d, the database at path, and puts
// back its journal as it was while open: as a crash leaves it (an active
// checkpoint, records after it), beside a file Close synced.
func closeLeavingACrashedJournal(t *testing.T, d *DB, path string) {
	t.Helper()
	crashed, err := os.ReadFile(path + JournalSuffix)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path+JournalSuffix, crashed, 0o600); err != nil {
		t.Fatal(err)
	}
}
