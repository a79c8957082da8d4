// Package pgstore is the tasks service's PostgreSQL backend, for running
// several replicas on one database (docs/adr/0007-postgresql-backend.md):
// task, step and artifact metadata (Store) and artifact bytes (Blobs, in
// blobs.go), so that no shared volume is needed. Its tables live in their
// own schema, created and migrated by Open from the embedded
// migrations/*.sql.
package pgstore

import (
	"context"
	"crypto/rand"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/proto"

	tasksv1 "github.com/parleyhq/parley/gen/parley/tasks/v1"
	"github.com/parleyhq/parley/platform/pgdb"
	"github.com/parleyhq/parley/platform/resource"
	"github.com/parleyhq/parley/services/tasks/internal/store"
)

// Schema is the PostgreSQL schema of the tasks service's tables.
const Schema = "tasks"

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Store is the PostgreSQL-backed store.
type Store struct {
	db *pgdb.DB
	// owner is this Store's random id, written on the pending steps it
	// creates or claims; it holds the Exclusive lock "tasks.owner.<owner>"
	// until Close, so that other replicas leave those steps alone.
	owner   string
	release context.CancelFunc // ends the owner lock
	held    chan struct{}      // closed when the owner lock ends
	locked  atomic.Bool        // the owner lock is held
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
	var b [8]byte
	rand.Read(b[:]) // crypto/rand.Read never fails
	s := &Store{db: db, owner: hex.EncodeToString(b[:]), held: make(chan struct{})}
	lockCtx, release := context.WithCancel(context.WithoutCancel(ctx))
	s.release = release
	locked := make(chan struct{})
	go func() {
		defer close(s.held)
		db.Exclusive(lockCtx, ownerLock+s.owner, pgdb.ExclusiveOptions{}, func(ctx context.Context) {
			s.locked.Store(true)
			select {
			case <-locked:
			default:
				close(locked)
			}
			<-ctx.Done()
			s.locked.Store(false)
		})
	}()
	if !db.Ready() {
		return s, nil // the database does not answer yet: Ping says when it does
	}
	select {
	case <-locked:
		return s, nil
	case <-ctx.Done():
		s.Close()
		return nil, fmt.Errorf("pgstore: taking the owner lock: %w", ctx.Err())
	}
}

// ownerLock prefixes the Exclusive lock a Store holds while it lives.
const ownerLock = "tasks.owner."

// Ping checks that the database answers and that the Store holds its
// owner lock (until it does, another replica could claim its steps).
func (s *Store) Ping(ctx context.Context) error {
	if err := s.db.Ping(ctx); err != nil {
		return err
	}
	if !s.locked.Load() {
		return errors.New("pgstore: not yet holding the owner lock of its pending steps")
	}
	return nil
}

// DB is the database, for what the replicas share beside the store (the
// rate limits, pgdb.DB.TakeToken).
func (s *Store) DB() *pgdb.DB { return s.db }

// Close releases the owner lock (other replicas may then claim this
// Store's pending steps) and closes the connections.
func (s *Store) Close() error {
	s.release()
	<-s.held
	return s.db.Close()
}

func stepName(ref store.StepRef) string { return "tasks/" + ref.TaskID + "/steps/" + ref.StepID }

// getTask reads a task, or a NotFound error.
func getTask(ctx context.Context, q pgdb.Querier, taskID string) (*tasksv1.Task, error) {
	var data []byte
	err := q.QueryRow(ctx, `SELECT data FROM tasks WHERE id = $1`, taskID).Scan(&data)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, resource.NotFound("task", "tasks/"+taskID)
	}
	if err != nil {
		return nil, err
	}
	return resource.Decode(data, &tasksv1.Task{})
}

// putTask writes t back.
func putTask(ctx context.Context, q pgdb.Querier, taskID string, t *tasksv1.Task) error {
	data, err := proto.Marshal(t)
	if err != nil {
		return err
	}
	_, err = q.Exec(ctx, `UPDATE tasks SET data = $2 WHERE id = $1`, taskID, data)
	return err
}

// list decodes the data column of rows.
func list[T any, P interface {
	*T
	proto.Message
}](rows pgx.Rows) ([]P, error) {
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (P, error) {
		var data []byte
		if err := r.Scan(&data); err != nil {
			return nil, err
		}
		return resource.Decode(data, P(new(T)))
	})
}

// CreateTask implements store.Store.
func (s *Store) CreateTask(ctx context.Context, t *tasksv1.Task) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c := proto.CloneOf(t)
	c.ArtifactCount = 0
	data, err := proto.Marshal(c)
	if err != nil {
		return err
	}
	tag, err := s.db.Pool().Exec(ctx, `INSERT INTO tasks (id, agent, seq, data) VALUES ($1, $2, nextval('task_seq'), $3)
ON CONFLICT (id) DO NOTHING`, resource.ID(t.GetName()), t.GetAgent(), data)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return resource.AlreadyExists("task", t.GetName())
	}
	return nil
}

