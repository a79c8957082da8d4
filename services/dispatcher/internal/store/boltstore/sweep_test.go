package boltstore

import (
	"fmt"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

// An entry of the payments' sweep index that names no payment (a
// stale entry, left by a bug) is dropped and counted like any other, so
// that the batched sweep moves past it: counted as nothing, a batch of
// such entries came back short, store.SweepInBatches stopped, and the
// payments due behind them were never swept.
func TestSweepPayments_dropsStaleIndexEntries(t *testing.T) {
	const stale = store.SweepBatch + 1 // more than one batch
	s, err := Open(t.TempDir(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.db.Update(func(tx *bolt.Tx) error {
		for i := range stale {
			if err := tx.Bucket(bucketSweepPayments).Put(append(putInt(int64(i+1)), fmt.Sprintf("gone%d", i)...), nil); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if n, err := store.SweepInBatches(t.Context(), time.Unix(1000, 0), s.SweepPayments); err != nil || n != stale {
		t.Errorf("SweepPayments in batches over %d stale index entries = %d, %v; want %d", stale, n, err, stale)
	}
	left := 0
	if err := s.db.View(func(tx *bolt.Tx) error {
		left = tx.Bucket(bucketSweepPayments).Stats().KeyN
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("payments_sweep holds %d entries after the sweep, want none", left)
	}
}

// A dialogue's opener is found through the dialogue record (Opener), so
// it has no entry in the message index (one bucket less in the commit of
// every new dialogue); its replies do. Sweeping the dialogue still removes
// both messages and their receipts, and a dialogue stored before Opener
// was kept (indexed opener) goes whole too.
func TestSweepDialogues_openerOutsideTheIndex(t *testing.T) {
	s, err := Open(t.TempDir(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx := t.Context()
	const alice, bob = "clients/c/agents/alice", "clients/c/agents/bob"
	now := time.Unix(1_800_000_000, 0).UTC()
	write := func(m store.DialogueMessage, to string) store.MessageWrite {
		return store.MessageWrite{Message: m, Recipients: []string{to}, Mail: mailbox.Message{Sender: m.Sender, Category: mailbox.CategoryMessage, Type: m.Type, Body: []byte(`"hi"`), Time: now}}
	}
	for _, d := range []store.Dialogue{
		{ID: "new", Initiator: alice, Category: "message", CreateTime: now, Opener: "new-m1"},
		{ID: "old", Initiator: alice, Category: "message", CreateTime: now}, // before Opener was kept
	} {
		m := store.DialogueMessage{ID: d.ID + "-m1", Sender: alice, Type: "new_message", Time: now}
		if _, err := s.CreateDialogue(ctx, d, write(m, bob), mailbox.Bound{}); err != nil {
			t.Fatal(err)
		}
		reply := store.DialogueMessage{ID: d.ID + "-m2", Sender: bob, Type: "message_response", InReplyTo: m.ID, Time: now}
		if _, err := s.AddMessage(ctx, m.ID, mailbox.Bound{}, func(store.DialogueView) (store.MessageWrite, error) { return write(reply, alice), nil }); err != nil {
			t.Fatal(err)
		}
	}
	if got := bucketLen(t, s, bucketDialogueMessageIndex); got != 3 {
		t.Errorf("message index entries = %d, want 3 (both replies and the opener without Opener)", got)
	}
	for _, id := range []string{"new", "old"} {
		if _, _, err := s.UpdateParticipant(ctx, id, alice, func(d *store.Dialogue, _ *store.Participant) error {
			d.Closed, d.CloseTime = true, now
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := s.SweepDialogues(ctx, now.Add(time.Hour), 10); err != nil || n != 2 {
		t.Fatalf("SweepDialogues = %d, %v; want 2", n, err)
	}
	for _, b := range dialogueBuckets {
		if got := bucketLen(t, s, b); got != 0 {
			t.Errorf("%s holds %d entries after both dialogues were swept, want none", b, got)
		}
	}
}
