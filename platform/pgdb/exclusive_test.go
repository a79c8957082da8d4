package pgdb_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/parleyhq/parley/platform/pgdb"
	"github.com/parleyhq/parley/platform/pgdb/pgdbtest"
)

// Of two replicas running Exclusive with one name, one runs the work; when
// its lock's connection is killed, it stops and a replica takes over.
func TestExclusive_oneHolderAndTakeoverWhenItsSessionDies(t *testing.T) {
	url, schema := pgdbtest.Schema(t)
	name := "work_" + schema
	type event struct {
		replica int
		start   bool
	}
	events := make(chan event, 16)
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	for i := range 2 {
		db := open(t, url, schema, counterMigrations)
		wg.Go(func() {
			db.Exclusive(ctx, name, pgdb.ExclusiveOptions{Retry: 50 * time.Millisecond}, func(work context.Context) {
				events <- event{i, true}
				<-work.Done()
				events <- event{i, false}
			})
		})
	}
	next := func(what string) event {
		t.Helper()
		select {
		case e := <-events:
			return e
		case <-time.After(30 * time.Second): // generous: a failure, not a measure
			t.Fatalf("no event: %s", what)
			return event{}
		}
	}
	first := next("a replica starts the work")
	if !first.start {
		t.Fatalf("first event %+v, want a start", first)
	}
	// The other replica keeps trying (every 50ms) but must not start: check
	// over many of its attempts, through the lock table rather than time.
	db := open(t, url, schema, counterMigrations)
	var holders int
	if err := db.Pool().QueryRow(t.Context(), `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted
AND classid = hashtext('parley.exclusive')::oid AND objid = hashtext($1)::oid`, name).Scan(&holders); err != nil || holders != 1 {
		t.Fatalf("holders of the lock = %d, %v; want 1", holders, err)
	}
	// Kill the holder's session: the holder stops, the other replica starts.
	if _, err := db.Pool().Exec(t.Context(), `SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted
AND classid = hashtext('parley.exclusive')::oid AND objid = hashtext($1)::oid`, name); err != nil {
		t.Fatal(err)
	}
	// The holder's process lives on, so it competes for the lock again:
	// either replica may be the next holder, and the other may take the
	// lock before the holder notices (Exclusive's documented overlap).
	seen := map[event]bool{}
	for range 2 {
		seen[next("the takeover")] = true
	}
	if !seen[event{first.replica, false}] || !seen[event{0, true}] && !seen[event{1, true}] {
		t.Fatalf("after killing replica %d's session: events %v; want it to stop and a replica to start", first.replica, seen)
	}
	select {
	case e := <-events:
		t.Errorf("unexpected event %+v: one holder at a time", e)
	default:
	}
}

// Without a database (bbolt: one process) the work just runs.
func TestExclusive_nilDBRunsTheWork(t *testing.T) {
	ran := false
	pgdb.Of(struct{}{}).Exclusive(t.Context(), "w", pgdb.ExclusiveOptions{}, func(context.Context) { ran = true })
	if !ran {
		t.Error("Exclusive on a nil DB did not run the work")
	}
}

// Every runs its work again each interval until its context ends, and then
// returns; without a database it runs in this process.
func TestEvery_repeatsUntilTheContextEnds(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	runs := 0
	pgdb.Of(struct{}{}).Every(ctx, "w", time.Millisecond, pgdb.ExclusiveOptions{}, func(context.Context) {
		if runs++; runs == 3 {
			cancel()
		}
	})
	if runs != 3 {
		t.Errorf("Every ran the work %d times before its context ended, want 3", runs)
	}
}
