// Package pgdb is the one way Parley opens a PostgreSQL database: a pgx pool
// whose connections work in one service's schema, versioned SQL migrations
// applied at start under an advisory lock (so that several replicas starting
// at once migrate once), and transactions that retry serialization failures
// and deadlocks.
//
// Each service keeps its tables and migrations in its pgstore; this package
// knows none of them. It owns two tables in every schema, made by Open
// outside the migrations: schema_migrations, and rate_buckets, the token
// buckets that keep a rate limit across replicas (TakeToken). Together with the pgstores it is the only code that
// imports github.com/jackc/pgx (e2e/arch_pgx_test.go checks that).
//
// Migrations are files named NNNN_what.sql (NNNN a positive decimal version)
// in an fs.FS, usually embedded. Each runs in its own transaction together
// with the insert of its version into the schema's schema_migrations table.
// A database migrated past the newest version the binary knows is refused.
//
// A migration too large for one transaction (a backfill of a big table,
// whose row locks and WAL one transaction would hold until its end) is
// split into parts by lines of their own:
//
//	-- pgdb:commit   ends a part: what follows runs in a new transaction
//	-- pgdb:batch    what follows, up to the next such line, is one
//	                 statement run again and again, each time in a new
//	                 transaction and given as $1 what it returned last
//	                 (NULL at first), until it returns NULL: a keyset walk
//	                 of a table, a batch per transaction
//
// The version is recorded with the last part. A failure leaves the parts
// before it committed, and the next Open runs the migration again from its
// first part: every part must be safe to run again.
package pgdb

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/parleyhq/parley/platform/resource"
)

// Options says what a store needs from its database.
type Options struct {
	// Schema is the PostgreSQL schema the store's tables live in, created
	// when missing; every connection has it as its search_path. Required.
	Schema string
	// Migrations holds the NNNN_what.sql files, in its directory
	// "migrations" when it has one (a pgstore's embed.FS), else at its root.
	Migrations fs.FS
	// ConnectTimeout bounds one connection attempt; default 5s.
	ConnectTimeout time.Duration
	// MaxConns caps the pool; default pgxpool's (4 or the CPU count).
	MaxConns int32
	// Logger reports a database that cannot be reached at Open, and
	// failed sweeps of rate_buckets (the service's logger); discarded
	// when nil.
	Logger *slog.Logger
}

// OpenTimeout is how long a service gives Open at start: connecting,
// waiting for another replica's migration and migrating.
const OpenTimeout = time.Minute

// DB is an open database: a pool of connections in one schema.
type DB struct {
	pool   *pgxpool.Pool
	schema string

	ready   atomic.Bool // the schema is migrated
	mu      sync.Mutex  // guards lastErr
	lastErr error       // why the schema is not migrated yet
	stop    context.CancelFunc
	stopped chan struct{} // closed when the background migration ended

	bucketsSwept atomic.Int64 // UnixNano of the last sweepBuckets
	retries      atomic.Int64 // transactions run again by retry
	logger       *slog.Logger // Options.Logger, or a discarding one
}

// migration is one parsed migration file.
type migration struct {
	version int
	name    string
	parts   []part // one, unless split by the markers of the package comment
}

// part is a piece of a migration run in a transaction of its own (or, a
// batch, in a transaction per run).
type part struct {
	sql   string
	batch bool
}

// The lines that split a migration into parts.
const (
	commitMarker = "-- pgdb:commit"
	batchMarker  = "-- pgdb:batch"
)

// splitParts splits a migration's SQL at its marker lines.
func splitParts(sql string) ([]part, error) {
	var (
		out  []part
		cur  strings.Builder
		next part
	)
	flush := func() error {
		next.sql = cur.String()
		if strings.TrimSpace(next.sql) == "" {
			if next.batch {
				return errors.New("an empty batch")
			}
		} else {
			out = append(out, next)
		}
		cur.Reset()
		return nil
	}
	for line := range strings.Lines(sql) {
		switch strings.TrimSpace(line) {
		case commitMarker, batchMarker:
			if err := flush(); err != nil {
				return nil, err
			}
			next = part{batch: strings.TrimSpace(line) == batchMarker}
		default:
			cur.WriteString(line)
		}
	}
	if err := flush(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		out = append(out, part{sql: sql})
	}
	return out, nil
}

