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
// its lock's connection is killed, it stops and the other takes over.
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
	seen := map[event]bool{}
	for range 2 {
		seen[next("the takeover")] = true
	}
	if !seen[event{first.replica, false}] || !seen[event{1 - first.replica, true}] {
		t.Fatalf("after killing replica %d's session: events %v; want it to stop and replica %d to start", first.replica, seen, 1-first.replica)
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
