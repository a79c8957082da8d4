package pgdb_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"testing/fstest"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/parleyhq/parley/platform/pgdb"
	"github.com/parleyhq/parley/platform/pgdb/pgdbtest"
	"github.com/parleyhq/parley/platform/resource"
)

var counterMigrations = fstest.MapFS{
	"0001_counter.sql": {Data: []byte(`CREATE TABLE counter (id int PRIMARY KEY, n bigint NOT NULL); INSERT INTO counter VALUES (1, 0);`)},
	"0002_notes.sql":   {Data: []byte(`CREATE TABLE notes (body text NOT NULL);`)},
}

func open(t *testing.T, url, schema string, migs fstest.MapFS) *pgdb.DB {
	t.Helper()
	db, err := pgdb.Open(t.Context(), url, pgdb.Options{Schema: schema, Migrations: migs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func TestOpen_concurrentOpensMigrateOnce(t *testing.T) {
	url, schema := pgdbtest.Schema(t)
	// Eight "replicas" start at once; a migration run twice would fail on
	// CREATE TABLE or insert a second counter row.
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			db, err := pgdb.Open(t.Context(), url, pgdb.Options{Schema: schema, Migrations: counterMigrations})
			if err == nil {
				db.Close()
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	db := open(t, url, schema, counterMigrations)
	var rows int
	if err := db.Pool().QueryRow(t.Context(), `SELECT count(*) FROM counter`).Scan(&rows); err != nil || rows != 1 {
		t.Errorf("counter rows = %d, %v; want 1", rows, err)
	}
	if v, err := db.Version(t.Context()); err != nil || v != 2 {
		t.Errorf("Version = %d, %v; want 2", v, err)
	}
}

func TestOpen_appliesOnlyNewMigrations(t *testing.T) {
	url, schema := pgdbtest.Schema(t)
	first := fstest.MapFS{"0001_counter.sql": counterMigrations["0001_counter.sql"]}
	db := open(t, url, schema, first)
	if _, err := db.Pool().Exec(t.Context(), `UPDATE counter SET n = 7`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	db = open(t, url, schema, counterMigrations)
	var n int
	if err := db.Pool().QueryRow(t.Context(), `SELECT n FROM counter`).Scan(&n); err != nil || n != 7 {
		t.Errorf("counter after upgrade = %d, %v; want 7 kept", n, err)
	}
	if _, err := db.Pool().Exec(t.Context(), `INSERT INTO notes VALUES ('x')`); err != nil {
		t.Errorf("migration 2 not applied: %v", err)
	}
}

func TestOpen_refusesANewerSchema(t *testing.T) {
	url, schema := pgdbtest.Schema(t)
	open(t, url, schema, counterMigrations).Close()
	_, err := pgdb.Open(t.Context(), url, pgdb.Options{Schema: schema, Migrations: fstest.MapFS{"0001_counter.sql": counterMigrations["0001_counter.sql"]}})
	if err == nil || !strings.Contains(err.Error(), "newer than this binary") {
		t.Errorf("Open with an older binary = %v; want a refusal naming the newer schema", err)
	}
}

func TestOpen_failedMigrationLeavesNoTrace(t *testing.T) {
	url, schema := pgdbtest.Schema(t)
	bad := fstest.MapFS{
		"0001_counter.sql": counterMigrations["0001_counter.sql"],
		"0002_bad.sql":     {Data: []byte(`CREATE TABLE half (x int); SELECT no_such_function();`)},
	}
	if _, err := pgdb.Open(t.Context(), url, pgdb.Options{Schema: schema, Migrations: bad}); err == nil || !strings.Contains(err.Error(), "0002_bad.sql") {
		t.Fatalf("Open with a failing migration = %v; want an error naming it", err)
	}
	db := open(t, url, schema, fstest.MapFS{"0001_counter.sql": counterMigrations["0001_counter.sql"]})
	if v, _ := db.Version(t.Context()); v != 1 {
		t.Errorf("Version after failed migration 2 = %d, want 1", v)
	}
	var half bool
	if err := db.Pool().QueryRow(t.Context(), `SELECT to_regclass('half') IS NOT NULL`).Scan(&half); err != nil || half {
		t.Errorf("table of the failed migration exists = %v, %v; want rolled back", half, err)
	}
}

func TestReadMigrations_refusesBadSets(t *testing.T) {
	for name, fsys := range map[string]fstest.MapFS{
		"empty":   {},
		"no num":  {"counter.sql": {Data: []byte(`SELECT 1`)}},
		"gap":     {"0001_a.sql": {Data: []byte(`SELECT 1`)}, "0003_c.sql": {Data: []byte(`SELECT 1`)}},
		"repeat":  {"0001_a.sql": {Data: []byte(`SELECT 1`)}, "1_b.sql": {Data: []byte(`SELECT 1`)}},
		"version": {"0000_a.sql": {Data: []byte(`SELECT 1`)}},
	} {
		// No server needed: the set is refused before connecting.
		if _, err := pgdb.Open(context.Background(), "postgres://127.0.0.1:1/x", pgdb.Options{Schema: "s", Migrations: fsys}); err == nil || !strings.Contains(err.Error(), "migration") {
			t.Errorf("%s: Open = %v; want a migration error", name, err)
		}
	}
	for _, s := range []string{"", "Upper", "1abc", "a-b", "a;drop"} {
		if _, err := pgdb.Open(context.Background(), "postgres://127.0.0.1:1/x", pgdb.Options{Schema: s, Migrations: counterMigrations}); err == nil {
			t.Errorf("schema %q accepted", s)
		}
	}
}

func TestOpen_badURLDoesNotEchoThePassword(t *testing.T) {
	_, err := pgdb.Open(context.Background(), "postgres://u:sekrit@host:notaport/db", pgdb.Options{Schema: "s", Migrations: counterMigrations})
	if err == nil || strings.Contains(err.Error(), "sekrit") {
		t.Errorf("Open(bad URL) = %v; want an error without the password", err)
	}
}

// TestUpdate_serializesReadModifyWrite: concurrent read-then-write
// increments lose nothing, because conflicting transactions are retried.
func TestUpdate_serializesReadModifyWrite(t *testing.T) {
	url, schema := pgdbtest.Schema(t)
	db := open(t, url, schema, counterMigrations)
	const n = 24
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Go(func() {
			errs <- db.Update(t.Context(), func(tx pgx.Tx) error {
				var v int64
				if err := tx.QueryRow(t.Context(), `SELECT n FROM counter WHERE id = 1`).Scan(&v); err != nil {
					return err
				}
				_, err := tx.Exec(t.Context(), `UPDATE counter SET n = $1 WHERE id = 1`, v+1)
				return err
			})
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	var v int64
	err := db.View(t.Context(), func(tx pgx.Tx) error {
		return tx.QueryRow(t.Context(), `SELECT n FROM counter WHERE id = 1`).Scan(&v)
	})
	if err != nil || v != n {
		t.Errorf("counter = %d, %v; want %d", v, err, n)
	}
}

func TestUpdate_fnErrorWritesNothing(t *testing.T) {
	url, schema := pgdbtest.Schema(t)
	db := open(t, url, schema, counterMigrations)
	boom := context.Canceled // any sentinel of ours
	err := db.Update(t.Context(), func(tx pgx.Tx) error {
		if _, err := tx.Exec(t.Context(), `UPDATE counter SET n = 99`); err != nil {
			return err
		}
		return boom
	})
	if err != boom { //nolint:errorlint // returned as is
		t.Errorf("Update = %v, want fn's error as is", err)
	}
	var v int64
	if err := db.Pool().QueryRow(t.Context(), `SELECT n FROM counter`).Scan(&v); err != nil || v != 0 {
		t.Errorf("counter = %d, %v; want 0", v, err)
	}
}

// A write that keeps failing to serialize is given up after the bound with
// resource.ErrContention (the services answer ABORTED STORE_CONTENTION),
// not a bare driver error (INTERNAL), and writes nothing.
func TestUpdate_endlessConflictIsContention(t *testing.T) {
	url, schema := pgdbtest.Schema(t)
	db := open(t, url, schema, counterMigrations)
	runs := 0
	err := db.Update(t.Context(), func(tx pgx.Tx) error {
		runs++
		if _, err := tx.Exec(t.Context(), `UPDATE counter SET n = n + 1`); err != nil {
			return err
		}
		return &pgconn.PgError{Code: "40001", Message: "could not serialize access"}
	})
	if !errors.Is(err, resource.ErrContention) || runs < 2 {
		t.Errorf("Update = %v after %d runs, want resource.ErrContention after retries", err, runs)
	}
	var v int64
	if err := db.Pool().QueryRow(t.Context(), `SELECT n FROM counter`).Scan(&v); err != nil || v != 0 {
		t.Errorf("counter = %d, %v; want 0", v, err)
	}
}

// A server that does not answer at Open is no error: the DB starts not
// ready (Ping fails) and keeps trying until Close. (e2e's
// TestPostgreSQL_databaseDownAtStart sees it become ready.)
func TestOpen_unreachableServerStartsNotReady(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	db, err := pgdb.Open(t.Context(), "postgres://u@"+addr+"/d?connect_timeout=2", pgdb.Options{Schema: "s", Migrations: counterMigrations, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatalf("Open(unreachable) = %v, want a DB that is not ready", err)
	}
	if db.Ready() {
		t.Error("Ready() = true for a server that never answered")
	}
	if err := db.Ping(t.Context()); err == nil || !strings.Contains(err.Error(), "not migrated yet") {
		t.Errorf("Ping = %v, want not migrated yet", err)
	}
	if err := db.Close(); err != nil {
		t.Errorf("Close = %v", err)
	}
}

// TestWrite_retriesARealDeadlock: two Writes lock the same two rows in
// opposite orders, each waiting until the other holds its first row, so
// PostgreSQL must abort one of them with a deadlock (40P01). Write runs
// the victim again, and both increments land.
func TestWrite_retriesARealDeadlock(t *testing.T) {
	url, schema := pgdbtest.Schema(t)
	db := open(t, url, schema, counterMigrations)
	if _, err := db.Pool().Exec(t.Context(), `INSERT INTO counter VALUES (2, 0)`); err != nil {
		t.Fatal(err)
	}
	var (
		holding sync.WaitGroup // each Write's first run holds its first row
		runs    [2]int
		wg      sync.WaitGroup
		errs    [2]error
	)
	holding.Add(2)
	for i, order := range [2][2]int{{1, 2}, {2, 1}} {
		wg.Go(func() {
			errs[i] = db.Write(t.Context(), func(tx pgx.Tx) error {
				runs[i]++
				// Found at once, so the test does not wait the default 1s.
				if _, err := tx.Exec(t.Context(), `SET LOCAL deadlock_timeout = '50ms'`); err != nil {
					return err
				}
				if _, err := tx.Exec(t.Context(), `UPDATE counter SET n = n + 1 WHERE id = $1`, order[0]); err != nil {
					return err
				}
				if runs[i] == 1 {
					holding.Done()
					holding.Wait()
				}
				_, err := tx.Exec(t.Context(), `UPDATE counter SET n = n + 1 WHERE id = $1`, order[1])
				return err
			})
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("Write %d = %v, want the deadlock retried", i, err)
		}
	}
	if runs[0]+runs[1] < 3 {
		t.Errorf("Write ran fn %d+%d times, want a rerun of the deadlock's victim", runs[0], runs[1])
	}
	if got := db.Retries(); got != int64(runs[0]+runs[1]-2) {
		t.Errorf("Retries() = %d after %d+%d runs of two Writes, want %d", got, runs[0], runs[1], runs[0]+runs[1]-2)
	}
	for _, id := range []int{1, 2} {
		var n int64
		if err := db.Pool().QueryRow(t.Context(), `SELECT n FROM counter WHERE id = $1`, id).Scan(&n); err != nil || n != 2 {
			t.Errorf("counter %d = %d, %v; want 2 (both Writes committed once)", id, n, err)
		}
	}
}

// A Write that keeps failing to serialize is bounded like Update's.
func TestWrite_endlessConflictIsContention(t *testing.T) {
	url, schema := pgdbtest.Schema(t)
	db := open(t, url, schema, counterMigrations)
	runs := 0
	err := db.Write(t.Context(), func(tx pgx.Tx) error {
		runs++
		return &pgconn.PgError{Code: "40P01", Message: "deadlock detected"}
	})
	if !errors.Is(err, resource.ErrContention) || runs < 2 {
		t.Errorf("Write = %v after %d runs, want resource.ErrContention after retries", err, runs)
	}
}

// A Write whose context ends while it waits to retry returns the
// context's error.
func TestWrite_stopsRetryingWhenTheContextEnds(t *testing.T) {
	url, schema := pgdbtest.Schema(t)
	db := open(t, url, schema, counterMigrations)
	ctx, cancel := context.WithCancel(t.Context())
	runs := 0
	err := db.Write(ctx, func(tx pgx.Tx) error {
		runs++
		cancel()
		return &pgconn.PgError{Code: "40001", Message: "could not serialize access"}
	})
	if !errors.Is(err, context.Canceled) || runs != 1 {
		t.Errorf("Write = %v after %d runs, want context.Canceled after 1", err, runs)
	}
}

// A migration split by "-- pgdb:commit" runs each part in a transaction of
// its own, and a "-- pgdb:batch" part runs again, each time in a new
// transaction and given what it returned last ($1, NULL at first), until
// it returns NULL: a backfill of a large table in batches, holding its row
// locks and WAL one batch at a time. The version is recorded once every
// part ran.
func TestOpen_runsAMigrationInPartsAndBatches(t *testing.T) {
	url, schema := pgdbtest.Schema(t)
	migs := fstest.MapFS{
		"0001_rows.sql": {Data: []byte(`CREATE TABLE rows (id int PRIMARY KEY, n int);
INSERT INTO rows SELECT g, NULL FROM generate_series(1, 25) AS g;
CREATE TABLE runs (tx bigint NOT NULL, part text NOT NULL);`)},
		"0002_fill.sql": {Data: []byte(`ALTER TABLE rows ADD COLUMN IF NOT EXISTS doubled int;
INSERT INTO runs VALUES (txid_current(), 'first');
-- pgdb:batch
WITH b AS (SELECT id FROM rows WHERE id > coalesce($1::int, 0) ORDER BY id LIMIT 10),
u AS (UPDATE rows r SET doubled = 2 * r.id FROM b WHERE r.id = b.id),
l AS (INSERT INTO runs VALUES (txid_current(), 'batch'))
SELECT max(id) FROM b
-- pgdb:commit
ALTER TABLE rows ALTER COLUMN doubled SET NOT NULL;
INSERT INTO runs VALUES (txid_current(), 'last');`)},
	}
	db := open(t, url, schema, migs)
	if v, err := db.Version(t.Context()); err != nil || v != 2 {
		t.Fatalf("Version = %d, %v; want 2", v, err)
	}
	var wrong int64
	if err := db.Pool().QueryRow(t.Context(), `SELECT count(*) FROM rows WHERE doubled IS DISTINCT FROM 2 * id`).Scan(&wrong); err != nil || wrong != 0 {
		t.Errorf("rows not filled = %d, %v; want 0", wrong, err)
	}
	var parts []string
	var txs int
	if err := db.Pool().QueryRow(t.Context(), `SELECT array_agg(part ORDER BY tx), count(DISTINCT tx) FROM runs`).Scan(&parts, &txs); err != nil {
		t.Fatal(err)
	}
	// Three batches of 10, 10 and 5 rows, then an empty one that ends them.
	want := "first batch batch batch batch last"
	if got := strings.Join(parts, " "); got != want || txs != 6 {
		t.Errorf("parts run = %q in %d transactions, want %q in 6", got, txs, want)
	}
}

// A part that fails leaves the parts before it committed and the version
// unrecorded; the next Open runs the migration again from its first part
// (so every part must be safe to run again) and records it.
func TestOpen_aFailedPartIsRunAgainFromTheStart(t *testing.T) {
	url, schema := pgdbtest.Schema(t)
	first := fstest.MapFS{"0001_counter.sql": counterMigrations["0001_counter.sql"]}
	open(t, url, schema, first).Close()
	part := func(last string) fstest.MapFS {
		return fstest.MapFS{
			"0001_counter.sql": counterMigrations["0001_counter.sql"],
			"0002_parts.sql": {Data: []byte(`UPDATE counter SET n = n + 1;
-- pgdb:commit
` + last)},
		}
	}
	if _, err := pgdb.Open(t.Context(), url, pgdb.Options{Schema: schema, Migrations: part(`SELECT no_such_function();`)}); err == nil || !strings.Contains(err.Error(), "0002_parts.sql") {
		t.Fatalf("Open with a failing second part = %v; want an error naming the migration", err)
	}
	db := open(t, url, schema, first)
	var n int64
	if err := db.Pool().QueryRow(t.Context(), `SELECT n FROM counter`).Scan(&n); err != nil || n != 1 {
		t.Errorf("counter after a failed second part = %d, %v; want 1 (the first part committed)", n, err)
	}
	if v, _ := db.Version(t.Context()); v != 1 {
		t.Errorf("Version after a failed part = %d, want 1", v)
	}
	db.Close()
	db = open(t, url, schema, part(`SELECT 1;`))
	if err := db.Pool().QueryRow(t.Context(), `SELECT n FROM counter`).Scan(&n); err != nil || n != 2 {
		t.Errorf("counter after the rerun = %d, %v; want 2 (the first part ran again)", n, err)
	}
	if v, _ := db.Version(t.Context()); v != 2 {
		t.Errorf("Version after the rerun = %d, want 2", v)
	}
}