// Open connects to the database at url (a postgres:// URL or a key=value
// DSN), creates opts.Schema when missing and applies the migrations it has
// not seen, under an advisory lock so that concurrent Opens migrate once.
// It fails when the database was migrated by a newer binary.
func Open(ctx context.Context, url string, opts Options) (*DB, error) {
	if !validSchema(opts.Schema) {
		return nil, fmt.Errorf("pgdb: schema %q: want lower-case letters, digits and _", opts.Schema)
	}
	migs, err := readMigrations(opts.Migrations)
	if err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		// The error can quote the URL, password included.
		return nil, errors.New("pgdb: the database URL does not parse (want postgres://user:password@host:port/database)")
	}
	cfg.ConnConfig.ConnectTimeout = opts.ConnectTimeout
	if cfg.ConnConfig.ConnectTimeout <= 0 {
		cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	}
	if opts.MaxConns > 0 {
		cfg.MaxConns = opts.MaxConns
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = opts.Schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pgdb: %w", err)
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	d := &DB{pool: pool, schema: opts.Schema, stop: func() {}, stopped: make(chan struct{}), logger: logger}
	err = d.migrate(ctx, migs)
	if err == nil {
		d.ready.Store(true)
		close(d.stopped)
		return d, nil
	}
	if !unreachable(err) {
		pool.Close()
		return nil, err
	}
	// The server does not answer: start anyway, not ready (Ping fails),
	// and migrate once it does, so that a service whose database is down
	// waits for it instead of exiting.
	d.setErr(err)
	bg, stop := context.WithCancel(context.WithoutCancel(ctx))
	d.stop = stop
	go d.migrateLater(bg, migs, logger, err)
	return d, nil
}

// unreachable reports an error of connecting to the server, which
// migrateLater retries; any other error of Open is final.
func unreachable(err error) bool {
	var ce *pgconn.ConnectError
	return errors.As(err, &ce)
}

func (d *DB) setErr(err error) {
	d.mu.Lock()
	d.lastErr = err
	d.mu.Unlock()
}

// migrateWait is the first wait between attempts of migrateLater; it
// doubles up to migrateWaitMax.
const (
	migrateWait    = time.Second
	migrateWaitMax = 10 * time.Second
)

// migrateLater tries to migrate until it succeeds, a migration fails for
// another reason than reaching the server (logged; the DB stays not
// ready), or ctx ends.
func (d *DB) migrateLater(ctx context.Context, migs []migration, logger *slog.Logger, first error) {
	defer close(d.stopped)
	logger.WarnContext(ctx, "the database does not answer; starting not ready and retrying", slog.String("schema", d.schema), slog.Any("err", first))
	for wait := migrateWait; ; wait = min(2*wait, migrateWaitMax) {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		err := d.migrate(ctx, migs)
		switch {
		case err == nil:
			d.ready.Store(true)
			logger.InfoContext(ctx, "the database answers; schema migrated", slog.String("schema", d.schema))
			return
		case ctx.Err() != nil:
			return
		case !unreachable(err):
			d.setErr(err)
			logger.ErrorContext(ctx, "the database answers but cannot be used; staying not ready", slog.String("schema", d.schema), slog.Any("err", err))
			return
		}
		d.setErr(err)
	}
}

// Ready reports whether the schema is migrated: at once after Open, unless
// the server did not answer then.
func (d *DB) Ready() bool { return d.ready.Load() }

// validSchema accepts the names Open quotes nowhere: [a-z_][a-z0-9_]*.
func validSchema(s string) bool {
	if s == "" || len(s) > 63 || (s[0] >= '0' && s[0] <= '9') {
		return false
	}
	for _, c := range s {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' {
			return false
		}
	}
	return true
}

