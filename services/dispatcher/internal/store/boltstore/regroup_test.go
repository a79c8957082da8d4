package boltstore

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/parleyhq/parley/platform/boltdb"
	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

// schema12File is a schema-12 file of n direct sends among 20 agents,
// written row by row as schema 12 did: each dialogue's record,
// participants, agent index entries and opener's record and body, every
// second one a pair state, every third a reference count, every fourth a
// reply in the message index, and each receiver's reference and mailbox
// state. legacyRows is how many rows the old buckets hold.
type schema12File struct {
	dir        string
	n          int
	legacyRows int
	refs       map[string]int // mailbox references per agent
}

func writeSchema12(t *testing.T, n int) schema12File {
	t.Helper()
	t0 := time.Unix(1_800_000_000, 0).UTC()
	f := schema12File{dir: t.TempDir(), n: n, refs: map[string]int{}}
	agent := func(i int) string { return fmt.Sprintf("clients/c/agents/a%02d", i%20) }
	writeSchemaFile(t, f.dir, 12, schema12Buckets(), func(tx *boltdb.Tx) error {
		f.legacyRows = 0
		clear(f.refs)
		put := func(bucket, k, v []byte) error {
			if !bytes.Equal(bucket, bucketDialogues) {
				f.legacyRows++
			}
			return tx.Bucket(bucket).Put(k, v)
		}
		for i := range n {
			d, m, from, to := fmt.Sprintf("d%06d", i), fmt.Sprintf("m%06d", i), agent(i), agent(i*7+1)
			if err := putJSON(tx.Bucket(bucketDialogues), []byte(d), store.Dialogue{ID: d, Initiator: from, Category: "message", CreateTime: t0, Opener: m}); err != nil {
				return err
			}
			msg := storedMessage{DialogueMessage: store.DialogueMessage{ID: m, DialogueID: d, Sender: from, Type: "new_message", Time: t0}, Receivers: []string{to}}
			rec, _ := json.Marshal(msg)
			body := mailbox.Message{ID: m, DialogueID: d, Sender: from, Category: mailbox.CategoryMessage, Type: "new_message", Body: []byte(`{"text":"hello"}`), Time: t0}
			f.refs[to]++
			rows := []struct{ bucket, k, v []byte }{
				{legacyDialogueMessages, []byte(m), rec},
				{legacyMessages, []byte(m), encodeMessage(body)},
				{legacyDialogueParticipants, join(d, from), []byte(`{"agent":"` + from + `"}`)},
				{legacyDialogueParticipants, join(d, to), []byte(`{"agent":"` + to + `"}`)},
				{legacyAgentDialogues, join(from, d), nil},
				{legacyAgentDialogues, join(to, d), nil},
				{legacyMailboxRefs, refKey(to, uint64(f.refs[to])), encodeRef(ref{sent: t0.UnixNano(), size: int64(len(body.Body)), id: m})},
			}
			if i%2 == 0 {
				rows = append(rows, struct{ bucket, k, v []byte }{legacyDialoguePairs, pairKey(d, store.Pair{A: from, B: to}), []byte(`{"s":1}`)})
			}
			if i%3 == 0 {
				rows = append(rows, struct{ bucket, k, v []byte }{legacyMessageRefs, []byte(m), binary.BigEndian.AppendUint64(nil, 1)})
			}
			if i%4 == 0 {
				rows = append(rows, struct{ bucket, k, v []byte }{legacyDialogueMessageIndex, join(d, m+"-r"), nil})
			}
			for _, r := range rows {
				if err := put(r.bucket, r.k, r.v); err != nil {
					return err
				}
			}
		}
		for a, refs := range f.refs {
			if err := put(legacyMailboxes, []byte(a), legacyState(mailbox.State{Head: uint64(refs), Pending: int64(refs), PendingBytes: int64(refs * 16)})); err != nil {
				return err
			}
		}
		return nil
	})
	return f
}

