package boltstore

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/parleyhq/parley/platform/boltdb"
	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
	"github.com/parleyhq/parley/services/dispatcher/internal/notify"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

// A schema-1 database (no dialogue indexes) is migrated on open: its
// closed dialogue is then found and removed by SweepDialogues, with its
// message, and its open one is kept.
func TestOpen_migratesSchema1DialogueIndexes(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0).UTC()
	put := func(tx *boltdb.Tx, bucket []byte, key string, v any) {
		data, _ := json.Marshal(v)
		if err := tx.Bucket(bucket).Put([]byte(key), data); err != nil {
			t.Fatal(err)
		}
	}
	s := openSchema(t, 1, without(schema12Buckets(), bucketDialoguesClosed, bucketSweepDialogueRequests, legacyDialogueMessageIndex), func(tx *boltdb.Tx) error {
		put(tx, bucketDialogues, "closed", store.Dialogue{ID: "closed", Initiator: "clients/a/agents/a", Category: "message", CreateTime: t0, Closed: true})
		put(tx, legacyDialogueMessages, "closed-m1", store.DialogueMessage{ID: "closed-m1", DialogueID: "closed", Sender: "clients/a/agents/a", Type: "x", Time: t0})
		put(tx, bucketDialogues, "open", store.Dialogue{ID: "open", Initiator: "clients/a/agents/a", Category: "message", CreateTime: t0})
		return nil
	})
	ctx := t.Context()
	if n, err := s.SweepDialogues(ctx, t0.Add(time.Hour), 10); err != nil || n != 1 {
		t.Fatalf("SweepDialogues after the migration = %d, %v; want 1", n, err)
	}
	if _, err := s.GetDialogueMessage(ctx, "closed-m1"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetDialogueMessage(closed-m1) = %v, want it removed with its dialogue", err)
	}
	if _, err := s.GetDialogue(ctx, "open"); err != nil {
		t.Errorf("GetDialogue(open) = %v, want it kept", err)
	}
}

// A schema-2 database (no compaction work list) is migrated on open: its
// acknowledged, old reference is then compacted, and the unacknowledged
// one is kept.
func TestOpen_migratesSchema2CompactionQueue(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0).UTC()
	buckets := without(schema12Buckets(), bucketMailboxCompaction)
	const bob = "clients/b/agents/bob"
	s := openSchema(t, 2, buckets, func(tx *boltdb.Tx) error {
		for i, id := range []string{"m1", "m2"} {
			data, _ := json.Marshal(mailbox.Message{ID: id, DialogueID: "d", Category: mailbox.CategoryMessage, Type: "x", Time: t0})
			if err := tx.Bucket(legacyMessages).Put([]byte(id), data); err != nil {
				return err
			}
			if err := tx.Bucket(legacyMessageRefs).Put([]byte(id), binary.BigEndian.AppendUint64(nil, 1)); err != nil {
				return err
			}
			if err := tx.Bucket(legacyMailboxRefs).Put(refKey(bob, uint64(i+1)), encodeRef(ref{sent: t0.UnixNano(), id: id})); err != nil {
				return err
			}
		}
		return tx.Bucket(legacyMailboxes).Put([]byte(bob), legacyState(mailbox.State{Head: 2, Acked: 1, Pending: 1}))
	})
	ctx := t.Context()
	if n, err := s.CompactMailboxes(ctx, t0.Add(time.Hour), 10); err != nil || n != 1 {
		t.Fatalf("CompactMailboxes after the migration = %d, %v; want 1", n, err)
	}
	if left, err := s.ReadMailbox(ctx, bob, 0, 10); err != nil || len(left) != 1 || left[0].Message.ID != "m2" {
		t.Errorf("ReadMailbox(bob) = %+v, %v; want only m2, unacknowledged", left, err)
	}
}

