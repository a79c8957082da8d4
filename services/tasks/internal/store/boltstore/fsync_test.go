package boltstore

import (
	"testing"
	"time"

	tasksv1 "github.com/parleyhq/parley/gen/parley/tasks/v1"
	"github.com/parleyhq/parley/services/tasks/internal/store"
)

// The fsync seam. A kill -9 test cannot see a missing fsync (the page cache
// outlives the process), so this checks the two things durability rests
// on: the DB is opened with every sync on (bbolt's Tx.Commit then fsyncs
// the data and the meta page before returning), and every acknowledged
// write returns only after a read-write transaction holding it committed
// with that fsync (platform/boltdb's Commits counts them).
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
	noop := func(*tasksv1.Task, *tasksv1.Step) error { return nil }
	writes := []struct {
		name string
		do   func() error
	}{
		{"CreateTask", func() error { return s.CreateTask(ctx, &tasksv1.Task{Name: "tasks/t", Agent: "clients/c/agents/a"}) }},
		{"UpdateTask", func() error {
			_, err := s.UpdateTask(ctx, "t", func(t *tasksv1.Task) error { t.Input = "x"; return nil })
			return err
		}},
		{"CreateStep", func() error {
			_, err := s.CreateStep(ctx, "t", &tasksv1.Step{Name: "tasks/t/steps/s", Status: tasksv1.Step_STATUS_CREATED}, noop)
			return err
		}},
		{"UpdateStep", func() error {
			_, err := s.UpdateStep(ctx, store.StepRef{TaskID: "t", StepID: "s"}, func(_ *tasksv1.Task, st *tasksv1.Step) ([]*tasksv1.Artifact, error) {
				st.Status = tasksv1.Step_STATUS_COMPLETED
				return []*tasksv1.Artifact{{Name: "tasks/t/artifacts/a1", FileName: "f"}}, nil
			})
			return err
		}},
		{"CreateArtifact", func() error {
			return s.CreateArtifact(ctx, "t", &tasksv1.Artifact{Name: "tasks/t/artifacts/a2", FileName: "f"})
		}},
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
