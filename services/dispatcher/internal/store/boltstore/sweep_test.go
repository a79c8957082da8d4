package boltstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/parleyhq/parley/platform/boltdb"
	"github.com/parleyhq/parley/platform/sweep"
	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

// An entry of the payments' sweep index that names no payment (a
// stale entry, left by a bug) is dropped and counted like any other, so
// that the batched sweep moves past it: counted as nothing, a batch of
// such entries came back short, sweep.InBatches stopped, and the
// payments due behind them were never swept.
func TestSweepPayments_dropsStaleIndexEntries(t *testing.T) {
	const stale = sweep.Batch + 1 // more than one batch
	s, err := Open(t.TempDir(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.db.Update(func(tx *boltdb.Tx) error {
		for i := range stale {
			if err := tx.Bucket(bucketSweepPayments).Put(append(putInt(int64(i+1)), fmt.Sprintf("gone%d", i)...), nil); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if n, err := sweep.InBatches(t.Context(), time.Unix(1000, 0), s.SweepPayments); err != nil || n != stale {
		t.Errorf("SweepPayments in batches over %d stale index entries = %d, %v; want %d", stale, n, err, stale)
	}
	left := 0
	if err := s.db.View(func(tx *boltdb.Tx) error {
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
	if got := rowCount(t, s, bucketDialogues, kindMessageIndex); got != 3 {
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
	for _, b := range without(dialogueBuckets, bucketDialogues) {
		if got := bucketLen(t, s, b); got != 0 {
			t.Errorf("%s holds %d entries after both dialogues were swept, want none", b, got)
		}
	}
	// The mailboxes keep their bodies until compaction releases them.
	if all, bodies := bucketLen(t, s, bucketDialogues), rowCount(t, s, bucketDialogues, kindBody); all != bodies {
		t.Errorf("dialogues holds %d rows after both dialogues were swept, want only the %d mailbox bodies", all, bodies)
	}
	if got := rowCount(t, s, bucketAgents, kindAgentDialogue); got != 0 {
		t.Errorf("agents' dialogue rows after both dialogues were swept = %d, want none", got)
	}
}

// Each batched sweep checks an index entry against its record: a record
// updated after it was indexed (its time moved later) whose old entry was
// left behind (by a bug, or a version that did not move it) is not swept
// early by that entry. A sweep between the old and the new time keeps the
// record, drops the stale entry and keeps (or puts back) the record's own.
func TestSweeps_checkTheRecordsOwnTime(t *testing.T) {
	base := time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)
	old, cut, now := base, base.Add(36*time.Hour), base.Add(72*time.Hour)
	paid := store.Payment{ID: "pay", Payer: "clients/c/agents/a", State: store.PaymentCaptured, UpdateTime: now}
	rk := join(paid.Payer, "req")
	ork := join("clients/c/agents/a", "order")
	for _, tc := range []struct {
		name          string
		setup         func(tx *boltdb.Tx) error
		sweep         func(s *Store) func(context.Context, time.Time, int) (int, error)
		index, bucket []byte
		key           []byte // the record's, in bucket
		own, stale    []byte // its entries in index, now and before the update
	}{{
		name: "conversations",
		setup: func(tx *boltdb.Tx) error {
			c := store.Conversation{ID: "conv", Peer: "peer", ExpireTime: now}
			if err := tx.Bucket(bucketSweepConversations).Put(conversationSweepKey(c.ID, c.ExpireTime), nil); err != nil {
				return err
			}
			return putJSON(tx.Bucket(bucketConversations), []byte(c.ID), c)
		},
		sweep: func(s *Store) func(context.Context, time.Time, int) (int, error) { return s.SweepConversations },
		index: bucketSweepConversations, bucket: bucketConversations, key: []byte("conv"),
		own: conversationSweepKey("conv", now), stale: conversationSweepKey("conv", old),
	}, {
		name: "dialogue requests",
		setup: func(tx *boltdb.Tx) error {
			k := join("alice", "r")
			if err := tx.Bucket(bucketSweepDialogueRequests).Put(requestSweepKey(k, now), nil); err != nil {
				return err
			}
			return putJSON(tx.Bucket(bucketDialogueRequests), k, store.Request{Sender: "alice", ID: "r", Time: now})
		},
		sweep: func(s *Store) func(context.Context, time.Time, int) (int, error) { return s.SweepRequests },
		index: bucketSweepDialogueRequests, bucket: bucketDialogueRequests, key: join("alice", "r"),
		own: requestSweepKey(join("alice", "r"), now), stale: requestSweepKey(join("alice", "r"), old),
	}, {
		name: "payments",
		setup: func(tx *boltdb.Tx) error {
			if err := indexPayment(tx, nil, &paid); err != nil {
				return err
			}
			return putJSON(tx.Bucket(bucketPayments), []byte(paid.ID), paid)
		},
		sweep: func(s *Store) func(context.Context, time.Time, int) (int, error) { return s.SweepPayments },
		index: bucketSweepPayments, bucket: bucketPayments, key: []byte(paid.ID),
		own: sweepKey(paid), stale: append(putInt(old.UnixNano()), paid.ID...),
	}, {
		name:  "payment requests",
		setup: func(tx *boltdb.Tx) error { return recordRequest(tx, rk, nil, paid.ID, now) },
		sweep: func(s *Store) func(context.Context, time.Time, int) (int, error) { return s.SweepPaymentRequests },
		index: bucketSweepPaymentRequests, bucket: bucketPaymentRequests, key: rk,
		own: append(putInt(now.UnixNano()), rk...), stale: append(putInt(old.UnixNano()), rk...),
	}, {
		name: "spends",
		setup: func(tx *boltdb.Tx) error {
			day := now.Format(time.DateOnly)
			if err := tx.Bucket(bucketSpendDays).Put(join("clients/c/agents/a", day), putInt(5)); err != nil {
				return err
			}
			if err := tx.Bucket(bucketSweepSpends).Put(join(day, string(ork)), nil); err != nil {
				return err
			}
			return tx.Bucket(bucketSpendOrders).Put(ork, append(append([]byte(day), 0), putInt(5)...))
		},
		sweep: func(s *Store) func(context.Context, time.Time, int) (int, error) { return s.SweepSpends },
		index: bucketSweepSpends, bucket: bucketSpendOrders, key: ork,
		own: join(now.Format(time.DateOnly), string(ork)), stale: join(old.Format(time.DateOnly), string(ork)),
	}} {
		// With its own entry missing too, as an older version left it: the
		// sweep must put it back, or the record would never be swept.
		for _, ownMissing := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/own entry missing %v", tc.name, ownMissing), func(t *testing.T) {
				s, err := Open(t.TempDir(), time.Second)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { s.Close() })
				if err := s.db.Update(func(tx *boltdb.Tx) error {
					if err := tc.setup(tx); err != nil {
						return err
					}
					if ownMissing {
						if err := tx.Bucket(tc.index).Delete(tc.own); err != nil {
							return err
						}
					}
					return tx.Bucket(tc.index).Put(tc.stale, nil)
				}); err != nil {
					t.Fatal(err)
				}
				if _, err := sweep.InBatches(t.Context(), cut, tc.sweep(s)); err != nil {
					t.Fatal(err)
				}
				if err := s.db.View(func(tx *boltdb.Tx) error {
					if tx.Bucket(tc.bucket).Get(tc.key) == nil {
						t.Errorf("record %q gone after a sweep before its own time, by an entry of its old time", tc.key)
					}
					if tx.Bucket(tc.index).Get(tc.stale) != nil {
						t.Errorf("stale index entry %q kept, want it dropped", tc.stale)
					}
					if tx.Bucket(tc.index).Get(tc.own) == nil {
						t.Errorf("the record's own index entry %q missing after the sweep", tc.own)
					}
					return nil
				}); err != nil {
					t.Fatal(err)
				}
				// Past its own time, the record goes, with its entry.
				if _, err := sweep.InBatches(t.Context(), now.Add(48*time.Hour), tc.sweep(s)); err != nil {
					t.Fatal(err)
				}
				if err := s.db.View(func(tx *boltdb.Tx) error {
					if tx.Bucket(tc.bucket).Get(tc.key) != nil {
						t.Errorf("record %q kept after a sweep past its own time", tc.key)
					}
					if tx.Bucket(tc.index).Get(tc.own) != nil {
						t.Errorf("index entry %q kept after its record was swept", tc.own)
					}
					return nil
				}); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}