// A schema-3 database (no payment indexes) is migrated on open: a create
// then counts the payer's payments not captured, and the sweep finds the
// payments not reserved.
func TestOpen_migratesSchema3PaymentIndexes(t *testing.T) {
	buckets := without(schema12Buckets(), bucketOpenPayments, bucketPaymentRequests, bucketNotificationRetries)
	const alice, bob = "clients/a/agents/alice", "clients/b/agents/bob"
	paid := time.Date(2026, 12, 2, 10, 0, 0, 123456000, time.UTC)
	s := openSchema(t, 3, buckets, func(tx *boltdb.Tx) error {
		for id, st := range map[string]store.PaymentState{"p1": store.PaymentAuthorized, "p2": store.PaymentReserved, "p3": store.PaymentCaptured} {
			if err := putJSON(tx.Bucket(bucketPayments), []byte(id), store.Payment{ID: id, Payer: alice, Payee: bob, AmountMicros: 1, Currency: "USD", State: st, UpdateTime: paid}); err != nil {
				return err
			}
		}
		return nil
	})
	open := -1
	p := store.Payment{ID: "p4", Payer: alice, Payee: bob, AmountMicros: 1, Currency: "USD", State: store.PaymentAuthorized, UpdateTime: paid.Add(2 * time.Hour)}
	if _, _, err := s.CreatePayment(t.Context(), p, "", func(n int) error { open = n; return nil }); err != nil || open != 2 {
		t.Errorf("CreatePayment after the migration saw %d open payments (%v), want 2", open, err)
	}
	// The sweep removes the payments not reserved, by their update time.
	if n, err := s.SweepPayments(t.Context(), paid.Add(time.Hour), 10); err != nil || n != 2 {
		t.Errorf("SweepPayments after the migration = %d, %v; want 2", n, err)
	}
}

// A schema-5 database (no index of the request ids by time) is migrated
// on open: the sweep then forgets the ids recorded before its time, and
// only those.
func TestOpen_migratesSchema5PaymentRequestIndex(t *testing.T) {
	buckets := without(schema12Buckets(), bucketSweepPaymentRequests, bucketNotificationRetries)
	const alice = "clients/a/agents/alice"
	recorded := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	s := openSchema(t, 5, buckets, func(tx *boltdb.Tx) error {
		b := tx.Bucket(bucketPaymentRequests)
		for i, id := range []string{"r-old", "r-new"} {
			at := recorded.Add(time.Duration(i) * time.Hour)
			if err := b.Put(join(alice, id), append([]byte("p"+id+"\x00"), putInt(at.UnixNano())...)); err != nil {
				return err
			}
		}
		return nil
	})
	for _, want := range []int{1, 0} {
		if n, err := s.SweepPaymentRequests(t.Context(), recorded.Add(time.Minute), 10); err != nil || n != want {
			t.Errorf("SweepPaymentRequests after the migration = %d, %v; want %d", n, err, want)
		}
	}
	if n, err := s.SweepPaymentRequests(t.Context(), recorded.Add(2*time.Hour), 10); err != nil || n != 1 {
		t.Errorf("SweepPaymentRequests(all) after the migration = %d, %v; want 1", n, err)
	}
}

// A schema-6 database (no notification_retries) opens with the bucket,
// empty (until then the registry's outbox kept waiting notifications),
// and the relay's waiting notifications are then stored.
func TestOpen_migratesSchema6NotificationRetries(t *testing.T) {
	s := openSchema(t, 6, without(schema12Buckets(), bucketNotificationRetries), nil)
	ctx := t.Context()
	if w, err := s.NotificationRetries(ctx); err != nil || len(w) != 0 {
		t.Fatalf("NotificationRetries after the migration = %v, %v; want none", w, err)
	}
	if err := s.PutNotificationRetry(ctx, notify.Waiting{Sequence: 1, Notification: []byte("n")}); err != nil {
		t.Errorf("PutNotificationRetry after the migration = %v", err)
	}
}

