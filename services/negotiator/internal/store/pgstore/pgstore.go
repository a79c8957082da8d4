// Package pgstore is the negotiator's PostgreSQL backend, for running
// several replicas on one database (docs/adr/0007-postgresql-backend.md).
// Its tables live in their own schema, created and migrated by Open from
// the embedded migrations/*.sql.
package pgstore

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/proto"

	negotiatorv1 "github.com/parleyhq/parley/gen/parley/negotiator/v1"
	"github.com/parleyhq/parley/platform/pgdb"
	"github.com/parleyhq/parley/services/negotiator/internal/store"
)

// Schema is the PostgreSQL schema of the negotiator's tables.
const Schema = "negotiator"

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Store is the PostgreSQL-backed store.
type Store struct {
	db *pgdb.DB
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

// DB is the database, for what the replicas share beside the store (the
// rate limits, pgdb.DB.TakeToken).
func (s *Store) DB() *pgdb.DB { return s.db }

// Close closes the connections.
func (s *Store) Close() error { return s.db.Close() }

// AppendLedgerEntry implements store.Store. The totals are added by SQL,
// so concurrent appends queue on a total's row lock and never retry.
func (s *Store) AppendLedgerEntry(ctx context.Context, e *negotiatorv1.LedgerEntry, totalKeys []string) (*negotiatorv1.LedgerEntry, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	entry := &negotiatorv1.LedgerEntry{}
	if e != nil {
		entry = proto.CloneOf(e)
	}
	err := s.db.Write(ctx, func(tx pgx.Tx) error {
		var seq int64
		if err := tx.QueryRow(ctx, `SELECT nextval('ledger_seq')`).Scan(&seq); err != nil {
			return err
		}
		entry.Name = fmt.Sprintf("ledgerEntries/%016x", seq)
		data, err := proto.Marshal(entry)
		if err != nil {
			return fmt.Errorf("encode %s: %w", entry.Name, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO ledger_entries (name, agent, role, data) VALUES ($1, $2, $3, $4)`,
			entry.Name, entry.GetAgent(), entry.GetRole(), data); err != nil {
			return err
		}
		for _, k := range totalKeys {
			if _, err := tx.Exec(ctx, `INSERT INTO totals AS t (key, calls, prompt_tokens, completion_tokens, cost_micro_usd)
VALUES ($1, 1, $2, $3, $4)
ON CONFLICT (key) DO UPDATE SET calls = t.calls + 1, prompt_tokens = t.prompt_tokens + $2,
  completion_tokens = t.completion_tokens + $3, cost_micro_usd = t.cost_micro_usd + $4`,
				k, entry.GetPromptTokens(), entry.GetCompletionTokens(), entry.GetCostMicroUsd()); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return entry, nil
}

// ListLedgerEntries implements store.Store.
func (s *Store) ListLedgerEntries(ctx context.Context, f store.LedgerFilter, after string, limit int) ([]*negotiatorv1.LedgerEntry, string, error) {
	if err := ctx.Err(); err != nil {
		return nil, "", err
	}
	if limit < 1 {
		return nil, "", nil
	}
	// One more row than asked says whether there is a next page.
	rows, err := s.db.Pool().Query(ctx, `SELECT data FROM ledger_entries
WHERE name > $1 AND ($2 = '' OR agent = $2) AND ($3 = '' OR role = $3)
ORDER BY name LIMIT $4`, after, f.Agent, f.Role, limit+1)
	if err != nil {
		return nil, "", err
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*negotiatorv1.LedgerEntry, error) {
		var data []byte
		if err := r.Scan(&data); err != nil {
			return nil, err
		}
		e := &negotiatorv1.LedgerEntry{}
		return e, proto.Unmarshal(data, e)
	})
	if err != nil {
		return nil, "", err
	}
	if len(out) > limit {
		return out[:limit], out[limit-1].GetName(), nil
	}
	return out, "", nil
}

// Totals implements store.Store.
func (s *Store) Totals(ctx context.Context, key string) (*negotiatorv1.CostSummary, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	t := &negotiatorv1.CostSummary{}
	err := s.db.Pool().QueryRow(ctx, `SELECT calls, prompt_tokens, completion_tokens, cost_micro_usd FROM totals WHERE key = $1`, key).
		Scan(&t.Calls, &t.PromptTokens, &t.CompletionTokens, &t.CostMicroUsd)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return nil, err
	}
	return t, nil
}

// GetVerdict implements store.Store.
func (s *Store) GetVerdict(ctx context.Context, key string) (*negotiatorv1.SuitabilityVerdict, error) {
	return get(ctx, s.db, "verdicts", "verdict", key, &negotiatorv1.SuitabilityVerdict{})
}

// PutVerdict implements store.Store.
func (s *Store) PutVerdict(ctx context.Context, key string, v *negotiatorv1.SuitabilityVerdict) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return pgdb.Put(ctx, s.db.Pool(), "verdicts", key, v)
}

// CreateNegotiation implements store.Store.
func (s *Store) CreateNegotiation(ctx context.Context, n *negotiatorv1.Negotiation) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return pgdb.Insert(ctx, s.db.Pool(), "negotiations", "negotiation", n.GetName(), n)
}

// GetNegotiation implements store.Store.
func (s *Store) GetNegotiation(ctx context.Context, name string) (*negotiatorv1.Negotiation, error) {
	return get(ctx, s.db, "negotiations", "negotiation", name, &negotiatorv1.Negotiation{})
}

// UpdateNegotiation implements store.Store.
func (s *Store) UpdateNegotiation(ctx context.Context, name string, mutate func(*negotiatorv1.Negotiation) error) (*negotiatorv1.Negotiation, error) {
	n := &negotiatorv1.Negotiation{}
	if err := s.db.Modify(ctx, "negotiations", "negotiation", name, n, func() error { return mutate(n) }); err != nil {
		return nil, err
	}
	return n, nil
}

// PutRoutineCandidate implements store.Store.
func (s *Store) PutRoutineCandidate(ctx context.Context, c *negotiatorv1.RoutineCandidate) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return pgdb.Put(ctx, s.db.Pool(), "routine_candidates", c.GetName(), c)
}

// GetRoutineCandidate implements store.Store.
func (s *Store) GetRoutineCandidate(ctx context.Context, name string) (*negotiatorv1.RoutineCandidate, error) {
	return get(ctx, s.db, "routine_candidates", "routine candidate", name, &negotiatorv1.RoutineCandidate{})
}

// UpdateRoutineCandidate implements store.Store.
func (s *Store) UpdateRoutineCandidate(ctx context.Context, name string, mutate func(*negotiatorv1.RoutineCandidate) error) (*negotiatorv1.RoutineCandidate, error) {
	c := &negotiatorv1.RoutineCandidate{}
	if err := s.db.Modify(ctx, "routine_candidates", "routine candidate", name, c, func() error { return mutate(c) }); err != nil {
		return nil, err
	}
	return c, nil
}

// get reads row name of table into m.
func get[T proto.Message](ctx context.Context, db *pgdb.DB, table, kind, name string, m T) (T, error) {
	var zero T
	if err := ctx.Err(); err != nil {
		return zero, err
	}
	if err := pgdb.Get(ctx, db.Pool(), table, kind, name, m); err != nil {
		return zero, err
	}
	return m, nil
}
