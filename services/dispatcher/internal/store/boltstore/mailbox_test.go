package boltstore

import (
	"fmt"
	"testing"
	"time"

	"github.com/parleyhq/parley/platform/boltdb"
	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
)

func bucketLen(t *testing.T, s *Store, bucket []byte) int {
	t.Helper()
	n := 0
	if err := s.db.View(func(tx *boltdb.Tx) error { n = tx.Bucket(bucket).Stats().KeyN; return nil }); err != nil {
		t.Fatal(err)
	}
	return n
}

// rowCount counts the rows of kind in bucket (rows.go); records with kind
// < 0.
func rowCount(t *testing.T, s *Store, bucket []byte, kind int) int {
	t.Helper()
	n := 0
	err := s.db.View(func(tx *boltdb.Tx) error {
		return tx.Bucket(bucket).ForEach(func(k, _ []byte) error {
			if _, kd, _, record := splitRow(k); (record && kind < 0) || (!record && int(kd) == kind) {
				n++
			}
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// The body is stored once however many mailboxes hold it, and goes when
// the last reference is compacted away.
func TestAppendMessage_storesTheBodyOnce(t *testing.T) {
	s, err := Open(t.TempDir(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := t.Context()
	var agents []string
	for i := range 50 {
		agents = append(agents, fmt.Sprintf("clients/c/agents/a%d", i))
	}
	now := time.Unix(1_800_000_000, 0)
	m := mailbox.Message{ID: "m1", DialogueID: "d", Category: mailbox.CategorySubscription, Type: "broadcast", Body: []byte(`"news"`), Time: now}
	before := s.db.Commits()
	if _, _, err := s.AppendMessage(ctx, m, agents, mailbox.Bound{}); err != nil {
		t.Fatal(err)
	}
	if after := s.db.Commits(); after.Synced != before.Synced+1 || after.Unsynced != 0 {
		t.Errorf("AppendMessage to 50 took commits %+v -> %+v; want exactly one synced commit", before, after)
	}
	if got := rowCount(t, s, bucketDialogues, kindBody); got != 1 {
		t.Errorf("messages stored = %d, want 1 for 50 recipients", got)
	}
	if got := rowCount(t, s, bucketAgents, kindRef); got != 50 {
		t.Errorf("mailbox references = %d, want 50", got)
	}
	for i, a := range agents {
		if _, err := s.ClearMailbox(ctx, a); err != nil {
			t.Fatal(err)
		}
		if _, err := s.CompactMailboxes(ctx, now.Add(time.Second), 100); err != nil {
			t.Fatal(err)
		}
		if want, got := min(1, len(agents)-1-i), rowCount(t, s, bucketDialogues, kindBody); got != want {
			t.Fatalf("messages stored after compacting %d of 50 mailboxes = %d, want %d", i+1, got, want)
		}
	}
	if got := rowCount(t, s, bucketDialogues, kindRefCount); got != 0 {
		t.Errorf("reference counts left = %d, want 0", got)
	}
}

// A message in one mailbox keeps no reference count (one less bucket in
// the commit of every direct message: an absent count is one), and goes
// when that mailbox's reference is compacted away.
func TestAppendMessage_oneRecipientKeepsNoCount(t *testing.T) {
	s, err := Open(t.TempDir(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := t.Context()
	now := time.Unix(1_800_000_000, 0)
	m := mailbox.Message{ID: "m1", DialogueID: "d", Category: mailbox.CategoryMessage, Type: "t", Body: []byte(`"hi"`), Time: now}
	if _, _, err := s.AppendMessage(ctx, m, []string{"clients/c/agents/b"}, mailbox.Bound{}); err != nil {
		t.Fatal(err)
	}
	if got := rowCount(t, s, bucketDialogues, kindRefCount); got != 0 {
		t.Errorf("reference counts after a one-recipient append = %d, want 0", got)
	}
	if got := rowCount(t, s, bucketDialogues, kindBody); got != 1 {
		t.Fatalf("messages stored = %d, want 1", got)
	}
	if _, err := s.ClearMailbox(ctx, "clients/c/agents/b"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CompactMailboxes(ctx, now.Add(time.Second), 100); err != nil {
		t.Fatal(err)
	}
	if got := rowCount(t, s, bucketDialogues, kindBody); got != 0 {
		t.Errorf("messages stored after compaction = %d, want 0", got)
	}
}
