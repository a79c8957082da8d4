package pgstore_test

import (
	"slices"
	"testing"
	"time"

	tasksv1 "github.com/parleyhq/parley/gen/parley/tasks/v1"
	"github.com/parleyhq/parley/platform/pgdb/pgdbtest"
	"github.com/parleyhq/parley/services/tasks/internal/store"
	"github.com/parleyhq/parley/services/tasks/internal/store/pgstore"
)

// A pending step belongs to the replica that created it while that replica
// lives: another neither lists it at start nor claims it. Once the owner
// is gone (its session ends), the other claims it, once.
func TestClaimOrphans_takesOverTheStepsOfAReplicaThatDied(t *testing.T) {
	url, schema := pgdbtest.Schema(t)
	openOn := func() *pgstore.Store {
		s, err := pgstore.Open(t.Context(), url, schema, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	a, b := openOn(), openOn()
	ctx := t.Context()
	task := &tasksv1.Task{Name: "tasks/t1", Agent: "clients/c/agents/a", Input: "x"}
	if err := a.CreateTask(ctx, task); err != nil {
		t.Fatal(err)
	}
	step := &tasksv1.Step{Name: "tasks/t1/steps/s1", Status: tasksv1.Step_STATUS_CREATED}
	if _, err := a.CreateStep(ctx, "t1", step, func(*tasksv1.Task, *tasksv1.Step) error { return nil }); err != nil {
		t.Fatal(err)
	}
	want := []store.StepRef{{TaskID: "t1", StepID: "s1"}}
	if got, err := b.ListPending(ctx); err != nil || len(got) != 0 {
		t.Errorf("B.ListPending while A lives = %v, %v; want none: A runs it", got, err)
	}
	if got, err := b.ClaimOrphans(ctx); err != nil || len(got) != 0 {
		t.Errorf("B.ClaimOrphans while A lives = %v, %v; want none", got, err)
	}
	if got, err := a.ListPending(ctx); err != nil || !slices.Equal(got, want) {
		t.Errorf("A.ListPending = %v, %v; want its own step %v", got, err, want)
	}
	a.Close()
	// PostgreSQL releases A's lock as its session ends, just after Close
	// returns: wait for that, generously, rather than for a time.
	deadline := time.Now().Add(30 * time.Second)
	var got []store.StepRef
	for len(got) == 0 && time.Now().Before(deadline) {
		var err error
		if got, err = b.ClaimOrphans(ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond) // between polls, not a measure
	}
	if !slices.Equal(got, want) {
		t.Fatalf("B.ClaimOrphans after A closed = %v, want %v", got, want)
	}
	if again, err := b.ClaimOrphans(ctx); err != nil || len(again) != 0 {
		t.Errorf("B.ClaimOrphans again = %v, %v; want none: B owns it now", again, err)
	}
}