// A schema-7 database (one offer's terms per pair) is migrated on open:
// the pair's terms are then kept under message id "" (read when an
// acceptance's chain of messages recorded none), beside an offer's own.
func TestOpen_migratesSchema7OfferTerms(t *testing.T) {
	const bob = "clients/b/agents/bob"
	s := openSchema(t, 7, schema12Buckets(), func(tx *boltdb.Tx) error {
		if err := tx.Bucket(bucketDialogues).Put([]byte("d1"), []byte(`{"id":"d1"}`)); err != nil { // SetOfferTerms needs it
			return err
		}
		return tx.Bucket(bucketOfferTerms).Put(join("d1", bob), []byte(`{"a":1}`))
	})
	ctx := t.Context()
	if got, err := s.OfferTerms(ctx, "d1", bob, ""); err != nil || string(got) != `{"a":1}` {
		t.Errorf("OfferTerms(d1, bob, \"\") after the migration = %s, %v; want {\"a\":1}", got, err)
	}
	if err := s.SetOfferTerms(ctx, "d1", bob, "offer2", json.RawMessage(`{"a":2}`)); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]string{"": `{"a":1}`, "offer1": "", "offer2": `{"a":2}`} {
		if got, err := s.OfferTerms(ctx, "d1", bob, id); err != nil || string(got) != want {
			t.Errorf("OfferTerms(d1, bob, %s) after a new offer = %s, %v; want %s", id, got, err, want)
		}
	}
}

// A schema-8 database (no sweep indexes of conversations and dialogue
// request ids) is migrated on open: each sweep then removes what is due
// by the old records' times, and only that.
func TestOpen_migratesSchema8SweepIndexes(t *testing.T) {
	buckets := without(schema12Buckets(), bucketSweepConversations, bucketSweepDialogueRequests)
	const alice = "clients/a/agents/alice"
	t0 := time.Unix(1_800_000_000, 0).UTC()
	put := func(tx *boltdb.Tx, bucket, key []byte, v any) {
		data, _ := json.Marshal(v)
		if err := tx.Bucket(bucket).Put(key, data); err != nil {
			t.Fatal(err)
		}
	}
	s := openSchema(t, 8, buckets, func(tx *boltdb.Tx) error {
		for i, id := range []string{"c-old", "c-new"} {
			c := store.Conversation{ID: id, Agent: alice, Peer: "p", CreateTime: t0, ExpireTime: t0.Add(time.Duration(i) * time.Hour)}
			put(tx, bucketConversations, []byte(id), c)
			if err := tx.Bucket(bucketPeerConversations).Put(peerKey(c.Peer, id), expiryBytes(c.ExpireTime)); err != nil {
				return err
			}
			put(tx, bucketDialogueRequests, join(alice, "r"+id[1:]), store.Request{Sender: alice, ID: "r" + id[1:], Time: c.ExpireTime})
		}
		return nil
	})
	ctx := t.Context()
	for _, want := range []int{1, 0} {
		if n, err := s.SweepConversations(ctx, t0.Add(time.Minute), 10); err != nil || n != want {
			t.Errorf("SweepConversations after the migration = %d, %v; want %d", n, err, want)
		}
		if n, err := s.SweepRequests(ctx, t0.Add(time.Minute), 10); err != nil || n != want {
			t.Errorf("SweepRequests after the migration = %d, %v; want %d", n, err, want)
		}
	}
	if _, err := s.GetConversation(ctx, "c-old"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetConversation(c-old) after the sweep = %v, want ErrNotFound", err)
	}
	if _, found, err := s.BeginRequest(ctx, alice, "r-new", t0.Add(2*time.Hour), t0); err != nil || !found {
		t.Errorf("BeginRequest(r-new) after the sweep = found %t, %v; want it kept", found, err)
	}
	// The old peer index entry went with its conversation: p holds one.
	if err := s.CreateConversation(ctx, store.Conversation{ID: "c3", Agent: alice, Peer: "p", CreateTime: t0, ExpireTime: t0.Add(time.Hour)}, 2, t0.Add(-time.Hour)); err != nil {
		t.Errorf("CreateConversation(p, cap 2) after the sweep = %v, want it created", err)
	}
	if n, err := s.SweepConversations(ctx, t0.Add(2*time.Hour), 10); err != nil || n != 2 {
		t.Errorf("SweepConversations(all) after the migration = %d, %v; want 2", n, err)
	}
}

