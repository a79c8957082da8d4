package boltstore

import (
	"testing"
	"time"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

// Every write returns only after a commit that bbolt fsynced. A kill -9
// test cannot see a missing fsync (the page cache outlives the process), so
// this reads platform/boltdb's commit counts instead: a store opened with
// NoSync fails here.
func TestWrites_returnOnlyAfterASyncedCommit(t *testing.T) {
	s, err := Open(t.TempDir(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.db.Durable(); err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	now := time.Now()
	const routine = "clients/c/agents/a/routines/r"
	conv := store.Conversation{ID: "c1", Agent: "clients/c/agents/a", Peer: "p", CreateTime: now, ExpireTime: now.Add(time.Hour)}
	writes := []struct {
		name string
		do   func() error
	}{
		{"SetRoutine", func() error { _, err := s.SetRoutine(ctx, routine, "src", now); return err }},
		{"RecordRoutineRun", func() error {
			_, err := s.RecordRoutineRun(ctx, routine, 1, "boom", dispatcherv1.RoutineFailureKind_ROUTINE_FAILURE_KIND_ERROR, 3)
			return err
		}},
		{"SetTool", func() error {
			_, err := s.SetTool(ctx, &dispatcherv1.Tool{Name: "clients/c/agents/a/tools/t"}, now)
			return err
		}},
		{"CreateConversation", func() error { return s.CreateConversation(ctx, conv, 10, now) }},
		{"UpdateConversation", func() error {
			return s.UpdateConversation(ctx, conv.ID, func(c *store.Conversation) error { c.Memory = []byte(`{}`); return nil })
		}},
		{"DeleteConversation", func() error { return s.DeleteConversation(ctx, conv.ID) }},
		{"SweepConversations", func() error { _, err := s.SweepConversations(ctx, now); return err }},
		{"CountSend", func() error { return s.CountSend(ctx, "clients/c/agents/a", "t", "x", true) }},
		{"AppendMessage", func() error {
			m := mailbox.Message{ID: "m", DialogueID: "d", Category: mailbox.CategoryMessage, Type: "t", Time: now.Add(-time.Hour)}
			_, _, err := s.AppendMessage(ctx, m, []string{"clients/c/agents/b"}, mailbox.Bound{})
			return err
		}},
		{"AcknowledgeMailbox", func() error { _, err := s.AcknowledgeMailbox(ctx, "clients/c/agents/b", 1); return err }},
		{"CompactMailboxes", func() error { _, err := s.CompactMailboxes(ctx, now, 10); return err }},
	}
	for _, w := range writes {
		before := s.db.Commits()
		if err := w.do(); err != nil {
			t.Fatalf("%s: %v", w.name, err)
		}
		if after := s.db.Commits(); after.Synced == before.Synced || after.Unsynced != 0 {
			t.Errorf("%s: commits went %+v -> %+v; want it to return after a synced commit, and no unsynced one", w.name, before, after)
		}
	}
}
