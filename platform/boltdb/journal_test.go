package boltdb

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
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

// sync is the journal's fdatasync: it keeps the file's content as
// durable, read before the sync starts (so it holds only writes the sync
// covers; one racing the sync may or may not be on disk), then syncs f.
func (im *diskImages) sync(f *os.File, file string) error {
	if file == "dir" { // names only: no file's content
		return f.Sync()
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
	if err := fdatasync(f); err != nil {
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
	t.Run("checkpoints often", func(t *testing.T) { powerCuts(t, journalOpts(), 800) })
	t.Run("the ring fills between checkpoints", func(t *testing.T) {
		powerCuts(t, &JournalOptions{Size: recordsStart + 48<<10, CheckpointBytes: 1 << 30, CheckpointPages: 1 << 30, CheckpointEvery: time.Hour}, 800)
	})
}

func powerCuts(t *testing.T, opts *JournalOptions, writes int) {
	seed := uint64(7)
	if s, err := strconv.ParseUint(os.Getenv("PARLEY_JOURNAL_SEED"), 10, 64); err == nil {
		seed = s // more cuts: PARLEY_JOURNAL_SEED=n go test -run PowerCuts
	}
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 13))
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

// TestJournal_kill9LosesNoAcknowledgedWrite runs the writer in a process
// of its own, SIGKILLs it at a random moment, three times over the same
// files, and wants every write it acknowledged (printed after Update
// returned) back, in a journal small enough to wrap.
func TestJournal_kill9LosesNoAcknowledgedWrite(t *testing.T) {
	if path := os.Getenv("BOLTDB_JOURNAL_CHILD"); path != "" {
		journalChild(path)
		return
	}
	path := filepath.Join(t.TempDir(), "x.db")
	r := rand.New(rand.NewPCG(3, 5))
	next := 1
	for round := range 3 {
		cmd := exec.Command(os.Args[0], "-test.run=^TestJournal_kill9LosesNoAcknowledgedWrite$")
		cmd.Env = append(os.Environ(), "BOLTDB_JOURNAL_CHILD="+path, fmt.Sprintf("BOLTDB_JOURNAL_FROM=%d", next))
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		acked, stop := next-1, next+200+r.IntN(400)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			n, err := strconv.Atoi(sc.Text())
			if err != nil || n != acked+1 {
				t.Fatalf("round %d: child printed %q after %d", round, sc.Text(), acked)
			}
			acked = n
			if n == stop {
				break
			}
		}
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		for sc.Scan() { // acknowledged before the kill landed
			if n, err := strconv.Atoi(sc.Text()); err == nil && n == acked+1 {
				acked = n
			}
		}
		cmd.Wait() //nolint:errcheck // killed
		if acked < stop {
			t.Fatalf("round %d: child stopped after %d writes, before %d", round, acked, stop)
		}

		d, err := Open(path, Options{Buckets: [][]byte{bucketThings}, SchemaVersion: 1, LockTimeout: 5 * time.Second, Journal: journalOpts()})
		if err != nil {
			t.Fatalf("round %d: open after kill -9: %v", round, err)
		}
		next = 1
		for ; ; next++ {
			if get(t, d, bucketThings, fmt.Sprintf("w%06d", next)) == "" {
				break
			}
		}
		if err := d.Close(); err != nil {
			t.Fatal(err)
		}
		// Every acknowledged write is there; at most the one in flight
		// when the kill came is there too.
		if next-1 < acked || next-1 > acked+1 {
			t.Fatalf("round %d: writes 1..%d are there, %d were acknowledged", round, next-1, acked)
		}
	}
}

// journalChild writes w<from>, w<from+1>, ... each with some filler, and
// prints each number once its Update returned, until killed.
func journalChild(path string) {
	from, _ := strconv.Atoi(os.Getenv("BOLTDB_JOURNAL_FROM"))
	d, err := Open(path, Options{Buckets: [][]byte{bucketThings}, SchemaVersion: 1, LockTimeout: 5 * time.Second, Journal: journalOpts()})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	for n := from; ; n++ {
		err := d.Update(func(tx *Tx) error {
			b := tx.Bucket(bucketThings)
			if err := b.Put(fmt.Appendf(nil, "w%06d", n), []byte("x")); err != nil {
				return err
			}
			return b.Put(fmt.Appendf(nil, "f%03d", n%500), bytes.Repeat([]byte{'f'}, 100+n%700))
		})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		fmt.Println(n)
	}
}