// A schema-9 database (no spend sweep index) is migrated on open: its
// counted orders are indexed by day, so that SweepSpends finds the old
// day's and keeps today's, and the day total of 0 that RemoveSpend left
// is dropped.
func TestOpen_migratesSchema9SpendSweepIndex(t *testing.T) {
	buckets := without(schema12Buckets(), bucketSweepSpends)
	const alice = "clients/a/agents/alice"
	// As schema 9's AddSpend and RemoveSpend wrote them: o-old and o-new
	// counted, and a removed order's day left at 0.
	s := openSchema(t, 9, buckets, func(tx *boltdb.Tx) error {
		days, orders := tx.Bucket(bucketSpendDays), tx.Bucket(bucketSpendOrders)
		for _, o := range []struct {
			order, day string
			amount     int64
		}{{"o-old", "2026-10-01", 5}, {"o-new", "2026-12-02", 7}} {
			if err := days.Put(join(alice, o.day), putInt(o.amount)); err != nil {
				return err
			}
			if err := orders.Put(join(alice, o.order), append(append([]byte(o.day), 0), putInt(o.amount)...)); err != nil {
				return err
			}
		}
		return days.Put(join(alice, "2026-11-01"), putInt(0))
	})
	ctx := t.Context()
	for _, want := range []int{1, 0} {
		if n, err := s.SweepSpends(ctx, time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC), 10); err != nil || n != want {
			t.Errorf("SweepSpends after the migration = %d, %v; want %d", n, err, want)
		}
	}
	var left [][]byte
	err := s.db.View(func(tx *boltdb.Tx) error {
		return tx.Bucket(bucketSpendDays).ForEach(func(k, _ []byte) error { left = append(left, bytes.Clone(k)); return nil })
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := [][]byte{join(alice, "2026-12-02")}; !slices.EqualFunc(left, want, bytes.Equal) {
		t.Errorf("day totals after the migration and the sweep = %q, want %q: today's only", left, want)
	}
	counted := s.AddSpend(ctx, store.Spend{Agent: alice, Day: "2026-12-02", Order: "o-new", AmountMicros: 7}, func(int64) error {
		return errors.New("counted again")
	})
	if counted != nil {
		t.Errorf("AddSpend(o-new) after the sweep = %v, want it still counted", counted)
	}
	if n, err := s.SweepSpends(ctx, time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC), 10); err != nil || n != 1 {
		t.Errorf("SweepSpends(all) after the migration = %d, %v; want 1", n, err)
	}
}

