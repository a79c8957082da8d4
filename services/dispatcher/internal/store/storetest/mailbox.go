package storetest

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

// RunMailboxes runs the mailbox conformance suite; open returns a new empty
// store.
func RunMailboxes(t *testing.T, open func(t *testing.T) mailbox.Store) {
	t.Run("append and read in cursor order", func(t *testing.T) { testAppendRead(t, open(t)) })
	t.Run("size bound refuses per recipient", func(t *testing.T) { testBound(t, open(t)) })
	t.Run("acknowledge and clear", func(t *testing.T) { testAcknowledge(t, open(t)) })
	t.Run("compaction", func(t *testing.T) { testCompact(t, open(t)) })
}

const (
	alice = "clients/c/agents/alice"
	bob   = "clients/c/agents/bob"
	carol = "clients/d/agents/carol"
)

var t0 = time.Unix(1_800_000_000, 0).UTC()

func msg(id string, body string, at time.Time) mailbox.Message {
	return mailbox.Message{ID: id, DialogueID: "d1", Sender: alice, Category: mailbox.CategoryMessage, Type: "new_message", Body: []byte(body), Time: at}
}

func ids(ds []mailbox.Delivery) string {
	s := ""
	for _, d := range ds {
		s += fmt.Sprintf("%d:%s ", d.Cursor, d.Message.ID)
	}
	return s
}

