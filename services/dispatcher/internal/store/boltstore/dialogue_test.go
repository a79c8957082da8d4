package boltstore

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/parleyhq/parley/platform/boltdb"
	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

// A message to a few receivers keeps them in its record, not in
// dialogue_receipts (one bucket less in the commit of every direct
// message); a larger fan-out still uses the bucket. Either way a reply
// sees who received what, and a record written before (receipts in the
// bucket) reads as before.
func TestDialogueReceipts_fewKeptInTheRecord(t *testing.T) {
	s, err := Open(t.TempDir(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx := t.Context()
	const alice = "clients/c/agents/alice"
	now := time.Unix(1_800_000_000, 0).UTC()
	agents := func(n int) []string {
		var out []string
		for i := range n {
			out = append(out, fmt.Sprintf("clients/c/agents/r%03d", i))
		}
		return out
	}
	open := func(id string, to []string) {
		t.Helper()
		d := store.Dialogue{ID: id, Initiator: alice, Category: "message", CreateTime: now, Opener: id + "-m1"}
		m := store.DialogueMessage{ID: id + "-m1", Sender: alice, Type: "new_message", Time: now}
		w := store.MessageWrite{Message: m, Recipients: to, Mail: mailbox.Message{Sender: alice, Category: mailbox.CategoryMessage, Type: m.Type, Body: []byte(`"hi"`), Time: now}}
		if _, err := s.CreateDialogue(ctx, d, w, mailbox.Bound{}); err != nil {
			t.Fatal(err)
		}
	}
	few, many := agents(maxInlineReceipts), agents(maxInlineReceipts+1)
	open("few", few)
	if got := bucketLen(t, s, bucketDialogueReceipts); got != 0 {
		t.Errorf("receipts in the bucket after a message to %d = %d, want 0", len(few), got)
	}
	open("many", many)
	if got := bucketLen(t, s, bucketDialogueReceipts); got != len(many) {
		t.Errorf("receipts in the bucket after a message to %d = %d, want %d", len(many), got, len(many))
	}
	// Written by an older release: receipts in the bucket, none in the record.
	if err := s.db.Update(func(tx *boltdb.Tx) error {
		d := store.Dialogue{ID: "old", Initiator: alice, Category: "message", CreateTime: now}
		if err := putJSON(tx.Bucket(bucketDialogues), []byte(d.ID), d); err != nil {
			return err
		}
		if err := putJSON(tx.Bucket(bucketDialogues), messageKey("old-m1"), store.DialogueMessage{ID: "old-m1", DialogueID: "old", Sender: alice, Type: "new_message", Time: now}); err != nil {
			return err
		}
		return tx.Bucket(bucketDialogueReceipts).Put(join("old-m1", few[0]), nil)
	}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		msg  string
		want []string
	}{{"few-m1", few}, {"many-m1", many}, {"old-m1", few[:1]}} {
		if _, err := s.AddMessage(ctx, c.msg, mailbox.Bound{}, func(v store.DialogueView) (store.MessageWrite, error) {
			if got := v.Receivers(); !slices.Equal(got, c.want) {
				t.Errorf("%s: Receivers() = %v, want %v", c.msg, got, c.want)
			}
			if !v.Received(c.want[len(c.want)-1]) || v.Received(alice) || v.Received("clients/c/agents/zzz") {
				t.Errorf("%s: Received(last, sender, stranger) = %v, %v, %v; want true, false, false", c.msg, v.Received(c.want[len(c.want)-1]), v.Received(alice), v.Received("clients/c/agents/zzz"))
			}
			return store.MessageWrite{}, errors.New("only looking")
		}); err == nil {
			t.Fatalf("%s: AddMessage succeeded; the plan refused", c.msg)
		}
	}
}
