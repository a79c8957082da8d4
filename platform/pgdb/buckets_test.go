package pgdb_test

import (
	"context"
	"sync"
	"testing"

	"github.com/parleyhq/parley/platform/pgdb/pgdbtest"
)

// Two replicas (two DBs on one schema) taking from one bucket at once get
// burst tokens between them, not burst each; other keys and limits have
// buckets of their own.
func TestTakeToken_oneBucketAcrossReplicas(t *testing.T) {
	url, schema := pgdbtest.Schema(t)
	a := open(t, url, schema, counterMigrations)
	b := open(t, url, schema, counterMigrations)
	const burst = 5
	const perHour = 1.0 / 3600 // no refill within the test
	var mu sync.Mutex
	took := 0
	var wg sync.WaitGroup
	for i := range 16 {
		db := a
		if i%2 == 1 {
			db = b
		}
		wg.Go(func() {
			ok, err := db.TakeToken(t.Context(), "auth.failures", "192.0.2.1", perHour, burst)
			if err != nil {
				t.Error(err)
			}
			if ok {
				mu.Lock()
				took++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if took != burst {
		t.Errorf("16 TakeToken calls on two replicas took %d tokens, want the burst, %d", took, burst)
	}
	for _, db := range []interface {
		TokenLeft(ctx context.Context, name, key string, rate float64, burst int) (bool, error)
	}{a, b} {
		if left, err := db.TokenLeft(t.Context(), "auth.failures", "192.0.2.1", perHour, burst); err != nil || left {
			t.Errorf("TokenLeft(exhausted bucket) = %v, %v; want false", left, err)
		}
	}
	if left, err := b.TokenLeft(t.Context(), "auth.failures", "192.0.2.2", perHour, burst); err != nil || !left {
		t.Errorf("TokenLeft(unknown key) = %v, %v; want true", left, err)
	}
	for _, k := range [][2]string{{"auth.failures", "192.0.2.2"}, {"registrations", "192.0.2.1"}} {
		if ok, err := b.TakeToken(t.Context(), k[0], k[1], perHour, burst); err != nil || !ok {
			t.Errorf("TakeToken(%s, %s) = %v, %v; want a token from a bucket of its own", k[0], k[1], ok, err)
		}
	}
}

// A bucket refills at its rate: with a rate far above a statement's
// duration, the token taken is back by the next statement.
func TestTakeToken_refills(t *testing.T) {
	url, schema := pgdbtest.Schema(t)
	db := open(t, url, schema, counterMigrations)
	for i := range 3 {
		if ok, err := db.TakeToken(t.Context(), "fast", "k", 1e9, 1); err != nil || !ok {
			t.Fatalf("TakeToken #%d at 1e9 tokens/s, burst 1 = %v, %v; want true", i+1, ok, err)
		}
	}
}

// The sweep deletes the buckets that are full again and keeps the others.
func TestSweepBuckets_dropsFullBuckets(t *testing.T) {
	url, schema := pgdbtest.Schema(t)
	db := open(t, url, schema, counterMigrations)
	ctx := t.Context()
	if _, err := db.TakeToken(ctx, "slow", "k", 1.0/3600, 2); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"a", "b", "c"} {
		if _, err := db.TakeToken(ctx, "fast", k, 1e9, 2); err != nil {
			t.Fatal(err)
		}
	}
	// TakeToken swept once already (the first call of a DB does); sweep
	// now that the fast buckets are full again.
	if _, err := db.SweepBuckets(t); err != nil {
		t.Fatal(err)
	}
	var names []string
	rows, err := db.Pool().Query(ctx, `SELECT name || '/' || key FROM rate_buckets ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		names = append(names, n)
	}
	if rows.Err() != nil || len(names) != 1 || names[0] != "slow/k" {
		t.Errorf("rate_buckets after the sweep = %v (%v), want [slow/k]", names, rows.Err())
	}
}

// A take whose bucket sweep fails still reports its token: the sweep is
// housekeeping, retried a minute later, and a failure must not turn the
// take into an error (auth.Limiter would then answer from its buckets in
// memory and warn that the shared limit is unavailable). A trigger that
// refuses deletes makes the sweep fail.
func TestTakeToken_sweepFailureKeepsTheTake(t *testing.T) {
	url, schema := pgdbtest.Schema(t)
	db := open(t, url, schema, counterMigrations)
	if _, err := db.Pool().Exec(t.Context(), `CREATE FUNCTION refuse_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'deletes refused'; END $$;
CREATE TRIGGER refuse_delete BEFORE DELETE ON rate_buckets FOR EACH ROW EXECUTE FUNCTION refuse_delete();`); err != nil {
		t.Fatal(err)
	}
	// A bucket full again, so that the sweep has a row to delete.
	if _, err := db.Pool().Exec(t.Context(), `INSERT INTO rate_buckets (name, key, tokens, at, full_at, took) VALUES ('old', 'k', 1, now(), now() - interval '1 hour', true)`); err != nil {
		t.Fatal(err)
	}
	// A DB's first take sweeps.
	if ok, err := db.TakeToken(t.Context(), "auth.failures", "192.0.2.1", 1, 5); err != nil || !ok {
		t.Errorf("TakeToken with the sweep failing = %v, %v; want true, nil", ok, err)
	}
}
