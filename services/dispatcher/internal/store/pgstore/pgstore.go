// Package pgstore is the dispatcher's PostgreSQL backend, for several
// replicas on one database (docs/adr/0007-postgresql-backend.md): the core
// store.Store (routines, tools, conversations, send counts) and the network
// stores (store.DialogueStore, store.TimerStore, store.OrderStore and
// mailbox.Store), each passing its storetest suite. Appends and timers
// notify the other replicas (listen.go).
package pgstore

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/platform/pgdb"
	"github.com/parleyhq/parley/platform/resource"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

// Schema is the PostgreSQL schema of the dispatcher's tables.
const Schema = "dispatcher"

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Store is the PostgreSQL-backed store.
type Store struct {
	db     *pgdb.DB
	schema string
	origin string // this Store's id in its notifications (listen.go)
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
	return &Store{db: db, schema: schema, origin: newOrigin()}, nil
}

// Ping checks that the database answers.
func (s *Store) Ping(ctx context.Context) error { return s.db.Ping(ctx) }

// DB is the database, for work that runs on one replica at a time
// (pgdb.DB.Exclusive).
func (s *Store) DB() *pgdb.DB { return s.db }

// Close closes the connections.
func (s *Store) Close() error { return s.db.Close() }

// SetRoutine implements store.Store.
func (s *Store) SetRoutine(ctx context.Context, name, source string, now time.Time) (*dispatcherv1.Routine, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var out *dispatcherv1.Routine
	err := s.db.Update(ctx, func(tx pgx.Tx) error {
		cur := &dispatcherv1.Routine{}
		version := int64(1)
		if err := pgdb.Get(ctx, tx, "routines", "routine", name, cur); err == nil {
			version = cur.GetVersion() + 1
		} else if !errors.Is(err, store.ErrNotFound) {
			return err
		}
		out = &dispatcherv1.Routine{
			Name:       name,
			Source:     source,
			Version:    version,
			UpdateTime: timestamppb.New(now),
			State:      dispatcherv1.Routine_STATE_ACTIVE,
		}
		if err := pgdb.Put(ctx, tx, "routines", name, out); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO routine_versions (name, version, source) VALUES ($1, $2, $3)
ON CONFLICT (name, version) DO UPDATE SET source = excluded.source`, name, version, source); err != nil {
			return err
		}
		return s.notifyRoutine(ctx, tx, name)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// GetRoutine implements store.Store.
func (s *Store) GetRoutine(ctx context.Context, name string) (*dispatcherv1.Routine, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	r := &dispatcherv1.Routine{}
	if err := pgdb.Get(ctx, s.db.Pool(), "routines", "routine", name, r); err != nil {
		return nil, err
	}
	return r, nil
}

// list decodes the data of the rows a query returns, in its order.
func list[T proto.Message](ctx context.Context, db *pgdb.DB, newT func() T, sql string, args ...any) ([]T, error) {
	rows, err := db.Pool().Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (T, error) {
		m := newT()
		var data []byte
		if err := r.Scan(&data); err != nil {
			return m, err
		}
		return m, proto.Unmarshal(data, m)
	})
}

// ListRoutines implements store.Store.
func (s *Store) ListRoutines(ctx context.Context, parent, after string, limit int) ([]*dispatcherv1.Routine, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return list(ctx, s.db, func() *dispatcherv1.Routine { return &dispatcherv1.Routine{} },
		`SELECT data FROM routines WHERE starts_with(name, $1) AND name > $2 ORDER BY name LIMIT $3`, parent+"/routines/", after, limit)
}

// RecordRoutineRun implements store.Store. One transaction per run, so
// failure counts and quarantine hold across replicas.
func (s *Store) RecordRoutineRun(ctx context.Context, name string, version int64, runErr string, kind dispatcherv1.RoutineFailureKind, quarantineAfter int) (*dispatcherv1.Routine, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	out := &dispatcherv1.Routine{}
	err := s.db.Update(ctx, func(tx pgx.Tx) error {
		proto.Reset(out)
		if err := pgdb.Get(ctx, tx, "routines", "routine", name, out); err != nil {
			return err
		}
		if out.GetVersion() != version {
			return nil // a run of an older version: ignored
		}
		if runErr == "" {
			if out.GetConsecutiveFailures() == 0 {
				return nil
			}
			out.ConsecutiveFailures = 0
		} else {
			out.ConsecutiveFailures++
			out.LastError = runErr
			out.LastFailureKind = kind
			if quarantineAfter > 0 && int(out.ConsecutiveFailures) >= quarantineAfter {
				out.State = dispatcherv1.Routine_STATE_QUARANTINED
			}
		}
		if err := pgdb.Put(ctx, tx, "routines", name, out); err != nil {
			return err
		}
		return s.notifyRoutine(ctx, tx, name)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// SetTool implements store.Store.
func (s *Store) SetTool(ctx context.Context, t *dispatcherv1.Tool, now time.Time) (*dispatcherv1.Tool, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	out := proto.CloneOf(t)
	out.UpdateTime = timestamppb.New(now)
	err := s.db.Write(ctx, func(tx pgx.Tx) error {
		if err := pgdb.Put(ctx, tx, "tools", out.GetName(), out); err != nil {
			return err
		}
		return s.notifyRoutine(ctx, tx, out.GetName())
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// ListTools implements store.Store.
func (s *Store) ListTools(ctx context.Context, parent string) ([]*dispatcherv1.Tool, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return list(ctx, s.db, func() *dispatcherv1.Tool { return &dispatcherv1.Tool{} },
		`SELECT data FROM tools WHERE starts_with(name, $1) ORDER BY name`, parent+"/tools/")
}

// CreateConversation implements store.Store. The count and the insert are
// one SERIALIZABLE transaction, so the per-peer cap holds across replicas.
func (s *Store) CreateConversation(ctx context.Context, c store.Conversation, maxPerPeer int, now time.Time) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	data, err := json.Marshal(c)
	if err != nil {
		return err
	}
	return s.db.Update(ctx, func(tx pgx.Tx) error {
		if maxPerPeer > 0 {
			var open int
			if err := tx.QueryRow(ctx, `SELECT count(*) FROM conversations WHERE peer = $1 AND expire_ns > $2`, c.Peer, now.UnixNano()).Scan(&open); err != nil {
				return err
			}
			if open >= maxPerPeer {
				return fmt.Errorf("peer has %d open conversations: %w", open, store.ErrLimit)
			}
		}
		tag, err := tx.Exec(ctx, `INSERT INTO conversations (id, peer, expire_ns, data) VALUES ($1, $2, $3, $4) ON CONFLICT (id) DO NOTHING`,
			c.ID, c.Peer, c.ExpireTime.UnixNano(), data)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return resource.AlreadyExists("conversation", c.ID)
		}
		return nil
	})
}

// getConversation reads a conversation, or a NotFound error.
func getConversation(ctx context.Context, q pgdb.Querier, id string) (store.Conversation, error) {
	var c store.Conversation
	var data []byte
	err := q.QueryRow(ctx, `SELECT data FROM conversations WHERE id = $1`, id).Scan(&data)
	if errors.Is(err, pgx.ErrNoRows) {
		return c, resource.NotFound("conversation", id)
	}
	if err != nil {
		return c, err
	}
	return c, json.Unmarshal(data, &c)
}

// GetConversation implements store.Store.
func (s *Store) GetConversation(ctx context.Context, id string) (store.Conversation, error) {
	if err := ctx.Err(); err != nil {
		return store.Conversation{}, err
	}
	return getConversation(ctx, s.db.Pool(), id)
}

// UpdateConversation implements store.Store.
func (s *Store) UpdateConversation(ctx context.Context, id string, mutate func(*store.Conversation) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.Update(ctx, func(tx pgx.Tx) error {
		c, err := getConversation(ctx, tx, id)
		if err != nil {
			return err
		}
		if err := mutate(&c); err != nil {
			return err
		}
		data, err := json.Marshal(c)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `UPDATE conversations SET peer = $2, expire_ns = $3, data = $4 WHERE id = $1`, id, c.Peer, c.ExpireTime.UnixNano(), data)
		return err
	})
}

// DeleteConversation implements store.Store.
func (s *Store) DeleteConversation(ctx context.Context, id string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	tag, err := s.db.Pool().Exec(ctx, `DELETE FROM conversations WHERE id = $1`, id)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return resource.NotFound("conversation", id)
	}
	return nil
}

// SweepConversations implements store.Store: one DELETE of the earliest
// expired rows through the index conversations_by_expiry. Rows another
// transaction holds (an update under way, or another replica's sweep) are
// skipped, not waited for, so replicas sweeping at once remove each row
// once.
func (s *Store) SweepConversations(ctx context.Context, before time.Time, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	tag, err := s.db.Pool().Exec(ctx, `DELETE FROM conversations WHERE id IN (
  SELECT id FROM conversations WHERE expire_ns < $1 ORDER BY expire_ns LIMIT $2 FOR UPDATE SKIP LOCKED)`, before.UnixNano(), limit)
	if err != nil {
		return 0, err
	}
	return int(tag.RowsAffected()), nil
}

// CountSend implements store.Store: one upsert, so concurrent counts from
// several replicas add up.
func (s *Store) CountSend(ctx context.Context, agent, task, target string, withProtocol bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	with := int64(0)
	if withProtocol {
		with = 1
	}
	_, err := s.db.Pool().Exec(ctx, `INSERT INTO send_counts AS c (agent, task, target, conversations, with_protocol) VALUES ($1, $2, $3, 1, $4)
ON CONFLICT (agent, task, target) DO UPDATE SET conversations = c.conversations + 1, with_protocol = c.with_protocol + $4`, agent, task, target, with)
	return err
}

// ListSendCounts implements store.Store.
func (s *Store) ListSendCounts(ctx context.Context, agent string) ([]store.SendCount, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	rows, err := s.db.Pool().Query(ctx, `SELECT task, target, conversations, with_protocol FROM send_counts WHERE agent = $1 ORDER BY task, target`, agent)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.SendCount, error) {
		var c store.SendCount
		err := r.Scan(&c.Task, &c.TargetURL, &c.Conversations, &c.WithProtocol)
		return c, err
	})
}
