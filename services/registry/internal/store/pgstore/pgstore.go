// Package pgstore is the registry's PostgreSQL backend, for running several
// replicas on one database (docs/adr/0007-postgresql-backend.md). Its
// tables live in their own schema, created and migrated by Open from the
// embedded migrations/*.sql. Values are proto.Marshal'ed registryv1
// messages, as in boltstore.
package pgstore

import (
	"context"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/proto"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/pgdb"
	"github.com/parleyhq/parley/platform/resource"
	"github.com/parleyhq/parley/services/registry/internal/pd"
	"github.com/parleyhq/parley/services/registry/internal/store"
)

// Schema is the PostgreSQL schema of the registry's tables.
const Schema = "registry"

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Store is the PostgreSQL-backed store.
type Store struct {
	db        *pgdb.DB
	maxOutbox int // notifications kept; 0 means store.MaxOutbox
}

var _ store.Store = (*Store)(nil)

// Open connects to the database at url and migrates schema (Schema, or a
// test's own). logger (the service's) hears of a database that does not
// answer yet; nil discards that.
func Open(ctx context.Context, url, schema string, logger *slog.Logger) (*Store, error) {
	db, err := pgdb.Open(ctx, url, pgdb.Options{Schema: schema, Migrations: migrationFiles, Logger: logger})
	if err != nil {
		return nil, err
	}
	return &Store{db: db}, nil
}

// Ping checks that the database answers.
func (s *Store) Ping(ctx context.Context) error { return s.db.Ping(ctx) }

// DB is the database, for work that runs on one replica at a time
// (pgdb.DB.Exclusive).
func (s *Store) DB() *pgdb.DB { return s.db }

// Close closes the connections.
func (s *Store) Close() error { return s.db.Close() }

// SetOutboxLimit sets how many notifications the outbox keeps (tests).
func (s *Store) SetOutboxLimit(n int) { s.maxOutbox = n }

// one reads the single bytea column of a query into m; no row is notFound.
func one[T proto.Message](ctx context.Context, q pgdb.Querier, m T, notFound error, sql string, args ...any) (T, error) {
	var data []byte
	err := q.QueryRow(ctx, sql, args...).Scan(&data)
	if errors.Is(err, pgx.ErrNoRows) {
		return m, notFound
	}
	if err != nil {
		return m, err
	}
	return resource.Decode(data, m)
}

// many decodes the single bytea column of every row of a query.
func many[T proto.Message](ctx context.Context, q pgdb.Querier, newT func() T, sql string, args ...any) ([]T, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (T, error) {
		var data []byte
		if err := r.Scan(&data); err != nil {
			var zero T
			return zero, err
		}
		return resource.Decode(data, newT())
	})
}

// names returns the single text column of every row of a query.
func names(ctx context.Context, q pgdb.Querier, sql string, args ...any) ([]string, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// exists reports whether a query returns a row.
func exists(ctx context.Context, q pgdb.Querier, sql string, args ...any) (bool, error) {
	var ok bool
	err := q.QueryRow(ctx, `SELECT EXISTS (`+sql+`)`, args...).Scan(&ok)
	return ok, err
}

// CreateProtocol implements store.Store.
func (s *Store) CreateProtocol(ctx context.Context, p *registryv1.Protocol) (*registryv1.Protocol, bool, error) {
	if err := ctx.Err(); err != nil {
		return nil, false, err
	}
	key, err := hex.DecodeString(p.GetSha1Hex())
	if err != nil || len(key) != len(pd.Hash{}) {
		return nil, false, fmt.Errorf("protocol sha1_hex %q is not a SHA-1", p.GetSha1Hex())
	}
	sum256, err := hex.DecodeString(p.GetSha256Hex())
	if err != nil || len(sum256) != 32 {
		return nil, false, fmt.Errorf("protocol sha256_hex %q is not a SHA-256", p.GetSha256Hex())
	}
	meta := proto.CloneOf(p)
	meta.Content = nil
	val, err := proto.Marshal(meta)
	if err != nil {
		return nil, false, err
	}
	var (
		stored  *registryv1.Protocol
		created bool
	)
	err = s.db.Update(ctx, func(tx pgx.Tx) error {
		stored, created = nil, false
		existing, err := getProtocol(ctx, tx, key)
		if err == nil {
			if existing.GetSha256Hex() != p.GetSha256Hex() {
				return fmt.Errorf("protocol %s (sha256 %s, stored sha256 %s): %w", p.GetSha1Hex(), p.GetSha256Hex(), existing.GetSha256Hex(), store.ErrConflict)
			}
			stored = existing
			return nil
		}
		if !errors.Is(err, store.ErrNotFound) {
			return err
		}
		content := p.GetContent()
		if content == nil {
			content = []byte{}
		}
		if _, err := tx.Exec(ctx, `INSERT INTO protocols (sha1, sha256, meta, content) VALUES ($1, $2, $3, $4)`, key, sum256, val, content); err != nil {
			return err
		}
		stored, created = proto.CloneOf(p), true
		return nil
	})
	if err != nil {
		return nil, false, err
	}
	return stored, created, nil
}

// getProtocol reads a protocol with its content.
func getProtocol(ctx context.Context, q pgdb.Querier, sha1 []byte) (*registryv1.Protocol, error) {
	var meta, content []byte
	err := q.QueryRow(ctx, `SELECT meta, content FROM protocols WHERE sha1 = $1`, sha1).Scan(&meta, &content)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, resource.NotFound("protocol", hex.EncodeToString(sha1))
	}
	if err != nil {
		return nil, err
	}
	p, err := resource.Decode(meta, &registryv1.Protocol{})
	if err != nil {
		return nil, err
	}
	if content == nil {
		content = []byte{} // an empty document is still a document
	}
	p.Content = content
	return p, nil
}

