package pgdb

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"google.golang.org/protobuf/proto"

	"github.com/parleyhq/parley/platform/resource"
)

// The helpers below serve the common table shape of a pgstore, a resource
// per row, its proto.Marshal'ed message in a bytea column:
//
//	CREATE TABLE things (name text COLLATE "C" PRIMARY KEY, data bytea NOT NULL);
//
// table is always a constant of the calling store, never input.

// Querier runs statements: a pgx.Tx, or the pool for a single statement.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Get decodes the data of row name of table into m. A missing row is a
// *resource.Error of kind matching resource.ErrNotFound.
func Get(ctx context.Context, q Querier, table, kind, name string, m proto.Message) error {
	var data []byte
	err := q.QueryRow(ctx, `SELECT data FROM `+table+` WHERE name = $1`, name).Scan(&data)
	if errors.Is(err, pgx.ErrNoRows) {
		return resource.NotFound(kind, name)
	}
	if err != nil {
		return err
	}
	if err := proto.Unmarshal(data, m); err != nil {
		return fmt.Errorf("decode %s: %w", name, err)
	}
	return nil
}

// Put stores m as row name of table, replacing any.
func Put(ctx context.Context, q Querier, table, name string, m proto.Message) error {
	data, err := proto.Marshal(m)
	if err != nil {
		return fmt.Errorf("encode %s: %w", name, err)
	}
	_, err = q.Exec(ctx, `INSERT INTO `+table+` (name, data) VALUES ($1, $2)
ON CONFLICT (name) DO UPDATE SET data = excluded.data`, name, data)
	return err
}

// Insert stores m as a new row name of table; an existing row is a
// *resource.Error of kind matching resource.ErrAlreadyExists, and the
// transaction stays usable.
func Insert(ctx context.Context, q Querier, table, kind, name string, m proto.Message) error {
	data, err := proto.Marshal(m)
	if err != nil {
		return fmt.Errorf("encode %s: %w", name, err)
	}
	tag, err := q.Exec(ctx, `INSERT INTO `+table+` (name, data) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING`, name, data)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return resource.AlreadyExists(kind, name)
	}
	return nil
}

// Modify is the read-modify-write of row name of table in one Update:
// it decodes the row into m (resetting m first, as Update may run again),
// runs mutate and writes m back. mutate's error is returned as is, and
// then nothing is written.
func (d *DB) Modify(ctx context.Context, table, kind, name string, m proto.Message, mutate func() error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return d.Update(ctx, func(tx pgx.Tx) error {
		proto.Reset(m)
		if err := Get(ctx, tx, table, kind, name, m); err != nil {
			return err
		}
		if err := mutate(); err != nil {
			return err
		}
		return Put(ctx, tx, table, name, m)
	})
}

// Write runs fn in a READ COMMITTED transaction, for writes that decide
// nothing from what they read: inserts of new rows and upserts whose new
// value is computed by SQL (SET n = t.n + 1). Concurrent writers of one row
// queue on its lock instead of failing to serialize, so a hot counter costs
// no retries. Writers that lock several rows in different orders can still
// deadlock (40P01), and PostgreSQL then aborts one of them: Write runs fn
// again as Update does (jittered backoff, up to 30 runs, then
// resource.ErrContention; ctx's error once ctx ends), so fn may run more
// than once and must set its results afresh on each run. fn's own error is
// returned as is and nothing is written.
func (d *DB) Write(ctx context.Context, fn func(pgx.Tx) error) error {
	return d.retry(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, fn)
}
