// Package storetest is the conformance suite every store.Store backend
// passes. A backend's test calls Run with a constructor that opens a fresh,
// empty store.
package storetest

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/timestamppb"

	tasksv1 "github.com/parleyhq/parley/gen/parley/tasks/v1"
	"github.com/parleyhq/parley/services/tasks/internal/store"
)

// Run runs the suite; open returns a fresh store, closed by the suite.
func Run(t *testing.T, open func(t *testing.T) store.Store) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s store.Store)
	}{
		{"TaskRoundTrip", testTaskRoundTrip},
		{"ListTasksPagesByAgent", testListTasks},
		{"StepsAndPending", testSteps},
		{"UpdateStepAddsArtifacts", testUpdateStepArtifacts},
		{"MutateErrorWritesNothing", testMutateError},
		{"ArtifactsPage", testArtifacts},
		{"ConcurrentCreates", testConcurrent},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := open(t)
			t.Cleanup(func() { s.Close() })
			tc.fn(t, s)
		})
	}
}

func task(id, agent string) *tasksv1.Task {
	return &tasksv1.Task{
		Name:                "tasks/" + id,
		Agent:               agent,
		Input:               "input " + id,
		HasInput:            true,
		AdditionalInputJson: []byte(`{"k":1}`),
		State:               tasksv1.Task_STATE_ACTIVE,
		CreateTime:          timestamppb.Now(),
	}
}

func step(taskID, id string) *tasksv1.Step {
	return &tasksv1.Step{Name: "tasks/" + taskID + "/steps/" + id, Input: proto.String(id), Status: tasksv1.Step_STATUS_CREATED}
}

func keep(*tasksv1.Task, *tasksv1.Step) error { return nil }

func testTaskRoundTrip(t *testing.T, s store.Store) {
	ctx := t.Context()
	want := task("t1", "clients/c/agents/a")
	if err := s.CreateTask(ctx, want); err != nil {
		t.Fatalf("CreateTask: %v", err)
	}
	if err := s.CreateTask(ctx, want); !errors.Is(err, store.ErrAlreadyExists) {
		t.Errorf("CreateTask(duplicate) = %v, want ErrAlreadyExists", err)
	}
	got, err := s.GetTask(ctx, "t1")
	if err != nil {
		t.Fatalf("GetTask: %v", err)
	}
	if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
		t.Errorf("GetTask mismatch (-want +got):\n%s", diff)
	}
	if _, err := s.GetTask(ctx, "nope"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetTask(nope) = %v, want ErrNotFound", err)
	}
	upd, err := s.UpdateTask(ctx, "t1", func(t *tasksv1.Task) error { t.State = tasksv1.Task_STATE_CANCELLED; return nil })
	if err != nil || upd.GetState() != tasksv1.Task_STATE_CANCELLED {
		t.Errorf("UpdateTask = %v, %v; want cancelled", upd, err)
	}
}

func testListTasks(t *testing.T, s store.Store) {
	ctx := t.Context()
	for i := range 5 {
		if err := s.CreateTask(ctx, task(fmt.Sprint("a", i), "clients/c/agents/a")); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.CreateTask(ctx, task("b0", "clients/c/agents/b")); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name          string
		agent         string
		offset, limit int
		want          []string
		wantTotal     int
	}{
		{"first page", "clients/c/agents/a", 0, 2, []string{"tasks/a0", "tasks/a1"}, 5},
		{"last page", "clients/c/agents/a", 4, 2, []string{"tasks/a4"}, 5},
		{"past the end", "clients/c/agents/a", 9, 2, nil, 5},
		{"other agent", "clients/c/agents/b", 0, 10, []string{"tasks/b0"}, 1},
		{"unknown agent", "clients/c/agents/z", 0, 10, nil, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, total, err := s.ListTasks(ctx, tc.agent, tc.offset, tc.limit)
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, g := range got {
				names = append(names, g.GetName())
			}
			if diff := cmp.Diff(tc.want, names); diff != "" || total != tc.wantTotal {
				t.Errorf("ListTasks(%q, %d, %d) total %d (want %d), names diff:\n%s", tc.agent, tc.offset, tc.limit, total, tc.wantTotal, diff)
			}
		})
	}
}

