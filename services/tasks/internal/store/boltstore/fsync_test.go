package boltstore

import (
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	tasksv1 "github.com/parleyhq/parley/gen/parley/tasks/v1"
	"github.com/parleyhq/parley/services/tasks/internal/store"
)

// The fsync seam. A kill -9 test cannot see a missing fsync (the page cache
// outlives the process), so this checks the two things durability rests
// on: the DB is opened with every sync on (bbolt's Tx.Commit then fsyncs
// the data and the meta page before returning), and every acknowledged
// write returns only after a read-write transaction holding it committed
// without error.
func TestWrites_returnOnlyAfterASyncedCommit(t *testing.T) {
	s, err := Open(t.TempDir(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.db.NoSync || s.db.NoGrowSync || s.db.MmapFlags != 0 {
		t.Fatalf("DB opened with NoSync=%v NoGrowSync=%v MmapFlags=%#x; want every sync on", s.db.NoSync, s.db.NoGrowSync, s.db.MmapFlags)
	}
	// commits counts read-write transactions that committed.
	var commits atomic.Int64
	update := s.commit.run
	s.commit.run = func(fn func(*bolt.Tx) error) error {
		err := update(func(tx *bolt.Tx) error {
			if tx.DB().NoSync {
				t.Errorf("write transaction on a NoSync DB")
			}
			return fn(tx)
		})
		if err == nil {
			commits.Add(1)
		}
		return err
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
		before := commits.Load()
		if err := w.do(); err != nil {
			t.Fatalf("%s: %v", w.name, err)
		}
		if commits.Load() == before {
			t.Errorf("%s returned before any transaction committed", w.name)
		}
	}
}