// GetTask implements store.Store.
func (s *Store) GetTask(ctx context.Context, taskID string) (*tasksv1.Task, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return getTask(ctx, s.db.Pool(), taskID)
}

// ListTasks implements store.Store.
func (s *Store) ListTasks(ctx context.Context, agent string, offset, limit int) ([]*tasksv1.Task, int, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	var out []*tasksv1.Task
	var total int
	err := s.db.View(ctx, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM tasks WHERE agent = $1`, agent).Scan(&total); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `SELECT data FROM tasks WHERE agent = $1 ORDER BY seq OFFSET $2 LIMIT $3`, agent, offset, limit)
		if err != nil {
			return err
		}
		out, err = list[tasksv1.Task](rows)
		return err
	})
	return out, total, err
}

// UpdateTask implements store.Store.
func (s *Store) UpdateTask(ctx context.Context, taskID string, mutate func(*tasksv1.Task) error) (*tasksv1.Task, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var out *tasksv1.Task
	err := s.db.Update(ctx, func(tx pgx.Tx) error {
		t, err := getTask(ctx, tx, taskID)
		if err != nil {
			return err
		}
		if err := mutate(t); err != nil {
			return err
		}
		out = t
		return putTask(ctx, tx, taskID, t)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// putStep inserts or replaces a step, pending while its status is CREATED.
// With insert, an existing step is ErrAlreadyExists.
func (s *Store) putStep(ctx context.Context, tx pgx.Tx, ref store.StepRef, st *tasksv1.Step, insert bool) error {
	data, err := proto.Marshal(st)
	if err != nil {
		return err
	}
	pending := st.GetStatus() == tasksv1.Step_STATUS_CREATED
	if !insert {
		_, err = tx.Exec(ctx, `UPDATE steps SET pending = $3, data = $4 WHERE task_id = $1 AND step_id = $2`, ref.TaskID, ref.StepID, pending, data)
		return err
	}
	tag, err := tx.Exec(ctx, `INSERT INTO steps (task_id, step_id, pending, data, owner) VALUES ($1, $2, $3, $4, $5)
ON CONFLICT DO NOTHING`, ref.TaskID, ref.StepID, pending, data, s.owner)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return resource.AlreadyExists("step", st.GetName())
	}
	return nil
}

// CreateStep implements store.Store.
func (s *Store) CreateStep(ctx context.Context, taskID string, in *tasksv1.Step, decide func(*tasksv1.Task, *tasksv1.Step) error) (*tasksv1.Step, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var out *tasksv1.Step
	err := s.db.Update(ctx, func(tx pgx.Tx) error {
		t, err := getTask(ctx, tx, taskID)
		if err != nil {
			return err
		}
		before := proto.CloneOf(t)
		st := proto.CloneOf(in) // Update may run this function again
		if err := decide(t, st); err != nil {
			return err
		}
		if err := s.putStep(ctx, tx, store.StepRef{TaskID: taskID, StepID: resource.ID(st.GetName())}, st, true); err != nil {
			return err
		}
		out = st
		if proto.Equal(before, t) {
			return nil
		}
		return putTask(ctx, tx, taskID, t)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// getStep reads a step, or a NotFound error.
func getStep(ctx context.Context, q pgdb.Querier, ref store.StepRef) (*tasksv1.Step, error) {
	var data []byte
	err := q.QueryRow(ctx, `SELECT data FROM steps WHERE task_id = $1 AND step_id = $2`, ref.TaskID, ref.StepID).Scan(&data)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, resource.NotFound("step", stepName(ref))
	}
	if err != nil {
		return nil, err
	}
	return resource.Decode(data, &tasksv1.Step{})
}

// GetStep implements store.Store.
func (s *Store) GetStep(ctx context.Context, ref store.StepRef) (*tasksv1.Step, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return getStep(ctx, s.db.Pool(), ref)
}

// ListSteps implements store.Store.
func (s *Store) ListSteps(ctx context.Context, taskID string, offset, limit int) ([]*tasksv1.Step, int, error) {
	return listChildren[tasksv1.Step](ctx, s.db, taskID, offset, limit,
		`SELECT count(*) FROM steps WHERE task_id = $1`,
		`SELECT data FROM steps WHERE task_id = $1 ORDER BY step_id OFFSET $2 LIMIT $3`)
}

// listChildren pages through a task's steps or artifacts in one snapshot:
// NotFound when the task is unknown, else the page and the total.
func listChildren[T any, P interface {
	*T
	proto.Message
}](ctx context.Context, db *pgdb.DB, taskID string, offset, limit int, countSQL, pageSQL string) ([]P, int, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	var out []P
	var total int
	err := db.View(ctx, func(tx pgx.Tx) error {
		if _, err := getTask(ctx, tx, taskID); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, countSQL, taskID).Scan(&total); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, pageSQL, taskID, offset, limit)
		if err != nil {
			return err
		}
		out, err = list[T, P](rows)
		return err
	})
	return out, total, err
}

// UpdateStep implements store.Store.
func (s *Store) UpdateStep(ctx context.Context, ref store.StepRef, mutate func(*tasksv1.Task, *tasksv1.Step) ([]*tasksv1.Artifact, error)) (*tasksv1.Step, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var out *tasksv1.Step
	err := s.db.Update(ctx, func(tx pgx.Tx) error {
		t, err := getTask(ctx, tx, ref.TaskID)
		if err != nil {
			return err
		}
		st, err := getStep(ctx, tx, ref)
		if err != nil {
			return err
		}
		before := proto.CloneOf(t)
		arts, err := mutate(t, st)
		if err != nil {
			return err
		}
		for _, a := range arts {
			if err := addArtifact(ctx, tx, t, a); err != nil {
				return err
			}
		}
		if err := s.putStep(ctx, tx, ref, st, false); err != nil {
			return err
		}
		out = st
		if proto.Equal(before, t) {
			return nil
		}
		return putTask(ctx, tx, ref.TaskID, t)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// ListPending implements store.Store: oldest task first, then step id.
// With several replicas it returns the pending steps this Store should
// run, and claims them: its own, and those of replicas no longer alive.
func (s *Store) ListPending(ctx context.Context) ([]store.StepRef, error) {
	return s.claim(ctx, true)
}

// ClaimOrphans claims the pending steps of replicas no longer alive (their
// owner lock is free) and returns them, oldest task first; a replica runs
// it periodically to take over the steps of one that died. Steps it owns
// already are not returned.
func (s *Store) ClaimOrphans(ctx context.Context) ([]store.StepRef, error) {
	return s.claim(ctx, false)
}

func (s *Store) claim(ctx context.Context, own bool) ([]store.StepRef, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// One UPDATE at READ COMMITTED: replicas claiming at once queue on
	// each row, and the second finds it owned by a live replica.
	rows, err := s.db.Pool().Query(ctx, `WITH claimed AS (
  UPDATE steps s SET owner = $1 WHERE s.pending AND ((s.owner = $1 AND $2) OR (s.owner <> $1 AND NOT `+pgdb.ExclusiveHeld(`$3 || s.owner`)+`))
  RETURNING s.task_id, s.step_id)
SELECT c.task_id, c.step_id FROM claimed c JOIN tasks t ON t.id = c.task_id ORDER BY t.seq, c.step_id`, s.owner, own, ownerLock)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.StepRef, error) {
		var ref store.StepRef
		err := r.Scan(&ref.TaskID, &ref.StepID)
		return ref, err
	})
}

// addArtifact stores a as t's next artifact; the caller stores t.
func addArtifact(ctx context.Context, tx pgx.Tx, t *tasksv1.Task, a *tasksv1.Artifact) error {
	data, err := proto.Marshal(a)
	if err != nil {
		return err
	}
	tag, err := tx.Exec(ctx, `INSERT INTO artifacts (task_id, seq, artifact_id, data) VALUES ($1, $2, $3, $4)
ON CONFLICT DO NOTHING`, resource.ID(t.GetName()), t.GetArtifactCount(), resource.ID(a.GetName()), data)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return resource.AlreadyExists("artifact", a.GetName())
	}
	t.ArtifactCount++
	return nil
}

// CreateArtifact implements store.Store.
func (s *Store) CreateArtifact(ctx context.Context, taskID string, a *tasksv1.Artifact) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.Update(ctx, func(tx pgx.Tx) error {
		t, err := getTask(ctx, tx, taskID)
		if err != nil {
			return err
		}
		if err := addArtifact(ctx, tx, t, a); err != nil {
			return err
		}
		t.UpdateTime = a.GetCreateTime()
		return putTask(ctx, tx, taskID, t)
	})
}

// GetArtifact implements store.Store.
func (s *Store) GetArtifact(ctx context.Context, taskID, artifactID string) (*tasksv1.Artifact, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var data []byte
	err := s.db.Pool().QueryRow(ctx, `SELECT data FROM artifacts WHERE task_id = $1 AND artifact_id = $2`, taskID, artifactID).Scan(&data)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, resource.NotFound("artifact", "tasks/"+taskID+"/artifacts/"+artifactID)
	}
	if err != nil {
		return nil, err
	}
	return resource.Decode(data, &tasksv1.Artifact{})
}

// ListArtifacts implements store.Store.
func (s *Store) ListArtifacts(ctx context.Context, taskID string, offset, limit int) ([]*tasksv1.Artifact, int, error) {
	return listChildren[tasksv1.Artifact](ctx, s.db, taskID, offset, limit,
		`SELECT count(*) FROM artifacts WHERE task_id = $1`,
		`SELECT data FROM artifacts WHERE task_id = $1 ORDER BY seq OFFSET $2 LIMIT $3`)
}