func testAppendRead(t *testing.T, s mailbox.Store) {
	ctx := t.Context()
	got, refused, err := s.AppendMessage(ctx, msg("m1", `"hi"`, t0), []string{bob, carol}, mailbox.Bound{})
	if err != nil || len(refused) != 0 || len(got) != 2 || got[0].Cursor != 1 || got[1].Cursor != 1 {
		t.Fatalf("AppendMessage(m1) = %v, %v, %v; want bob and carol at cursor 1", got, refused, err)
	}
	if _, _, err := s.AppendMessage(ctx, msg("m2", `{"n":2}`, t0), []string{bob}, mailbox.Bound{}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.AppendMessage(ctx, msg("m3", `3`, t0), []string{carol, bob}, mailbox.Bound{}); err != nil {
		t.Fatal(err)
	}
	// A taken id changes nothing.
	if _, _, err := s.AppendMessage(ctx, msg("m2", `"again"`, t0), []string{carol}, mailbox.Bound{}); !errors.Is(err, store.ErrAlreadyExists) {
		t.Errorf("AppendMessage(taken id) = %v, want ErrAlreadyExists", err)
	}
	bobs, err := s.ReadMailbox(ctx, bob, 0, 10)
	if err != nil || ids(bobs) != "1:m1 2:m2 3:m3 " {
		t.Errorf("ReadMailbox(bob, 0) = %q, %v; want 1:m1 2:m2 3:m3", ids(bobs), err)
	}
	if len(bobs) == 3 {
		if m := bobs[1].Message; string(m.Body) != `{"n":2}` || m.Sender != alice || m.DialogueID != "d1" || !m.Time.Equal(t0) || bobs[1].Agent != bob {
			t.Errorf("ReadMailbox(bob)[1] = %+v, want m2 as appended", bobs[1])
		}
	}
	carols, _ := s.ReadMailbox(ctx, carol, 0, 10)
	if ids(carols) != "1:m1 2:m3 " {
		t.Errorf("ReadMailbox(carol, 0) = %q, want 1:m1 2:m3 (the refused duplicate id absent)", ids(carols))
	}
	page, _ := s.ReadMailbox(ctx, bob, 1, 1)
	if ids(page) != "2:m2 " {
		t.Errorf("ReadMailbox(bob, after 1, limit 1) = %q, want 2:m2", ids(page))
	}
	if none, err := s.ReadMailbox(ctx, alice, 0, 10); err != nil || len(none) != 0 {
		t.Errorf("ReadMailbox(empty mailbox) = %v, %v; want nothing", none, err)
	}
	st, err := s.GetMailbox(ctx, bob)
	if want := (mailbox.State{Head: 3, Pending: 3, PendingBytes: int64(len(`"hi"`) + len(`{"n":2}`) + len(`3`))}); err != nil || st != want {
		t.Errorf("GetMailbox(bob) = %+v, %v; want %+v", st, err, want)
	}
}

func testBound(t *testing.T, s mailbox.Store) {
	ctx := t.Context()
	bound := mailbox.Bound{MaxMessages: 2, MaxBytes: 10}
	for i, id := range []string{"m1", "m2"} {
		if _, refused, err := s.AppendMessage(ctx, msg(id, `"ab"`, t0), []string{bob}, bound); err != nil || len(refused) != 0 {
			t.Fatalf("AppendMessage #%d = %v, %v", i, refused, err)
		}
	}
	got, refused, err := s.AppendMessage(ctx, msg("m3", `"ab"`, t0), []string{bob, carol}, bound)
	if err != nil || len(refused) != 1 || refused[0].Agent != bob || !errors.Is(refused[0].Err, mailbox.ErrFull) || len(got) != 1 || got[0].Agent != carol {
		t.Fatalf("AppendMessage(bob full, carol not) = %v, %v, %v; want bob refused ErrFull, carol delivered", got, refused, err)
	}
	if all, _ := s.ReadMailbox(ctx, bob, 0, 10); ids(all) != "1:m1 2:m2 " {
		t.Errorf("bob's mailbox after refusal = %q, want it unchanged", ids(all))
	}
	// Bytes: carol holds 4 bytes; 7 more would pass 10.
	if _, refused, _ := s.AppendMessage(ctx, msg("m4", `"abcde"`, t0), []string{carol}, bound); len(refused) != 1 {
		t.Errorf("AppendMessage over the byte bound refused %v, want carol", refused)
	}
	// No recipient took it: the id stays free and the body unstored.
	if _, refused, err := s.AppendMessage(ctx, msg("m4", `"a"`, t0), []string{carol}, bound); err != nil || len(refused) != 0 {
		t.Errorf("AppendMessage(m4 again, fits) = %v, %v; want it stored", refused, err)
	}
	// Acknowledging frees room.
	if _, err := s.AcknowledgeMailbox(ctx, bob, 1); err != nil {
		t.Fatal(err)
	}
	if _, refused, err := s.AppendMessage(ctx, msg("m5", `"ab"`, t0), []string{bob}, bound); err != nil || len(refused) != 0 {
		t.Errorf("AppendMessage after ack = %v, %v; want room for one", refused, err)
	}
}

func testAcknowledge(t *testing.T, s mailbox.Store) {
	ctx := t.Context()
	for _, id := range []string{"m1", "m2", "m3"} {
		if _, _, err := s.AppendMessage(ctx, msg(id, `"xy"`, t0), []string{bob}, mailbox.Bound{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.AcknowledgeMailbox(ctx, bob, 4); !errors.Is(err, mailbox.ErrCursorAhead) {
		t.Errorf("AcknowledgeMailbox(past head) = %v, want ErrCursorAhead", err)
	}
	st, err := s.AcknowledgeMailbox(ctx, bob, 2)
	if want := (mailbox.State{Head: 3, Acked: 2, Pending: 1, PendingBytes: 4}); err != nil || st != want {
		t.Errorf("AcknowledgeMailbox(2) = %+v, %v; want %+v", st, err, want)
	}
	if st, err := s.AcknowledgeMailbox(ctx, bob, 1); err != nil || st.Acked != 2 {
		t.Errorf("AcknowledgeMailbox(back to 1) = %+v, %v; want acked to stay 2", st, err)
	}
	// Acknowledged messages stay readable until compacted.
	if all, _ := s.ReadMailbox(ctx, bob, 0, 10); len(all) != 3 {
		t.Errorf("ReadMailbox after ack = %q, want all three until compaction", ids(all))
	}
	st, err = s.ClearMailbox(ctx, bob)
	if want := (mailbox.State{Head: 3, Acked: 3}); err != nil || st != want {
		t.Errorf("ClearMailbox = %+v, %v; want %+v", st, err, want)
	}
	if st, err := s.ClearMailbox(ctx, carol); err != nil || st != (mailbox.State{}) {
		t.Errorf("ClearMailbox(never written) = %+v, %v; want the zero state", st, err)
	}
}

func testCompact(t *testing.T, s mailbox.Store) {
	ctx := t.Context()
	old, recent := t0, t0.Add(time.Hour)
	if _, _, err := s.AppendMessage(ctx, msg("shared", `1`, old), []string{bob, carol}, mailbox.Bound{}); err != nil {
		t.Fatal(err)
	}
	for _, m := range []mailbox.Message{msg("old", `2`, old), msg("new", `3`, recent), msg("unacked", `4`, old)} {
		if _, _, err := s.AppendMessage(ctx, m, []string{bob}, mailbox.Bound{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.AcknowledgeMailbox(ctx, bob, 3); err != nil { // shared, old, new
		t.Fatal(err)
	}
	n, err := s.CompactMailboxes(ctx, old.Add(time.Minute), 1)
	if err != nil || n != 1 {
		t.Fatalf("CompactMailboxes(limit 1) = %d, %v; want 1", n, err)
	}
	n, err = s.CompactMailboxes(ctx, old.Add(time.Minute), 100)
	if err != nil || n != 1 {
		t.Fatalf("CompactMailboxes = %d, %v; want 1 more (old); new is recent, unacked unacknowledged", n, err)
	}
	if left, _ := s.ReadMailbox(ctx, bob, 0, 10); ids(left) != "3:new 4:unacked " {
		t.Errorf("bob after compaction = %q, want 3:new 4:unacked", ids(left))
	}
	// carol never acknowledged "shared": her reference keeps the body.
	if left, err := s.ReadMailbox(ctx, carol, 0, 10); err != nil || ids(left) != "1:shared " || string(left[0].Message.Body) != `1` {
		t.Errorf("carol after compaction = %q, %v; want 1:shared with its body", ids(left), err)
	}
	if n, _ := s.CompactMailboxes(ctx, old.Add(time.Minute), 100); n != 0 {
		t.Errorf("CompactMailboxes again = %d, want 0", n)
	}
	if st, _ := s.GetMailbox(ctx, bob); st.Head != 4 || st.Acked != 3 {
		t.Errorf("bob's state after compaction = %+v; want head and cursor kept", st)
	}
	// Later, the recent one is due too; the unacknowledged one goes once
	// it is acknowledged, however old it already is.
	later := recent.Add(time.Minute)
	if n, err := s.CompactMailboxes(ctx, later, 100); err != nil || n != 1 {
		t.Errorf("CompactMailboxes(after new) = %d, %v; want 1 (new)", n, err)
	}
	if _, err := s.AcknowledgeMailbox(ctx, bob, 4); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AcknowledgeMailbox(ctx, bob, 4); err != nil { // again: changes nothing
		t.Fatal(err)
	}
	if n, err := s.CompactMailboxes(ctx, later, 100); err != nil || n != 1 {
		t.Errorf("CompactMailboxes(once unacked is acknowledged) = %d, %v; want 1", n, err)
	}
	if left, _ := s.ReadMailbox(ctx, bob, 0, 10); len(left) != 0 {
		t.Errorf("bob after the last compaction = %q, want nothing", ids(left))
	}
	if n, _ := s.CompactMailboxes(ctx, later, 100); n != 0 {
		t.Errorf("CompactMailboxes on emptied mailboxes = %d, want 0", n)
	}
	// A mailbox appended to again after it was emptied compacts again.
	if _, _, err := s.AppendMessage(ctx, msg("again", `5`, recent), []string{bob}, mailbox.Bound{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ClearMailbox(ctx, bob); err != nil {
		t.Fatal(err)
	}
	if n, err := s.CompactMailboxes(ctx, later, 100); err != nil || n != 1 {
		t.Errorf("CompactMailboxes(again) = %d, %v; want 1", n, err)
	}
	if st, _ := s.GetMailbox(ctx, bob); st.Head != 5 || st.Acked != 5 || st.Pending != 0 {
		t.Errorf("bob's state at the end = %+v; want head and cursor 5, nothing pending", st)
	}
}
