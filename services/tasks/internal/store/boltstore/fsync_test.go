package boltstore

import (
	"testing"
	"time"

	tasksv1 "github.com/parleyhq/parley/gen/parley/tasks/v1"
	"github.com/parleyhq/parley/platform/boltdb/boltdbtest"
	"github.com/parleyhq/parley/services/tasks/internal/store"
)

// Every acknowledged write returns only after a commit that bbolt fsynced
// (boltdbtest.SyncedWrites says why that is checked this way): a store
// opened with NoSync fails here.
func TestWrites_returnOnlyAfterASyncedCommit(t *testing.T) {
	s, err := Open(t.TempDir(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := t.Context()
	noop := func(*tasksv1.Task, *tasksv1.Step) error { return nil }
	writes := []boltdbtest.Write{
		{Name: "CreateTask", Do: func() error { return s.CreateTask(ctx, &tasksv1.Task{Name: "tasks/t", Agent: "clients/c/agents/a"}) }},
		{Name: "UpdateTask", Do: func() error {
			_, err := s.UpdateTask(ctx, "t", func(t *tasksv1.Task) error { t.Input = "x"; return nil })
			return err
		}},
		{Name: "CreateStep", Do: func() error {
			_, err := s.CreateStep(ctx, "t", &tasksv1.Step{Name: "tasks/t/steps/s", Status: tasksv1.Step_STATUS_CREATED}, noop)
			return err
		}},
		{Name: "UpdateStep", Do: func() error {
			_, err := s.UpdateStep(ctx, store.StepRef{TaskID: "t", StepID: "s"}, func(_ *tasksv1.Task, st *tasksv1.Step) ([]*tasksv1.Artifact, error) {
				st.Status = tasksv1.Step_STATUS_COMPLETED
				return []*tasksv1.Artifact{{Name: "tasks/t/artifacts/a1", FileName: "f"}}, nil
			})
			return err
		}},
		{Name: "CreateArtifact", Do: func() error {
			return s.CreateArtifact(ctx, "t", &tasksv1.Artifact{Name: "tasks/t/artifacts/a2", FileName: "f"})
		}},
	}
	boltdbtest.SyncedWrites(t, s.db, writes)
}