// A schema-10 database holds its timers as JSON: they open as they are
// (no rewrite at the restart), are listed, put off and fired, and a timer
// put off is stored again in the binary form; both forms are read.
func TestOpen_schema10JSONTimersFire(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0).UTC()
	timers := []store.Timer{
		{Dialogue: "d1", Initiator: "clients/a/agents/c", Counterpart: "clients/b/agents/s", Protocol: "p", Name: "offer_timeout", At: t0},
		{Dialogue: "d2", Initiator: "clients/a/agents/c", Counterpart: "clients/b/agents/s", Protocol: "p", Name: "offer_timeout", At: t0.Add(time.Second),
			Retry: t0.Add(2 * time.Second), Failures: 3},
	}
	s := openSchema(t, 10, schema12Buckets(), func(tx *boltdb.Tx) error {
		for _, tm := range timers { // as schema 10's putTimers wrote them
			if err := putJSON(tx.Bucket(bucketTimers), timerKey(tm), tm); err != nil {
				return err
			}
			if err := tx.Bucket(bucketTimerIDs).Put(timerID(tm), timerKey(tm)); err != nil {
				return err
			}
		}
		return nil
	})
	ctx := t.Context()
	if next, ok, err := s.NextTimer(ctx); err != nil || !ok || next != timers[0] {
		t.Fatalf("NextTimer() = %+v, %v, %v; want %+v", next, ok, err, timers[0])
	}
	due, err := s.DueTimers(ctx, t0.Add(time.Hour), 10)
	if err != nil || !slices.Equal(due, timers) {
		t.Fatalf("DueTimers() = %+v, %v; want %+v", due, err, timers)
	}
	if err := s.RetryTimers(ctx, []store.TimerRetry{{Timer: timers[1], Retry: t0.Add(time.Minute)}}); err != nil {
		t.Fatal(err)
	}
	put := timers[1]
	put.Failures, put.Retry = 4, t0.Add(time.Minute)
	err = s.db.View(func(tx *boltdb.Tx) error {
		if v := tx.Bucket(bucketTimers).Get(timerKey(put)); len(v) == 0 || v[0] == '{' {
			t.Errorf("the timer put off is stored as %q, want the binary form", v)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if due, err = s.DueTimers(ctx, t0.Add(time.Hour), 10); err != nil || !slices.Equal(due, []store.Timer{timers[0], put}) {
		t.Fatalf("DueTimers() after the retry = %+v, %v; want %+v", due, err, []store.Timer{timers[0], put})
	}
	fired, err := s.FireTimers(ctx, due, mailbox.Bound{}, func(store.Timer, json.RawMessage) (store.TimerFiring, error) { return store.TimerFiring{}, nil })
	if err != nil || len(fired) != 2 {
		t.Fatalf("FireTimers() = %d fired, %v; want both", len(fired), err)
	}
	if _, ok, err := s.NextTimer(ctx); err != nil || ok {
		t.Errorf("NextTimer() after the firing = %v, %v; want none", ok, err)
	}
}

// A schema-10 database holds its mailboxes' messages as JSON: they are read
// as they are, next to a message appended after the upgrade in the binary
// form.
func TestOpen_schema10JSONMessagesRead(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0).UTC()
	const bob = "clients/b/agents/bob"
	old := mailbox.Message{ID: "m1", DialogueID: "d", Sender: "clients/a/agents/alice", Category: mailbox.CategoryMessage, Type: "x",
		InReplyTo: "m0", Body: []byte(`{"n":1}`), Time: t0}
	s := openSchema(t, 10, schema12Buckets(), func(tx *boltdb.Tx) error {
		data, _ := json.Marshal(old) // as schema 10's appendOp wrote it
		if err := tx.Bucket(legacyMessages).Put([]byte(old.ID), data); err != nil {
			return err
		}
		if err := tx.Bucket(legacyMessageRefs).Put([]byte(old.ID), binary.BigEndian.AppendUint64(nil, 1)); err != nil {
			return err
		}
		if err := tx.Bucket(legacyMailboxRefs).Put(refKey(bob, 1), encodeRef(ref{sent: t0.UnixNano(), size: int64(len(old.Body)), id: old.ID})); err != nil {
			return err
		}
		return tx.Bucket(legacyMailboxes).Put([]byte(bob), legacyState(mailbox.State{Head: 1, Pending: 1, PendingBytes: int64(len(old.Body))}))
	})
	ctx := t.Context()
	next := mailbox.Message{ID: "m2", DialogueID: "d", Category: mailbox.CategoryService, Type: "offer_timeout_expired",
		Protocol: strings.Repeat("a", 40), RecipientType: "supplier", Body: []byte(`{"x":"é"}`), Time: t0.Add(time.Second)}
	if _, _, err := s.AppendMessage(ctx, next, []string{bob}, mailbox.Bound{}); err != nil {
		t.Fatal(err)
	}
	err := s.db.View(func(tx *boltdb.Tx) error {
		if v := tx.Bucket(bucketDialogues).Get(bodyKey(next.ID)); len(v) == 0 || v[0] == '{' {
			t.Errorf("the message appended is stored as %q, want the binary form", v)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	ds, err := s.ReadMailbox(ctx, bob, 0, 10)
	if err != nil || len(ds) != 2 {
		t.Fatalf("ReadMailbox(bob) = %+v, %v; want both messages", ds, err)
	}
	for i, want := range []mailbox.Message{old, next} {
		if got := ds[i].Message; !reflect.DeepEqual(got, want) {
			t.Errorf("message %d = %+v\nwant %+v", i+1, got, want)
		}
	}
}

// schema12Buckets are the buckets of a schema-12 file: today's, but for
// those schema 13 made, and the ones it regrouped.
func schema12Buckets() [][]byte {
	return slices.Concat(without(allBuckets, bucketAgents), dialogueBuckets, timerBuckets, orderBuckets, paymentBuckets,
		[][]byte{bucketNotificationRetries}, legacyBuckets)
}

// without is buckets but drop.
func without(buckets [][]byte, drop ...[]byte) [][]byte {
	return slices.DeleteFunc(slices.Clone(buckets), func(b []byte) bool {
		return slices.ContainsFunc(drop, func(d []byte) bool { return bytes.Equal(b, d) })
	})
}

// legacyState is a mailbox state as schema 12 kept it in mailboxes.
func legacyState(st mailbox.State) []byte {
	v := make([]byte, 32)
	binary.BigEndian.PutUint64(v[0:], st.Head)
	binary.BigEndian.PutUint64(v[8:], st.Acked)
	binary.BigEndian.PutUint64(v[16:], uint64(st.Pending))
	binary.BigEndian.PutUint64(v[24:], uint64(st.PendingBytes))
	return v
}

// openSchema writes a new database as schema version left it (buckets,
// filled by fill unless it is nil), then opens it with Open, which
// migrates it. The store is closed when the test ends.
func openSchema(t *testing.T, version int, buckets [][]byte, fill func(tx *boltdb.Tx) error) *Store {
	t.Helper()
	dir := t.TempDir()
	writeSchemaFile(t, dir, version, buckets, fill)
	s, err := Open(dir, time.Second)
	if err != nil {
		t.Fatalf("Open(schema %d): %v", version, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// writeSchemaFile writes a new database in dir as schema version left it
// (buckets, filled by fill unless it is nil).
func writeSchemaFile(t *testing.T, dir string, version int, buckets [][]byte, fill func(tx *boltdb.Tx) error) {
	t.Helper()
	old, err := boltdb.Open(filepath.Join(dir, FileName), boltdb.Options{Buckets: buckets, SchemaVersion: version, LockTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if fill != nil {
		if err := old.Update(fill); err != nil {
			t.Fatal(err)
		}
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
}

// A schema-12 database (a bucket per kind of row) is regrouped on open:
// every dialogue, participant, pair state, message record, mailbox body
// (either form), reference count, mailbox state and reference and agent
// index entry is read as before, the old buckets are gone, and the sweeps,
// compaction and new sends work on the moved rows.
func TestOpen_migratesSchema12Regroup(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0).UTC()
	const alice, bob, carol = "clients/a/agents/alice", "clients/b/agents/bob", "clients/c/agents/carol"
	pair := store.Pair{A: alice, B: bob}
	dialogues := []store.Dialogue{
		{ID: "d1", Initiator: alice, Category: "message", Protocol: "p", CreateTime: t0, Opener: "d1-m1"},
		{ID: "d2", Initiator: alice, Category: "message", CreateTime: t0, Opener: "d2-m1", Closed: true, CloseTime: t0},
	}
	records := []storedMessage{
		{DialogueMessage: store.DialogueMessage{ID: "d1-m1", DialogueID: "d1", Sender: alice, Type: "new_message", Time: t0}, Receivers: []string{bob}},
		{DialogueMessage: store.DialogueMessage{ID: "d1-m2", DialogueID: "d1", Sender: bob, Type: "message_response", InReplyTo: "d1-m1", Time: t0}, Receivers: []string{alice}},
		{DialogueMessage: store.DialogueMessage{ID: "d2-m1", DialogueID: "d2", Sender: alice, Type: "new_message", Time: t0}, Receivers: []string{carol}},
	}
	mail := func(id, dialogue, sender string) mailbox.Message {
		return mailbox.Message{ID: id, DialogueID: dialogue, Sender: sender, Category: mailbox.CategoryMessage, Type: "t", Body: []byte(`"` + id + `"`), Time: t0}
	}
	bodies := []mailbox.Message{mail("d1-m1", "d1", alice), mail("d1-m2", "d1", bob), mail("d2-m1", "d2", alice), mail("svc", "d1", "")}
	refs := map[string][]string{bob: {"d1-m1", "svc"}, alice: {"d1-m2"}, carol: {"d2-m1", "svc"}}
	states := map[string]mailbox.State{
		alice: {Head: 1, Pending: 1, PendingBytes: 7},
		bob:   {Head: 2, Pending: 2, PendingBytes: 12},
		carol: {Head: 2, Acked: 1, Pending: 1, PendingBytes: 5},
	}
	s := openSchema(t, 12, schema12Buckets(), func(tx *boltdb.Tx) error { // as schema 12 wrote them
		for _, d := range dialogues {
			if err := putJSON(tx.Bucket(bucketDialogues), []byte(d.ID), d); err != nil {
				return err
			}
			if err := indexClosed(tx, d); err != nil {
				return err
			}
		}
		for _, m := range records {
			if err := putJSON(tx.Bucket(legacyDialogueMessages), []byte(m.ID), m); err != nil {
				return err
			}
		}
		puts := []struct {
			bucket, key, value []byte
		}{
			{legacyDialogueMessageIndex, join("d1", "d1-m2"), nil},
			{legacyDialoguePairs, pairKey("d1", pair), []byte(`{"s":1}`)},
			{legacyMessageRefs, []byte("svc"), binary.BigEndian.AppendUint64(nil, 2)},
			{bucketMailboxCompaction, compactionKey(t0.UnixNano(), carol), nil},
		}
		for _, p := range [][2]string{{"d1", alice}, {"d1", bob}, {"d2", alice}, {"d2", carol}} {
			v, _ := json.Marshal(store.Participant{Agent: p[1]})
			puts = append(puts, struct{ bucket, key, value []byte }{legacyDialogueParticipants, join(p[0], p[1]), v},
				struct{ bucket, key, value []byte }{legacyAgentDialogues, join(p[1], p[0]), nil})
		}
		for i, m := range bodies {
			v := encodeMessage(m)
			if i == 0 {
				v, _ = json.Marshal(m) // as schema 10 wrote it
			}
			puts = append(puts, struct{ bucket, key, value []byte }{legacyMessages, []byte(m.ID), v})
		}
		for agent, ids := range refs {
			for i, id := range ids {
				r := encodeRef(ref{sent: t0.UnixNano(), size: int64(len(`""`) + len(id)), id: id})
				puts = append(puts, struct{ bucket, key, value []byte }{legacyMailboxRefs, refKey(agent, uint64(i+1)), r})
			}
			puts = append(puts, struct{ bucket, key, value []byte }{legacyMailboxes, []byte(agent), legacyState(states[agent])})
		}
		for _, p := range puts {
			if err := tx.Bucket(p.bucket).Put(p.key, p.value); err != nil {
				return err
			}
		}
		return nil
	})
	ctx := t.Context()
	err := s.db.View(func(tx *boltdb.Tx) error {
		for _, b := range legacyBuckets {
			if tx.Bucket(b) != nil {
				t.Errorf("bucket %s is still there after the migration", b)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range dialogues {
		if got, err := s.GetDialogue(ctx, want.ID); err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("GetDialogue(%s) = %+v, %v; want %+v", want.ID, got, err, want)
		}
	}
	for _, want := range records {
		if got, err := s.GetDialogueMessage(ctx, want.ID); err != nil || got != want.DialogueMessage {
			t.Errorf("GetDialogueMessage(%s) = %+v, %v; want %+v", want.ID, got, err, want.DialogueMessage)
		}
	}
	if got, err := s.PairState(ctx, "d1", pair); err != nil || string(got) != `{"s":1}` {
		t.Errorf("PairState(d1) = %s, %v; want {\"s\":1}", got, err)
	}
	if _, err := s.AddMessage(ctx, "d1-m2", mailbox.Bound{}, func(v store.DialogueView) (store.MessageWrite, error) {
		if p, ok := v.Participant(alice); !ok || p.Agent != alice {
			t.Errorf("Participant(alice) in d1 = %+v, %t; want alice", p, ok)
		}
		if got := string(v.PairState(pair)); got != `{"s":1}` {
			t.Errorf("PairState(alice, bob) in d1 = %s, want {\"s\":1}", got)
		}
		if got := v.Receivers(); !slices.Equal(got, []string{alice}) {
			t.Errorf("Receivers() of d1-m2 = %v, want [alice]", got)
		}
		return store.MessageWrite{}, errors.New("only looking")
	}); err == nil {
		t.Fatal("AddMessage(d1-m2) succeeded; the plan refused")
	}
	byID := map[string]mailbox.Message{}
	for _, m := range bodies {
		byID[m.ID] = m
	}
	for agent, ids := range refs {
		ds, err := s.ReadMailbox(ctx, agent, 0, 10)
		if err != nil || len(ds) != len(ids) {
			t.Fatalf("ReadMailbox(%s) = %+v, %v; want %v", agent, ds, err, ids)
		}
		for i, d := range ds {
			if d.Cursor != uint64(i+1) || !reflect.DeepEqual(d.Message, byID[ids[i]]) {
				t.Errorf("ReadMailbox(%s)[%d] = %d %+v, want %d %+v", agent, i, d.Cursor, d.Message, i+1, byID[ids[i]])
			}
		}
		if got, err := s.GetMailbox(ctx, agent); err != nil || got != states[agent] {
			t.Errorf("GetMailbox(%s) = %+v, %v; want %+v", agent, got, err, states[agent])
		}
	}
	var open []string
	if _, err := s.UpdateAgentDialogues(ctx, alice, func(d *store.Dialogue, _ *store.Participant) (bool, error) {
		open = append(open, d.ID)
		return false, nil
	}); err != nil || !slices.Equal(open, []string{"d1"}) {
		t.Errorf("UpdateAgentDialogues(alice) visited %v, %v; want [d1], the open one", open, err)
	}
	// carol's acknowledged d2-m1 goes; svc stays for bob and carol.
	if n, err := s.CompactMailboxes(ctx, t0.Add(time.Hour), 10); err != nil || n != 1 {
		t.Errorf("CompactMailboxes after the migration = %d, %v; want 1", n, err)
	}
	if n, err := s.SweepDialogues(ctx, t0.Add(time.Hour), 10); err != nil || n != 1 {
		t.Errorf("SweepDialogues after the migration = %d, %v; want 1 (d2)", n, err)
	}
	if _, err := s.GetDialogueMessage(ctx, "d2-m1"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetDialogueMessage(d2-m1) after the sweep = %v, want ErrNotFound", err)
	}
	if got := rowCount(t, s, bucketDialogues, kindParticipant); got != 2 {
		t.Errorf("participants after the sweep = %d, want d1's 2", got)
	}
	if got := rowCount(t, s, bucketAgents, kindAgentDialogue); got != 2 {
		t.Errorf("agents' dialogue rows after the sweep = %d, want d1's 2", got)
	}
	for _, agent := range []string{alice, bob, carol} {
		if _, err := s.ClearMailbox(ctx, agent); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := s.CompactMailboxes(ctx, t0.Add(time.Hour), 10); err != nil || n != 4 {
		t.Errorf("CompactMailboxes after clearing every mailbox = %d, %v; want the 4 references left", n, err)
	}
	if bodies, counts := rowCount(t, s, bucketDialogues, kindBody), rowCount(t, s, bucketDialogues, kindRefCount); bodies != 0 || counts != 0 {
		t.Errorf("bodies and reference counts after compacting everything = %d, %d; want none", bodies, counts)
	}
	d3 := store.Dialogue{ID: "d3", Initiator: alice, Category: "message", CreateTime: t0, Opener: "d3-m1"}
	w := store.MessageWrite{Message: store.DialogueMessage{ID: "d3-m1", Sender: alice, Type: "new_message", Time: t0}, Recipients: []string{bob}, Mail: mail("", "", alice)}
	if got, err := s.CreateDialogue(ctx, d3, w, mailbox.Bound{}); err != nil || len(got.Deliveries) != 1 || got.Deliveries[0].Cursor != 3 {
		t.Errorf("CreateDialogue(d3) after the migration = %+v, %v; want bob's cursor 3", got, err)
	}
}