// TestJournal_stepsAsideBeforeTheMapFills: bbolt remaps its file when it
// outgrows the map, which waits for every read transaction, the pin too.
// The journal steps aside (bbolt syncs its own commits again) once the
// file in use passes half the map, and a restart journals again.
func TestJournal_stepsAsideBeforeTheMapFills(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.db")
	opts := journalOpts()
	opts.mapSize = 4 << 20
	d := open(t, path, Options{Journal: opts})
	value := bytes.Repeat([]byte{'v'}, 2000)
	for i := range 1500 { // ~3 MB
		if err := d.Update(put(fmt.Sprintf("k%05d", i), string(value))); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	if !d.journal.stepped.Load() {
		t.Fatalf("the journal did not step aside with a %d-byte map", opts.mapSize)
	}
	if err := d.Durable(); err != nil || d.db.NoSync {
		t.Fatalf("after stepping aside: Durable() = %v, NoSync = %v; want bbolt syncing", err, d.db.NoSync)
	}
	before := d.Commits()
	if err := d.Update(put("after", "x")); err != nil {
		t.Fatal(err)
	}
	if after := d.Commits(); after.Synced != before.Synced+1 || after.Unsynced != 0 {
		t.Errorf("a write after stepping aside: commits %+v -> %+v, want one synced", before, after)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	d = open(t, path, Options{Journal: journalOpts()})
	if d.journal.stepped.Load() || get(t, d, bucketThings, "after") != "x" || get(t, d, bucketThings, "k01499") != string(value) {
		t.Errorf("after a restart: stepped = %v, writes lost", d.journal.stepped.Load())
	}
}

// TestJournal_aFailedSyncRefusesLaterWrites: once the journal cannot sync,
// the write waiting on it fails, and so does every later one (bbolt's
// file holds commits that are not durable); a restart brings back what
// was acknowledged.
func TestJournal_aFailedSyncRefusesLaterWrites(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.db")
	opts := journalOpts()
	var fail atomic.Bool
	opts.sync = func(f *os.File, file string) error {
		if fail.Load() && file == "journal" {
			return errors.New("disk on fire")
		}
		return fdatasync(f)
	}
	d, err := Open(path, Options{Buckets: [][]byte{bucketThings}, SchemaVersion: 1, Journal: opts})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Update(put("a", "1")); err != nil {
		t.Fatal(err)
	}
	fail.Store(true)
	err = d.Update(put("b", "2"))
	if err == nil || !strings.Contains(err.Error(), "disk on fire") || !strings.Contains(err.Error(), JournalSuffix) {
		t.Fatalf("write during a failing sync = %v, want the journal's error", err)
	}
	fail.Store(false)
	if err := d.Update(put("c", "3")); err == nil || !strings.Contains(err.Error(), "refused until a restart") {
		t.Fatalf("write after a failed sync = %v, want it refused", err)
	}
	_ = d.Close() // the journal failed: Close reports it
	d = open(t, path, Options{Journal: journalOpts()})
	if get(t, d, bucketThings, "a") != "1" || get(t, d, bucketThings, "c") != "" {
		t.Errorf("after a restart: a = %q, c = %q; want the acknowledged write and not the refused one", get(t, d, bucketThings, "a"), get(t, d, bucketThings, "c"))
	}
}

func TestJournal_aSecondOpenIsRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.db")
	open(t, path, Options{Journal: journalOpts()})
	_, err := Open(path, Options{SchemaVersion: 1, LockTimeout: 100 * time.Millisecond, Journal: journalOpts()})
	if err == nil || !strings.Contains(err.Error(), "locked by another process") {
		t.Fatalf("second Open = %v, want it refused as locked", err)
	}
}

func TestJournal_aCheckpointWithoutItsDatabaseIsRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.db")
	d := open(t, path, Options{Journal: journalOpts()})
	if err := d.Update(put("a", "1")); err != nil {
		t.Fatal(err)
	}
	// The journal as a crash leaves it (an active checkpoint), without
	// the database file.
	b, err := os.ReadFile(path + JournalSuffix)
	if err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(t.TempDir(), "x.db")
	if err := os.WriteFile(other+JournalSuffix, b, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = Open(other, Options{SchemaVersion: 1, LockTimeout: time.Second, Journal: journalOpts()})
	if err == nil || !strings.Contains(err.Error(), "restore the database file with its journal") {
		t.Fatalf("Open without the database = %v, want it refused", err)
	}
}

// TestJournal_cleanCloseReplaysNothing: Close checkpoints, marked
// inactive, so the next Open finds nothing to restore or replay.
func TestJournal_cleanCloseReplaysNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.db")
	d := open(t, path, Options{Journal: journalOpts()})
	for i := range 50 {
		if err := d.Update(put(fmt.Sprint(i), "v")); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	j, err := openJournal(path, *journalOpts(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer j.abandon()
	if len(j.recovered) != 0 || j.metas != nil || j.ckpt == 0 {
		t.Errorf("after Close: %d records to replay, meta pages to restore %v, checkpoint %d; want none, none, and a checkpoint", len(j.recovered), j.metas != nil, j.ckpt)
	}
}

// FuzzJournalLoad: whatever the journal file holds, opening it returns an
// error or a journal, and never panics.
func FuzzJournalLoad(f *testing.F) {
	path := filepath.Join(f.TempDir(), "x.db")
	d, err := Open(path, Options{Buckets: [][]byte{bucketThings}, SchemaVersion: 1, Journal: journalOpts()})
	if err != nil {
		f.Fatal(err)
	}
	for i := range 20 {
		if err := d.Update(put(fmt.Sprint(i), "v")); err != nil {
			f.Fatal(err)
		}
	}
	good, err := os.ReadFile(path + JournalSuffix)
	if err != nil {
		f.Fatal(err)
	}
	d.Close()
	f.Add(good[:recordsStart+4096])
	f.Add(good[:100])
	f.Add([]byte{})
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, b []byte) {
		p := filepath.Join(dir, "f.db")
		_ = os.Remove(p) // may be absent
		if err := os.WriteFile(p+JournalSuffix, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if j, err := openJournal(p, JournalOptions{Size: recordsStart + 64<<10}, time.Second); err == nil {
			j.abandon()
		}
	})
}

// TestJournal_offAndOnKeepsEveryWrite: runs with and without the journal
// alternate over one file, some ending in a crash (a cut taken while
// open), and every write stays. A run without the journal first recovers
// through one that is there and removes it.
func TestJournal_offAndOnKeepsEveryWrite(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "x.db")
	n := 0
	for round, journal := range []bool{true, false, true, true, false, false, true} {
		var opts *JournalOptions
		if journal {
			opts = journalOpts()
		}
		d, err := Open(path, Options{Buckets: [][]byte{bucketThings}, SchemaVersion: 1, LockTimeout: time.Second, Journal: opts})
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		for i := 0; i < n; i++ {
			if get(t, d, bucketThings, fmt.Sprint(i)) == "" {
				t.Fatalf("round %d (journal %v): write %d of %d is gone", round, journal, i, n)
			}
		}
		if _, err := os.Stat(path + JournalSuffix); journal == errors.Is(err, os.ErrNotExist) {
			t.Errorf("round %d (journal %v): journal file: %v", round, journal, err)
		}
		for range 300 {
			if err := d.Update(put(fmt.Sprint(n), strings.Repeat("v", 200))); err != nil {
				t.Fatal(err)
			}
			n++
		}
		if journal && round == 3 {
			// A crash: carry on from copies of the files taken while open.
			crashed := crashCopy(t, path)
			_ = d.Close()
			path = crashed
			continue
		}
		if err := d.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestJournal_firstOpenSyncsTheDirectory: an fdatasync makes a file's
// content durable, not its name in the directory. The first journaled Open
// creates the journal (and perhaps the database), so it syncs the
// directory before any commit relies on either: otherwise a power cut
// could take away the journal and the acknowledged records in it.
func TestJournal_firstOpenSyncsTheDirectory(t *testing.T) {
	dir := t.TempDir()
	opts := journalOpts()
	var mu sync.Mutex
	var synced []string
	opts.sync = func(f *os.File, file string) error {
		mu.Lock()
		synced = append(synced, file+" "+f.Name())
		mu.Unlock()
		return fdatasync(f)
	}
	d := open(t, filepath.Join(dir, "x.db"), Options{Journal: opts})
	mu.Lock()
	got := slices.Clone(synced)
	mu.Unlock()
	if !slices.Contains(got, "dir "+dir) {
		t.Errorf("syncs during the first journaled Open: %q; want one of directory %s", got, dir)
	}
	if err := d.Close(); err != nil {
		t.Error(err)
	}
}

// TestJournal_aReadErrorFailsOpen: a journal that cannot be read is not
// taken for a torn one: Open fails naming what it could not read, rather
// than falling back to an older checkpoint or dropping the records after
// the unreadable one (acknowledged writes).
func TestJournal_aReadErrorFailsOpen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.db")
	d := open(t, path, Options{Journal: journalOpts()})
	for i := range 20 {
		if err := d.Update(put(fmt.Sprint(i), "v")); err != nil {
			t.Fatal(err)
		}
	}
	crashed := crashCopy(t, path) // records after the checkpoint included
	for _, tc := range []struct {
		name string
		at   func(off int64) bool
		want string
	}{
		{"a slot", func(off int64) bool { return off < recordsStart }, "read slot"},
		{"a record", func(off int64) bool { return off >= recordsStart }, "read record"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := journalOpts()
			opts.readAt = func(f *os.File, b []byte, off int64) (int, error) {
				if tc.at(off) {
					return 0, syscall.EIO
				}
				return f.ReadAt(b, off)
			}
			_, err := Open(crashed, Options{Buckets: [][]byte{bucketThings}, SchemaVersion: 1, LockTimeout: time.Second, Journal: opts})
			if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, syscall.EIO) {
				t.Fatalf("Open with an unreadable %s = %v, want an error naming it", tc.name, err)
			}
		})
	}
	// The same files, readable, open with every write.
	c := open(t, crashed, Options{Journal: journalOpts()})
	if got := get(t, c, bucketThings, "19"); got != "v" {
		t.Errorf("after a crash: write 19 = %q, want it", got)
	}
}

// crashCopy copies the database at path and its journal, as they are
// while it is open (what kill -9 leaves: the page cache's view), into a
// new directory and returns the copy's path.
func crashCopy(t *testing.T, path string) string {
	t.Helper()
	crashed := filepath.Join(t.TempDir(), filepath.Base(path))
	for _, suffix := range []string{"", JournalSuffix} {
		b, err := os.ReadFile(path + suffix)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(crashed+suffix, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return crashed
}