func testSteps(t *testing.T, s store.Store) {
	ctx := t.Context()
	if err := s.CreateTask(ctx, task("t", "clients/c/agents/a")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateStep(ctx, "nope", step("nope", "s"), keep); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("CreateStep(unknown task) = %v, want ErrNotFound", err)
	}
	for _, id := range []string{"s0", "s1", "s2"} {
		if _, err := s.CreateStep(ctx, "t", step("t", id), keep); err != nil {
			t.Fatal(err)
		}
	}
	// decide may complete a step at once; it is then not pending.
	done, err := s.CreateStep(ctx, "t", step("t", "s3"), func(_ *tasksv1.Task, st *tasksv1.Step) error {
		st.Status = tasksv1.Step_STATUS_COMPLETED
		return nil
	})
	if err != nil || done.GetStatus() != tasksv1.Step_STATUS_COMPLETED {
		t.Fatalf("CreateStep(completed) = %v, %v", done, err)
	}
	if _, err := s.UpdateStep(ctx, store.StepRef{TaskID: "t", StepID: "s1"}, func(_ *tasksv1.Task, st *tasksv1.Step) ([]*tasksv1.Artifact, error) {
		st.Status = tasksv1.Step_STATUS_COMPLETED
		st.Output = proto.String("out")
		return nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	pending, err := s.ListPending(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []store.StepRef{{TaskID: "t", StepID: "s0"}, {TaskID: "t", StepID: "s2"}}
	if diff := cmp.Diff(want, pending); diff != "" {
		t.Errorf("ListPending diff (-want +got):\n%s", diff)
	}
	got, total, err := s.ListSteps(ctx, "t", 1, 2)
	if err != nil || total != 4 || len(got) != 2 || got[0].GetName() != "tasks/t/steps/s1" || got[0].GetOutput() != "out" {
		t.Errorf("ListSteps(t, 1, 2) = %v, %d, %v; want s1 (completed), s2 of 4", got, total, err)
	}
	if _, _, err := s.ListSteps(ctx, "nope", 0, 1); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("ListSteps(unknown) = %v, want ErrNotFound", err)
	}
	if _, err := s.GetStep(ctx, store.StepRef{TaskID: "t", StepID: "nope"}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetStep(unknown) = %v, want ErrNotFound", err)
	}
	if _, err := s.CreateStep(ctx, "t", step("t", "s0"), keep); !errors.Is(err, store.ErrAlreadyExists) {
		t.Errorf("CreateStep(duplicate) = %v, want ErrAlreadyExists", err)
	}
}

func testUpdateStepArtifacts(t *testing.T, s store.Store) {
	ctx := t.Context()
	if err := s.CreateTask(ctx, task("t", "clients/c/agents/a")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateStep(ctx, "t", step("t", "s"), keep); err != nil {
		t.Fatal(err)
	}
	art := &tasksv1.Artifact{Name: "tasks/t/artifacts/x", FileName: "f.txt", AgentCreated: true}
	if _, err := s.UpdateStep(ctx, store.StepRef{TaskID: "t", StepID: "s"}, func(tk *tasksv1.Task, st *tasksv1.Step) ([]*tasksv1.Artifact, error) {
		st.Status = tasksv1.Step_STATUS_COMPLETED
		st.Artifacts = []*tasksv1.Artifact{art}
		tk.State = tasksv1.Task_STATE_FINISHED
		return []*tasksv1.Artifact{art}, nil
	}); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetArtifact(ctx, "t", "x")
	if err != nil || !proto.Equal(got, art) {
		t.Errorf("GetArtifact = %v, %v; want %v", got, err, art)
	}
	tk, _ := s.GetTask(ctx, "t")
	if tk.GetState() != tasksv1.Task_STATE_FINISHED || tk.GetArtifactCount() != 1 {
		t.Errorf("task after UpdateStep = %v; want finished with 1 artifact", tk)
	}
}

func testMutateError(t *testing.T, s store.Store) {
	ctx := t.Context()
	if err := s.CreateTask(ctx, task("t", "clients/c/agents/a")); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	if _, err := s.UpdateTask(ctx, "t", func(t *tasksv1.Task) error { t.Input = "changed"; return boom }); !errors.Is(err, boom) {
		t.Errorf("UpdateTask = %v, want boom", err)
	}
	if _, err := s.CreateStep(ctx, "t", step("t", "s"), func(*tasksv1.Task, *tasksv1.Step) error { return boom }); !errors.Is(err, boom) {
		t.Errorf("CreateStep = %v, want boom", err)
	}
	tk, _ := s.GetTask(ctx, "t")
	if _, total, _ := s.ListSteps(ctx, "t", 0, 10); tk.GetInput() != "input t" || total != 0 {
		t.Errorf("task after failed mutations = %v; want unchanged", tk)
	}
}

func testArtifacts(t *testing.T, s store.Store) {
	ctx := t.Context()
	if err := s.CreateTask(ctx, task("t", "clients/c/agents/a")); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateArtifact(ctx, "nope", &tasksv1.Artifact{Name: "tasks/nope/artifacts/a"}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("CreateArtifact(unknown task) = %v, want ErrNotFound", err)
	}
	for i := range 3 {
		if err := s.CreateArtifact(ctx, "t", &tasksv1.Artifact{Name: fmt.Sprint("tasks/t/artifacts/a", i), FileName: "f"}); err != nil {
			t.Fatal(err)
		}
	}
	got, total, err := s.ListArtifacts(ctx, "t", 2, 10)
	if err != nil || total != 3 || len(got) != 1 || got[0].GetName() != "tasks/t/artifacts/a2" {
		t.Errorf("ListArtifacts(t, 2, 10) = %v, %d, %v; want a2 of 3", got, total, err)
	}
	if _, err := s.GetArtifact(ctx, "t", "zz"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetArtifact(unknown) = %v, want ErrNotFound", err)
	}
}

// testConcurrent exercises group commit: every concurrent create lands.
func testConcurrent(t *testing.T, s store.Store) {
	ctx := t.Context()
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 64 {
		wg.Go(func() {
			if err := s.CreateTask(ctx, task(fmt.Sprint("c", i), "clients/c/agents/a")); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("CreateTask: %v", err)
	}
	if _, total, err := s.ListTasks(ctx, "clients/c/agents/a", 0, 1); err != nil || total != 64 {
		t.Errorf("ListTasks total = %d, %v; want 64", total, err)
	}
}