// dumpRows returns every row of bucketAgents and bucketDialogues, by
// bucket and key.
func dumpRows(t *testing.T, db *boltdb.DB) map[string]string {
	t.Helper()
	rows := map[string]string{}
	err := db.View(func(tx *boltdb.Tx) error {
		for _, b := range [][]byte{bucketAgents, bucketDialogues} {
			err := tx.Bucket(b).ForEach(func(k, v []byte) error {
				rows[string(b)+"/"+string(k)] = string(v)
				return nil
			})
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

// regroupedRows is what f regroups into: the rows of a copy of f opened
// in one batch.
func regroupedRows(t *testing.T, n int) map[string]string {
	t.Helper()
	f := writeSchema12(t, n)
	s, err := OpenWith(f.dir, time.Second, Options{batchRows: 1 << 30, batchBytes: 1 << 40})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	return dumpRows(t, s.db)
}

// checkRegrouped fails unless s holds want, every old bucket and the
// marker are gone, and the store reads the moved rows.
func checkRegrouped(t *testing.T, s *Store, f schema12File, want map[string]string) {
	t.Helper()
	got := dumpRows(t, s.db)
	if len(got) != f.n+f.legacyRows {
		t.Errorf("rows after the regroup = %d, want %d dialogue records and %d moved rows", len(got), f.n, f.legacyRows)
	}
	if !maps.Equal(got, want) {
		t.Errorf("rows after the regroup differ from those of a regroup in one batch (%d rows, want %d)", len(got), len(want))
	}
	err := s.db.View(func(tx *boltdb.Tx) error {
		for _, b := range append([][]byte{bucketRegroup}, legacyBuckets...) {
			if tx.Bucket(b) != nil {
				t.Errorf("bucket %s is still there after the regroup", b)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	for agent, refs := range f.refs {
		if ds, err := s.ReadMailbox(ctx, agent, 0, 1000); err != nil || len(ds) != refs {
			t.Errorf("ReadMailbox(%s) = %d messages, %v; want %d", agent, len(ds), err, refs)
		}
	}
	last := fmt.Sprintf("m%06d", f.n-1)
	if m, err := s.GetDialogueMessage(ctx, last); err != nil || m.ID != last {
		t.Errorf("GetDialogueMessage(%s) = %+v, %v", last, m, err)
	}
}

// A schema-12 file of more rows than a batch is regrouped in batches of at
// most the batch's rows, all of them moved.
func TestOpen_regroupsInBatchesOfRows(t *testing.T) {
	const n, batch = 300, 97
	want := regroupedRows(t, n)
	f := writeSchema12(t, n)
	var batches []int
	s, err := OpenWith(f.dir, time.Second, Options{batchRows: batch, afterBatch: func(rows, _ int) error {
		batches = append(batches, rows)
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if wantBatches := (f.legacyRows + batch - 1) / batch; len(batches) != wantBatches {
		t.Errorf("the regroup of %d rows took %d batches, want %d", f.legacyRows, len(batches), wantBatches)
	}
	for i, rows := range batches {
		if rows > batch {
			t.Errorf("batch %d moved %d rows, want at most %d", i, rows, batch)
		}
	}
	checkRegrouped(t, s, f, want)
}

// A batch also stops at its bytes (keys and values read), unless its first
// row alone passes them.
func TestOpen_regroupsInBatchesOfBytes(t *testing.T) {
	const n, limit = 200, 4096
	want := regroupedRows(t, n)
	f := writeSchema12(t, n)
	batches, total := 0, 0
	s, err := OpenWith(f.dir, time.Second, Options{batchBytes: limit, afterBatch: func(rows, size int) error {
		batches++
		total += rows
		if size > limit && rows > 1 {
			t.Errorf("batch %d read %d bytes in %d rows, want at most %d", batches, size, rows, limit)
		}
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if total != f.legacyRows || batches < 10 {
		t.Errorf("the regroup moved %d rows in %d batches, want %d in at least 10", total, batches, f.legacyRows)
	}
	checkRegrouped(t, s, f, want)
}

var errCrash = errors.New("crash (test)")

// A regroup stopped after some batches (as by a crash: each batch is its
// own transaction) leaves a file that records schema 13, so that an older
// release refuses it, with every row in exactly one place; the next Open
// resumes it, and every row is then read back once.
func TestOpen_resumesRegroupAfterCrash(t *testing.T) {
	const n, batch, crashAfter = 300, 100, 3
	want := regroupedRows(t, n)
	f := writeSchema12(t, n)
	batches := 0
	_, err := OpenWith(f.dir, time.Second, Options{batchRows: batch, afterBatch: func(int, int) error {
		if batches++; batches == crashAfter {
			return errCrash
		}
		return nil
	}})
	if !errors.Is(err, errCrash) {
		t.Fatalf("Open stopped after %d batches = %v, want %v", crashAfter, err, errCrash)
	}

	path := filepath.Join(f.dir, FileName)
	raw, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	err = raw.View(func(tx *bolt.Tx) error {
		if v := string(tx.Bucket([]byte("meta")).Get([]byte("schema_version"))); v != "13" {
			t.Errorf("schema_version mid-regroup = %q, want 13", v)
		}
		if v := tx.Bucket(bucketRegroup); v == nil || string(v.Get(keyRegroupFrom)) != "12" {
			t.Errorf("marker mid-regroup = %v, want bucket %s with from = 12", v, bucketRegroup)
		}
		left := 0
		for _, b := range legacyBuckets {
			left += tx.Bucket(b).Stats().KeyN
		}
		moved := tx.Bucket(bucketAgents).Stats().KeyN + tx.Bucket(bucketDialogues).Stats().KeyN - f.n
		if moved != crashAfter*batch || left+moved != f.legacyRows {
			t.Errorf("mid-regroup: %d rows moved and %d left, want %d moved and %d in all", moved, left, crashAfter*batch, f.legacyRows)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := raw.Close(); err != nil {
		t.Fatal(err)
	}
	if db, err := boltdb.Open(path, boltdb.Options{SchemaVersion: 12, LockTimeout: time.Second}); err == nil || !strings.Contains(err.Error(), "schema version 13 is not supported") {
		if err == nil {
			db.Close()
		}
		t.Errorf("a schema-12 release's Open of the file mid-regroup = %v, want it refused", err)
	}

	s, err := OpenWith(f.dir, time.Second, Options{batchRows: batch})
	if err != nil {
		t.Fatalf("Open after the crash: %v", err)
	}
	defer s.Close()
	checkRegrouped(t, s, f, want)
}

// A schema-2 file whose regroup stopped after a batch runs schema 3's
// step (the compaction work list, built from the moved rows) when the
// next Open ends the regroup: the mark kept the version it came from.
func TestOpen_resumedRegroupRunsOlderSteps(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0).UTC()
	const bob = "clients/b/agents/bob"
	dir := t.TempDir()
	writeSchemaFile(t, dir, 2, without(schema12Buckets(), bucketMailboxCompaction), func(tx *boltdb.Tx) error {
		for i, id := range []string{"m1", "m2"} {
			if err := tx.Bucket(legacyMessages).Put([]byte(id), encodeMessage(mailbox.Message{ID: id, Time: t0})); err != nil {
				return err
			}
			if err := tx.Bucket(legacyMailboxRefs).Put(refKey(bob, uint64(i+1)), encodeRef(ref{sent: t0.UnixNano(), id: id})); err != nil {
				return err
			}
		}
		return tx.Bucket(legacyMailboxes).Put([]byte(bob), legacyState(mailbox.State{Head: 2, Acked: 1, Pending: 1}))
	})
	if _, err := OpenWith(dir, time.Second, Options{batchRows: 1, afterBatch: func(int, int) error { return errCrash }}); !errors.Is(err, errCrash) {
		t.Fatalf("Open stopped after a batch = %v, want %v", err, errCrash)
	}
	var logs bytes.Buffer
	s, err := OpenWith(dir, time.Second, Options{Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	if err != nil {
		t.Fatalf("Open after the crash: %v", err)
	}
	defer s.Close()
	if !strings.Contains(logs.String(), `"from_schema":2`) || !strings.Contains(logs.String(), `"rows_moved":4`) {
		t.Errorf("Open after the crash logged %s, want the resumed regroup from schema 2 and its 4 rows moved", logs.String())
	}
	if n, err := s.CompactMailboxes(t.Context(), t0.Add(time.Hour), 10); err != nil || n != 1 {
		t.Errorf("CompactMailboxes after the resumed migration = %d, %v; want 1", n, err)
	}
}
