package boltstore

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/platform/boltdb"
	"github.com/parleyhq/parley/platform/boltdb/boltdbtest"
	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

// Every acknowledged write returns only after a commit that bbolt fsynced,
// or whose journal record was synced (boltdbtest.SyncedWrites says why that
// is checked this way): a store opened with NoSync fails here.
func TestWrites_returnOnlyAfterASyncedCommit(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts Options
	}{
		{"bbolt", Options{}},
		{"journal", Options{Journal: &boltdb.JournalOptions{}}},
	} {
		t.Run(tc.name, func(t *testing.T) { testSyncedWrites(t, tc.opts) })
	}
}

func testSyncedWrites(t *testing.T, opts Options) {
	dir := t.TempDir()
	s, err := OpenWith(dir, time.Second, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	journal := filepath.Join(dir, FileName+boltdb.JournalSuffix)
	if _, err := os.Stat(journal); (err == nil) != (opts.Journal != nil) {
		t.Fatalf("OpenWith(Journal: %v): stat %s = %v", opts.Journal, journal, err)
	}
	ctx := t.Context()
	now := time.Now()
	const routine = "clients/c/agents/a/routines/r"
	conv := store.Conversation{ID: "c1", Agent: "clients/c/agents/a", Peer: "p", CreateTime: now, ExpireTime: now.Add(time.Hour)}
	writes := []boltdbtest.Write{
		{Name: "SetRoutine", Do: func() error { _, err := s.SetRoutine(ctx, routine, "src", now); return err }},
		{Name: "RecordRoutineRun", Do: func() error {
			_, err := s.RecordRoutineRun(ctx, routine, 1, "boom", dispatcherv1.RoutineFailureKind_ROUTINE_FAILURE_KIND_ERROR, 3)
			return err
		}},
		{Name: "SetTool", Do: func() error {
			_, err := s.SetTool(ctx, &dispatcherv1.Tool{Name: "clients/c/agents/a/tools/t"}, now)
			return err
		}},
		{Name: "CreateConversation", Do: func() error { return s.CreateConversation(ctx, conv, 10, now) }},
		{Name: "UpdateConversation", Do: func() error {
			return s.UpdateConversation(ctx, conv.ID, func(c *store.Conversation) error { c.Memory = []byte(`{}`); return nil })
		}},
		{Name: "DeleteConversation", Do: func() error { return s.DeleteConversation(ctx, conv.ID) }},
		{Name: "SweepConversations", Do: func() error { _, err := s.SweepConversations(ctx, now, 10); return err }},
		{Name: "CountSend", Do: func() error { return s.CountSend(ctx, "clients/c/agents/a", "t", "x", true) }},
		{Name: "AppendMessage", Do: func() error {
			m := mailbox.Message{ID: "m", DialogueID: "d", Category: mailbox.CategoryMessage, Type: "t", Time: now.Add(-time.Hour)}
			_, _, err := s.AppendMessage(ctx, m, []string{"clients/c/agents/b"}, mailbox.Bound{})
			return err
		}},
		{Name: "AcknowledgeMailbox", Do: func() error { _, err := s.AcknowledgeMailbox(ctx, "clients/c/agents/b", 1); return err }},
		{Name: "CompactMailboxes", Do: func() error { _, err := s.CompactMailboxes(ctx, now, 10); return err }},
	}
	boltdbtest.SyncedWrites(t, s.db, writes)
}
