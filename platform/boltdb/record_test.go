package boltdb

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	bolt "go.etcd.io/bbolt"
)

var recordBuckets = [][]byte{[]byte("t0"), []byte("t1"), []byte("t2")}

// recordOptions has the buckets of the random writes and bucketThings, for
// put and holdCommitter.
var recordOptions = Options{Buckets: append([][]byte{bucketThings}, recordBuckets...)}

// openRecording opens a database whose committer hands every record, copied,
// to the returned list (and records at all only if record is set).
func openRecording(t *testing.T, path string, record bool) (*DB, func() [][]byte) {
	t.Helper()
	d := open(t, path, recordOptions)
	var mu sync.Mutex
	var recs [][]byte
	d.record = record
	d.commit.afterCommit = func(rec *recorder) error {
		mu.Lock()
		defer mu.Unlock()
		if rec != nil {
			recs = append(recs, bytes.Clone(rec.bytes()))
		} else {
			recs = append(recs, nil)
		}
		return nil
	}
	return d, func() [][]byte {
		mu.Lock()
		defer mu.Unlock()
		return recs
	}
}

// randomWrite is a write that makes changes of every kind, chosen by a
// generator seeded afresh on each run (the committer may run it twice). It
// fails after its changes when fail is set.
func randomWrite(seed uint64, fail bool) func(*Tx) error {
	return func(tx *Tx) error {
		r := rand.New(rand.NewPCG(seed, 1))
		for range 1 + r.IntN(12) {
			if err := randomOp(tx, r); err != nil {
				return err
			}
		}
		if fail {
			return errors.New("refused after its changes")
		}
		return nil
	}
}

// pick returns a random bucket: a top-level one or one nested below it.
func pick(tx *Tx, r *rand.Rand) *Bucket {
	b := tx.Bucket(recordBuckets[r.IntN(len(recordBuckets))])
	for r.IntN(3) > 0 {
		var nested [][]byte
		_ = b.ForEach(func(k, v []byte) error {
			if v == nil {
				nested = append(nested, bytes.Clone(k))
			}
			return nil
		})
		if len(nested) == 0 {
			break
		}
		b = b.Bucket(nested[r.IntN(len(nested))])
	}
	return b
}

func randomOp(tx *Tx, r *rand.Rand) error {
	key := fmt.Appendf(nil, "k%02d", r.IntN(30))
	switch b := pick(tx, r); r.IntN(10) {
	case 0, 1, 2:
		value := make([]byte, r.IntN(40))
		for i := range value {
			value[i] = byte(r.Uint32())
		}
		return b.Put(key, value)
	case 3:
		return b.Delete(key)
	case 4:
		// Cursor deletes while iterating.
		c := b.Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			if v != nil && r.IntN(3) == 0 {
				if err := c.Delete(); err != nil {
					return err
				}
			}
		}
		return nil
	case 5:
		name := fmt.Appendf(nil, "n%d", r.IntN(4))
		if r.IntN(2) == 0 {
			_, err := b.CreateBucketIfNotExists(name)
			return err
		}
		if _, err := b.CreateBucket(name); err != nil && b.Bucket(name) == nil {
			return err
		}
		return nil
	case 6:
		if err := b.DeleteBucket(fmt.Appendf(nil, "n%d", r.IntN(4))); err != nil && b.Bucket(key) != nil {
			return err
		}
		return nil
	case 7:
		_, err := b.NextSequence()
		return err
	case 8:
		return b.SetSequence(r.Uint64N(1000))
	default:
		// A top-level bucket comes and goes.
		name := []byte("t9")
		switch r.IntN(3) {
		case 0:
			nb, err := tx.CreateBucketIfNotExists(name)
			if err != nil {
				return err
			}
			return nb.Put(key, []byte("v"))
		case 1:
			nb, err := tx.CreateBucket(name)
			if err != nil {
				if tx.Bucket(name) == nil {
					return err
				}
				return nil
			}
			return nb.Put(key, []byte("c"))
		}
		if err := tx.DeleteBucket(name); err != nil && tx.Bucket(name) != nil {
			return err
		}
		return nil
	}
}