// GetProtocol implements store.Store.
func (s *Store) GetProtocol(ctx context.Context, sha1 pd.Hash) (*registryv1.Protocol, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return getProtocol(ctx, s.db.Pool(), sha1[:])
}

// ListProtocols implements store.Store. The query filter runs here
// (store.Matches), so rows are read until the page is full.
func (s *Store) ListProtocols(ctx context.Context, opts store.ListOptions) ([]*registryv1.Protocol, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	after := []byte{}
	if opts.After != "" {
		var err error
		if after, err = hex.DecodeString(opts.After); err != nil {
			return nil, fmt.Errorf("list start %q is not a SHA-1 hex", opts.After)
		}
	}
	rows, err := s.db.Pool().Query(ctx, `SELECT meta FROM protocols WHERE sha1 > $1 ORDER BY sha1`, after)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*registryv1.Protocol
	for len(out) < opts.Limit && rows.Next() {
		var meta []byte
		if err := rows.Scan(&meta); err != nil {
			return nil, err
		}
		p, err := resource.Decode(meta, &registryv1.Protocol{})
		if err != nil {
			return nil, err
		}
		if opts.Query == "" || store.Matches(p, opts.Query) {
			out = append(out, p)
		}
	}
	rows.Close()
	return out, rows.Err()
}