// readMigrations parses the NNNN_what.sql files of fsys in version order.
func readMigrations(fsys fs.FS) ([]migration, error) {
	if fsys == nil {
		return nil, errors.New("pgdb: no migrations")
	}
	if st, err := fs.Stat(fsys, "migrations"); err == nil && st.IsDir() {
		sub, err := fs.Sub(fsys, "migrations")
		if err != nil {
			return nil, fmt.Errorf("pgdb: migrations: %w", err)
		}
		fsys = sub
	}
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return nil, fmt.Errorf("pgdb: migrations: %w", err)
	}
	var out []migration
	for _, e := range entries {
		if e.IsDir() || path.Ext(e.Name()) != ".sql" {
			continue
		}
		num, _, ok := strings.Cut(e.Name(), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v < 1 {
			return nil, fmt.Errorf("pgdb: migration %s: want NNNN_what.sql with NNNN a positive version", e.Name())
		}
		b, err := fs.ReadFile(fsys, e.Name())
		if err != nil {
			return nil, fmt.Errorf("pgdb: migration %s: %w", e.Name(), err)
		}
		parts, err := splitParts(string(b))
		if err != nil {
			return nil, fmt.Errorf("pgdb: migration %s: %w", e.Name(), err)
		}
		out = append(out, migration{version: v, name: e.Name(), parts: parts})
	}
	slices.SortFunc(out, func(a, b migration) int { return a.version - b.version })
	for i, m := range out {
		if m.version != i+1 {
			return nil, fmt.Errorf("pgdb: migration %s: versions must run 1, 2, 3... without gaps or repeats", m.name)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("pgdb: no migrations")
	}
	return out, nil
}

// migrate brings the schema to the newest migration, holding a session
// advisory lock named after the schema meanwhile.
func (d *DB) migrate(ctx context.Context, migs []migration) error {
	conn, err := d.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("pgdb: connect: %w", err)
	}
	defer conn.Release()
	lock := "parley.migrate." + d.schema
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock(hashtext($1))`, lock); err != nil {
		return fmt.Errorf("pgdb: migration lock: %w", err)
	}
	defer func() {
		// Unlock even when ctx is done: the connection goes back to the pool.
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, err := conn.Exec(uctx, `SELECT pg_advisory_unlock(hashtext($1))`, lock); err != nil {
			_ = conn.Conn().Close(uctx) // a closed session drops its locks
		}
	}()
	setup := `CREATE SCHEMA IF NOT EXISTS ` + d.schema + `;
CREATE TABLE IF NOT EXISTS ` + d.schema + `.schema_migrations (
  version    integer PRIMARY KEY,
  name       text NOT NULL,
  applied_at timestamptz NOT NULL DEFAULT now()
)`
	if _, err := conn.Exec(ctx, setup); err != nil {
		return fmt.Errorf("pgdb: create schema %s: %w", d.schema, err)
	}
	if _, err := conn.Exec(ctx, fmt.Sprintf(bucketsTable, d.schema)); err != nil {
		return fmt.Errorf("pgdb: create schema %s: rate_buckets: %w", d.schema, err)
	}
	var have int
	if err := conn.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM schema_migrations`).Scan(&have); err != nil {
		return fmt.Errorf("pgdb: read schema version: %w", err)
	}
	if have > len(migs) {
		return fmt.Errorf("pgdb: schema %s is at version %d, newer than this binary's %d; was it migrated by a newer release? refusing to start", d.schema, have, len(migs))
	}
	for _, m := range migs[have:] {
		if err := apply(ctx, conn.Conn(), m); err != nil {
			return fmt.Errorf("pgdb: schema %s: migration %s: %w", d.schema, m.name, err)
		}
	}
	return nil
}