// dump lists everything in d: every bucket at every depth with its
// sequence, and every key with its value.
func dump(t *testing.T, d *DB) []string {
	t.Helper()
	var lines []string
	var walk func(path string, b *bolt.Bucket) error
	walk = func(path string, b *bolt.Bucket) error {
		lines = append(lines, fmt.Sprintf("%s seq=%d", path, b.Sequence()))
		return b.ForEach(func(k, v []byte) error {
			if v == nil {
				return walk(fmt.Sprintf("%s/%q", path, k), b.Bucket(k))
			}
			lines = append(lines, fmt.Sprintf("%s %q=%x", path, k, v))
			return nil
		})
	}
	if err := d.db.View(func(tx *bolt.Tx) error {
		return tx.ForEach(func(name []byte, b *bolt.Bucket) error { return walk(fmt.Sprintf("%q", name), b) })
	}); err != nil {
		t.Fatal(err)
	}
	return lines
}

func TestRecord_replayReproducesRandomChanges(t *testing.T) {
	dir := t.TempDir()
	a, records := openRecording(t, filepath.Join(dir, "a.db"), true)
	b := open(t, filepath.Join(dir, "b.db"), recordOptions)

	seed := uint64(1)
	next := func() uint64 { seed++; return seed }
	failures := 0
	for round := range 60 {
		if round%10 == 9 {
			// A group with a failing write in it: the committer retries
			// the rest without it.
			release, held := holdCommitter(t, a)
			const n = 5
			errs := make([]error, n)
			var wg sync.WaitGroup
			for i := range n {
				s := next()
				wg.Go(func() { errs[i] = a.Update(randomWrite(s, i == 2)) })
			}
			waitQueued(t, a, n)
			release()
			wg.Wait()
			if err := <-held; err != nil {
				t.Fatal(err)
			}
			for i, err := range errs {
				if (err != nil) != (i == 2) {
					t.Fatalf("round %d write %d: %v", round, i, err)
				}
			}
			failures++
			continue
		}
		if err := a.Update(randomWrite(next(), false)); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
	}

	recs := records()
	if failures == 0 || len(recs) < 60 {
		t.Fatalf("%d records with %d failing groups; the test did not run what it means to", len(recs), failures)
	}
	for i, rec := range recs {
		if err := b.db.Update(func(tx *bolt.Tx) error { return replay(tx, rec) }); err != nil {
			t.Fatalf("replay record %d: %v", i, err)
		}
	}
	got, want := dump(t, b), dump(t, a)
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		for i := range max(len(got), len(want)) {
			g, w := "(none)", "(none)"
			if i < len(got) {
				g = got[i]
			}
			if i < len(want) {
				w = want[i]
			}
			if g != w {
				t.Fatalf("after replay, line %d of %d/%d differs:\n replayed: %s\n original: %s", i, len(got), len(want), g, w)
			}
		}
	}
	if len(want) < 50 {
		t.Errorf("only %d lines in the database; the random writes did too little", len(want))
	}
}

func TestRecord_offRecordsNothing(t *testing.T) {
	d, records := openRecording(t, filepath.Join(t.TempDir(), "x.db"), false)
	if err := d.Update(randomWrite(1, false)); err != nil {
		t.Fatal(err)
	}
	if recs := records(); len(recs) != 1 || recs[0] != nil {
		t.Errorf("records = %q, want one nil record", recs)
	}
}

func TestUpdate_afterCommitErrorFailsTheGroup(t *testing.T) {
	d, _ := openRecording(t, filepath.Join(t.TempDir(), "x.db"), true)
	refused := errors.New("journal refused")
	d.commit.afterCommit = func(*recorder) error { return refused }
	if err := d.Update(put("k", "v")); !errors.Is(err, refused) {
		t.Errorf("Update = %v, want %v", err, refused)
	}
}