// CreateAgent implements store.Store.
func (s *Store) CreateAgent(ctx context.Context, a *registryv1.Agent, key *store.StoredKey, requestID string) (*registryv1.Agent, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var out *registryv1.Agent
	err := s.db.Update(ctx, func(tx pgx.Tx) error {
		if done, err := recorded(ctx, tx, requestID); done != nil || err != nil {
			out = done
			return err
		}
		out = proto.CloneOf(a)
		taken, err := exists(ctx, tx, `SELECT 1 FROM agents WHERE name = $1`, out.GetName())
		if err != nil {
			return err
		}
		if taken {
			return resource.AlreadyExists("agent", out.GetName())
		}
		if err := putAgent(ctx, tx, out); err != nil {
			return err
		}
		if key != nil {
			if err := putKey(ctx, tx, *key); err != nil {
				return err
			}
		}
		return record(ctx, tx, requestID, out)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// recorded returns the agent recorded for requestID, or nil.
func recorded(ctx context.Context, tx pgx.Tx, requestID string) (*registryv1.Agent, error) {
	if requestID == "" {
		return nil, nil
	}
	a, err := one(ctx, tx, &registryv1.Agent{}, store.ErrNotFound, `SELECT data FROM agent_requests WHERE request_id = $1`, requestID)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	return a, err
}

// record stores a as requestID's result.
func record(ctx context.Context, tx pgx.Tx, requestID string, a *registryv1.Agent) error {
	if requestID == "" {
		return nil
	}
	val, err := proto.Marshal(a)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `INSERT INTO agent_requests (request_id, recorded_at, data) VALUES ($1, $2, $3)
ON CONFLICT (request_id) DO UPDATE SET recorded_at = excluded.recorded_at, data = excluded.data`, requestID, time.Now(), val)
	return err
}

// SweepRequests implements store.Store: one DELETE of the oldest due rows
// through the index agent_requests_by_time. Rows another transaction holds
// (a write recording the id again, or another replica's sweep) are
// skipped, not waited for.
func (s *Store) SweepRequests(ctx context.Context, before time.Time, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	tag, err := s.db.Pool().Exec(ctx, `DELETE FROM agent_requests WHERE request_id IN (
  SELECT request_id FROM agent_requests WHERE recorded_at < $1 ORDER BY recorded_at LIMIT $2 FOR UPDATE SKIP LOCKED)`, before, limit)
	if err != nil {
		return 0, err
	}
	return int(tag.RowsAffected()), nil
}

// putAgent stamps a new etag on a and stores it.
func putAgent(ctx context.Context, tx pgx.Tx, a *registryv1.Agent) error {
	var seq int64
	if err := tx.QueryRow(ctx, `SELECT nextval('agent_etag_seq')`).Scan(&seq); err != nil {
		return err
	}
	a.Etag = strconv.FormatInt(seq, 10)
	val, err := proto.Marshal(a)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `INSERT INTO agents (name, data) VALUES ($1, $2) ON CONFLICT (name) DO UPDATE SET data = excluded.data`, a.GetName(), val)
	return err
}

// getAgent reads an agent, or a NotFound error.
func getAgent(ctx context.Context, q pgdb.Querier, name string) (*registryv1.Agent, error) {
	return one(ctx, q, &registryv1.Agent{}, resource.NotFound("agent", name), `SELECT data FROM agents WHERE name = $1`, name)
}

// GetAgent implements store.Store.
func (s *Store) GetAgent(ctx context.Context, name string) (*registryv1.Agent, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return getAgent(ctx, s.db.Pool(), name)
}

// ListAgents implements store.Store.
func (s *Store) ListAgents(ctx context.Context, opts store.ListOptions) ([]*registryv1.Agent, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	prefix := "clients/"
	if opts.Client != "" {
		prefix = store.AgentPrefix(opts.Client)
	}
	return many(ctx, s.db.Pool(), func() *registryv1.Agent { return &registryv1.Agent{} },
		`SELECT data FROM agents WHERE starts_with(name, $1) AND name > $2 ORDER BY name LIMIT $3`, prefix, opts.After, opts.Limit)
}

// DeleteAgent implements store.Store: the agent, its keys, its follows
// both ways, its client-group membership, its group memberships, join
// requests and invites, in one transaction.
func (s *Store) DeleteAgent(ctx context.Context, name string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.Update(ctx, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `DELETE FROM agents WHERE name = $1`, name)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return resource.NotFound("agent", name)
		}
		for _, sql := range []string{
			`DELETE FROM keys WHERE owner = $1`,
			`DELETE FROM follows WHERE follower = $1 OR agent = $1`,
			`DELETE FROM client_group_members WHERE agent = $1`,
			`DELETE FROM group_members WHERE agent = $1`,
			`DELETE FROM group_join_requests WHERE agent = $1`,
			`DELETE FROM group_invites WHERE agent = $1`,
		} {
			if _, err := tx.Exec(ctx, sql, name); err != nil {
				return err
			}
		}
		return nil
	})
}

// UpdateAgent implements store.Store.
func (s *Store) UpdateAgent(ctx context.Context, name, requestID string, mutate func(*registryv1.Agent) error) (*registryv1.Agent, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var a *registryv1.Agent
	err := s.db.Update(ctx, func(tx pgx.Tx) error {
		var err error
		if a, err = recorded(ctx, tx, requestID); a != nil || err != nil {
			return err
		}
		if a, err = getAgent(ctx, tx, name); err != nil {
			return err
		}
		if err := mutate(a); err != nil {
			return err
		}
		if a.GetName() != name {
			return fmt.Errorf("agent %s: update must not rename it to %q", name, a.GetName())
		}
		if err := putAgent(ctx, tx, a); err != nil {
			return err
		}
		return record(ctx, tx, requestID, a)
	})
	if err != nil {
		return nil, err
	}
	return a, nil
}