// apply runs m's parts on conn, each in its own transaction (a batch in
// one per run), and records m's version with the last.
func apply(ctx context.Context, conn *pgx.Conn, m migration) error {
	record := func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO schema_migrations (version, name) VALUES ($1, $2)`, m.version, m.name)
		return err
	}
	for i, p := range m.parts {
		last := i == len(m.parts)-1
		if !p.batch {
			err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, p.sql); err != nil {
					return err
				}
				if last {
					return record(tx)
				}
				return nil
			})
			if err != nil {
				return err
			}
			continue
		}
		var prev any // NULL at first
		for {
			var next any
			err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
				return tx.QueryRow(ctx, p.sql, prev).Scan(&next)
			})
			if err != nil {
				return fmt.Errorf("batch after %v: %w", prev, err)
			}
			if next == nil {
				break
			}
			prev = next
		}
		if last {
			if err := pgx.BeginFunc(ctx, conn, record); err != nil {
				return err
			}
		}
	}
	return nil
}

// Version returns the schema's migration version.
func (d *DB) Version(ctx context.Context) (int, error) {
	var v int
	err := d.pool.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM schema_migrations`).Scan(&v)
	return v, err
}

// Pool is the connection pool, for single statements outside a transaction.
func (d *DB) Pool() *pgxpool.Pool { return d.pool }

// Ping checks that a connection works: a store's readiness.
// It fails while the schema is not migrated (the server did not answer
// at Open, see Ready).
func (d *DB) Ping(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if !d.ready.Load() {
		d.mu.Lock()
		defer d.mu.Unlock()
		return fmt.Errorf("pgdb: schema %s is not migrated yet (the database did not answer; retrying): %w", d.schema, d.lastErr)
	}
	return d.pool.Ping(ctx)
}

// Close stops a background migration and closes every connection. Later
// calls fail.
func (d *DB) Close() error {
	d.stop()
	<-d.stopped
	d.pool.Close()
	return nil
}

// View runs fn in a read-only REPEATABLE READ transaction: fn sees one
// snapshot of the database.
func (d *DB) View(ctx context.Context, fn func(pgx.Tx) error) error {
	return pgx.BeginTxFunc(ctx, d.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, fn)
}

// maxAttempts bounds how often Update and Write run a transaction that
// keeps failing to serialize or deadlocking; contention that high is a
// fault, not a retry.
const maxAttempts = 30

// Update runs fn in a SERIALIZABLE transaction and commits it: the outcome
// is as if every Update ran alone, one after another, across every replica.
// When PostgreSQL aborts the transaction to keep that promise (SQLSTATE
// 40001 or a deadlock, 40P01), Update waits a short random time and runs fn
// again, up to 30 times, and then fails with resource.ErrContention. So,
// as with platform/boltdb, fn may run more than
// once: it must set its results afresh on each run and have no effect
// outside the transaction. fn's own error is returned as is and nothing is
// written.
func (d *DB) Update(ctx context.Context, fn func(pgx.Tx) error) error {
	return d.retry(ctx, pgx.TxOptions{IsoLevel: pgx.Serializable}, fn)
}

// retry runs fn in a transaction of opts until it commits, fails for
// another reason than a serialization failure or deadlock, ctx ends, or
// maxAttempts runs conflicted (resource.ErrContention).
func (d *DB) retry(ctx context.Context, opts pgx.TxOptions, fn func(pgx.Tx) error) error {
	var err error
	for attempt := range maxAttempts {
		err = pgx.BeginTxFunc(ctx, d.pool, opts, fn)
		if !retryable(err) {
			return err
		}
		d.retries.Add(1)
		// Jittered backoff, growing to about 50ms: contenders spread out.
		wait := time.Duration(rand.Int64N(int64(time.Millisecond) << min(attempt, 6)))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
	return fmt.Errorf("pgdb: transaction still conflicting after %d attempts: %w: %w", maxAttempts, resource.ErrContention, err)
}

// Retries returns how many times Update and Write ran a transaction again
// after a serialization failure or deadlock since Open: the price of
// contention, which a store's tests can check it does not pay.
func (d *DB) Retries() int64 { return d.retries.Load() }

// retryable reports a serialization failure or deadlock.
func retryable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "40001" || pe.Code == "40P01")
}

// IsUniqueViolation reports a unique or primary-key violation (23505).
func IsUniqueViolation(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23505"
}