func TestReplay_errorsNameWhatIsWrong(t *testing.T) {
	d := open(t, filepath.Join(t.TempDir(), "x.db"), recordOptions)
	rec := func(ops ...func(r *recorder)) []byte {
		r := &recorder{}
		for _, op := range ops {
			op(r)
		}
		return r.bytes()
	}
	at := func(names ...string) *Bucket {
		b := &Bucket{}
		for _, n := range names {
			b.path = appendName(b.path, []byte(n))
			b.depth++
		}
		return b
	}
	tests := []struct {
		name   string
		record []byte
		want   string // "" for no error
	}{
		{"put into a missing bucket", rec(func(r *recorder) { r.keyOp(opPut, at("t0", "gone"), []byte("k"), []byte("v")) }), `put "k": bucket "t0"/"gone" is missing`},
		{"delete in a missing bucket", rec(func(r *recorder) { r.keyOp(opDelete, at("gone"), []byte("k"), nil) }), ""},
		{"delete of a missing bucket", rec(func(r *recorder) { r.deleteBucket(nil, 0, []byte("gone")) }), ""},
		{"create bucket twice", rec(
			func(r *recorder) { r.createBucket(at("t0", "n")) },
			func(r *recorder) { r.createBucket(at("t0", "n")) },
		), ""},
		{"sequence of a missing bucket", rec(func(r *recorder) { r.setSequence(at("gone"), 3) }), `set sequence: bucket "gone" is missing`},
		{"unknown kind", []byte{9, 0}, "unknown op kind 9"},
		{"truncated value", rec(func(r *recorder) { r.keyOp(opPut, at("t0"), []byte("k"), []byte("value")) })[:9], "value of 5 bytes at byte 8 overruns the record"},
		{"huge depth", []byte{opPut, 0xff, 0xff, 0x03}, "path depth 65535"},
		{"key at the root", []byte{opPut, 0, 1, 'k', 1, 'v'}, "at the root"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := d.db.Update(func(tx *bolt.Tx) error { return replay(tx, tt.record) })
			if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
				t.Errorf("replay = %v, want %q", err, tt.want)
			}
		})
	}
}

func FuzzReplay(f *testing.F) {
	d := openFuzz(f)
	r := &recorder{}
	top := &Bucket{path: appendName(nil, []byte("t0")), depth: 1}
	r.keyOp(opPut, top, []byte("k"), []byte("v"))
	nested := &Bucket{path: appendName(append([]byte(nil), top.path...), []byte("n")), depth: 2}
	r.createBucket(nested)
	r.keyOp(opPut, nested, []byte("k"), []byte("v"))
	r.setSequence(nested, 7)
	r.keyOp(opDelete, top, []byte("k"), nil)
	r.deleteBucket(top.path, 1, []byte("n"))
	f.Add(r.bytes())
	f.Add([]byte{})
	f.Add([]byte{opPut, 1, 2, 't', '0', 0, 0})
	f.Add([]byte{opSetSequence, 1, 2, 't', '1', 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01})
	f.Add([]byte{opDeleteBucket, 1, 2, 't', '2'})
	f.Add([]byte{opCreateBucket, 0})
	f.Fuzz(func(t *testing.T, record []byte) {
		rollback := errors.New("rollback")
		err := d.db.Update(func(tx *bolt.Tx) error {
			if err := replay(tx, record); err != nil && !strings.HasPrefix(err.Error(), "replay: ") {
				t.Errorf("replay error %q does not say it is replay's", err)
			}
			return rollback
		})
		if !errors.Is(err, rollback) {
			t.Fatal(err)
		}
	})
}

func openFuzz(f *testing.F) *DB {
	d, err := Open(filepath.Join(f.TempDir(), "x.db"), Options{SchemaVersion: 1, Buckets: recordOptions.Buckets})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { d.Close() })
	return d
}

// A second Delete without a move would make bbolt delete the key that moved
// into the first one's place, unrecorded; the wrapper refuses it.
func TestCursor_deleteRefusesACursorOnNoKey(t *testing.T) {
	d, _ := openRecording(t, filepath.Join(t.TempDir(), "x.db"), true)
	if err := d.Update(func(tx *Tx) error {
		b := tx.Bucket(bucketThings)
		for _, k := range []string{"a", "b"} {
			if err := b.Put([]byte(k), []byte("v")); err != nil {
				return err
			}
		}
		c := b.Cursor()
		if err := c.Delete(); !errors.Is(err, errCursorOnNoKey) {
			t.Errorf("Delete before any move = %v, want %v", err, errCursorOnNoKey)
		}
		c.First()
		if err := c.Delete(); err != nil {
			return err
		}
		if err := c.Delete(); !errors.Is(err, errCursorOnNoKey) {
			t.Errorf("second Delete without a move = %v, want %v", err, errCursorOnNoKey)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := get(t, d, bucketThings, "b"); got != "v" {
		t.Errorf("b = %q after the refused delete, want it kept", got)
	}
}
