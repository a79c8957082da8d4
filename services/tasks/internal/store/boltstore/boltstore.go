// Package boltstore is the tasks's embedded bbolt backend: one file,
// tasks.db, in the data directory.
//
// Writes go through platform/boltdb's group committer, so concurrent
// requests share one fsync and each returns only after its transaction is on
// disk.
//
// Keys: ids are UUIDs; seq is a big-endian uint64 giving an item's position
// in its list, so a page of tasks or artifacts at any offset is one Seek.
// Steps are keyed by their (time-ordered) ids instead, so that creating one
// writes only its own key and the pending mark; paging skips keys and the
// total is counted.
package boltstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"path/filepath"
	"time"

	"google.golang.org/protobuf/proto"

	tasksv1 "github.com/parleyhq/parley/gen/parley/tasks/v1"
	"github.com/parleyhq/parley/platform/boltdb"
	"github.com/parleyhq/parley/platform/resource"
	"github.com/parleyhq/parley/services/tasks/internal/store"
)

// FileName is the database file inside the data directory.
const FileName = "tasks.db"

// Buckets, created by Open (platform/boltdb adds "meta" for schema_version).
var (
	// bucketTasks maps task_id to a marshalled tasksv1.Task.
	bucketTasks = []byte("tasks")
	// bucketAgentTasks maps agent NUL seq to task_id: an agent's tasks in
	// creation order.
	bucketAgentTasks = []byte("agent_tasks")
	// bucketAgentCounts maps agent to its task count (big-endian uint64).
	bucketAgentCounts = []byte("agent_counts")
	// bucketSteps maps task_id NUL step_id to a marshalled tasksv1.Step.
	// Step ids are time-ordered, so a task's steps are in creation order and
	// new steps land together on few pages.
	bucketSteps = []byte("steps")
	// bucketArtifacts maps task_id NUL seq to a marshalled tasksv1.Artifact.
	bucketArtifacts = []byte("artifacts")
	// bucketArtifactIndex maps task_id NUL artifact_id to the artifact's seq.
	bucketArtifactIndex = []byte("artifact_index")
	// bucketPending holds task_id NUL step_id for every step whose status is
	// CREATED: the dispatcher's work list, reloaded on start.
	bucketPending = []byte("pending")
)

var allBuckets = [][]byte{bucketTasks, bucketAgentTasks, bucketAgentCounts, bucketSteps, bucketArtifacts, bucketArtifactIndex, bucketPending}

// schemaVersion 2 stores artifact bytes by artifact id
// (<data>/artifacts/<task_id>/<artifact_id>). Version 1, pre-release, stored
// them by name, so same-named artifacts shared one file; it is not migrated
// (Open refuses it).
const schemaVersion = 2

// Store is the bbolt-backed store.
type Store struct {
	db *boltdb.DB
}

var _ store.Store = (*Store)(nil)

// Open opens (creating if needed) the database in dir. If another process
// holds the file, it fails after lockTimeout instead of waiting forever.
func Open(dir string, lockTimeout time.Duration) (*Store, error) {
	path := filepath.Join(dir, FileName)
	db, err := boltdb.Open(path, boltdb.Options{
		Buckets:       allBuckets,
		SchemaVersion: schemaVersion,
		Migrate: func(_ *boltdb.Tx, from int) error {
			return fmt.Errorf("schema version %d was written by a pre-release tasks service (artifact bytes stored by file name) and is not migrated; move %s and %s aside to start afresh", from, path, filepath.Join(dir, "artifacts"))
		},
		LockTimeout: lockTimeout,
	})
	if err != nil {
		return nil, err
	}
	return &Store{db: db}, nil
}

// Ping reports whether the database is open.
func (s *Store) Ping(ctx context.Context) error { return s.db.Ping(ctx) }

// Close finishes queued writes and closes the database.
func (s *Store) Close() error { return s.db.Close() }

func key(parts ...[]byte) []byte { return bytes.Join(parts, []byte{0}) }

func seqBytes(n uint64) []byte { return binary.BigEndian.AppendUint64(nil, n) }

func getTask(tx *boltdb.Tx, taskID string) (*tasksv1.Task, error) {
	v := tx.Bucket(bucketTasks).Get([]byte(taskID))
	if v == nil {
		return nil, resource.NotFound("task", "tasks/"+taskID)
	}
	t := &tasksv1.Task{}
	if err := proto.Unmarshal(v, t); err != nil {
		return nil, fmt.Errorf("decode task %q: %w", taskID, err)
	}
	return t, nil
}

func put(b *boltdb.Bucket, k []byte, m proto.Message) error {
	v, err := proto.Marshal(m)
	if err != nil {
		return err
	}
	return b.Put(k, v)
}

// CreateTask implements store.Store.
func (s *Store) CreateTask(ctx context.Context, t *tasksv1.Task) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	id := resource.ID(t.GetName())
	return s.db.Update(func(tx *boltdb.Tx) error {
		tasks := tx.Bucket(bucketTasks)
		if tasks.Get([]byte(id)) != nil {
			return resource.AlreadyExists("task", t.GetName())
		}
		counts := tx.Bucket(bucketAgentCounts)
		var n uint64
		if v := counts.Get([]byte(t.GetAgent())); v != nil {
			n = binary.BigEndian.Uint64(v)
		}
		if err := counts.Put([]byte(t.GetAgent()), seqBytes(n+1)); err != nil {
			return err
		}
		if err := tx.Bucket(bucketAgentTasks).Put(key([]byte(t.GetAgent()), seqBytes(n)), []byte(id)); err != nil {
			return err
		}
		c := proto.CloneOf(t)
		c.ArtifactCount = 0
		return put(tasks, []byte(id), c)
	})
}

// GetTask implements store.Store.
func (s *Store) GetTask(ctx context.Context, taskID string) (*tasksv1.Task, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var t *tasksv1.Task
	err := s.db.View(func(tx *boltdb.Tx) error {
		var err error
		t, err = getTask(tx, taskID)
		return err
	})
	return t, err
}

// ListTasks implements store.Store.
func (s *Store) ListTasks(ctx context.Context, agent string, offset, limit int) ([]*tasksv1.Task, int, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	var out []*tasksv1.Task
	var total int
	err := s.db.View(func(tx *boltdb.Tx) error {
		if v := tx.Bucket(bucketAgentCounts).Get([]byte(agent)); v != nil {
			total = int(binary.BigEndian.Uint64(v))
		}
		if offset >= total {
			return nil
		}
		prefix := append([]byte(agent), 0)
		c := tx.Bucket(bucketAgentTasks).Cursor()
		for k, v := c.Seek(key([]byte(agent), seqBytes(uint64(offset)))); k != nil && bytes.HasPrefix(k, prefix) && len(out) < limit; k, v = c.Next() {
			t, err := getTask(tx, string(v))
			if err != nil {
				return err
			}
			out = append(out, t)
		}
		return nil
	})
	return out, total, err
}

// UpdateTask implements store.Store.
func (s *Store) UpdateTask(ctx context.Context, taskID string, mutate func(*tasksv1.Task) error) (*tasksv1.Task, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var out *tasksv1.Task
	err := s.db.Update(func(tx *boltdb.Tx) error {
		t, err := getTask(tx, taskID)
		if err != nil {
			return err
		}
		if err := mutate(t); err != nil {
			return err
		}
		out = t
		return put(tx.Bucket(bucketTasks), []byte(taskID), t)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// CreateStep implements store.Store.
func (s *Store) CreateStep(ctx context.Context, taskID string, in *tasksv1.Step, decide func(*tasksv1.Task, *tasksv1.Step) error) (*tasksv1.Step, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var out *tasksv1.Step
	err := s.db.Update(func(tx *boltdb.Tx) error {
		t, err := getTask(tx, taskID)
		if err != nil {
			return err
		}
		before := proto.CloneOf(t)
		st := proto.CloneOf(in) // a group commit may run this function twice
		if err := decide(t, st); err != nil {
			return err
		}
		k := key([]byte(taskID), []byte(resource.ID(st.GetName())))
		steps := tx.Bucket(bucketSteps)
		if steps.Get(k) != nil {
			return resource.AlreadyExists("step", st.GetName())
		}
		if err := put(steps, k, st); err != nil {
			return err
		}
		if err := setPending(tx, k, st); err != nil {
			return err
		}
		out = st
		if proto.Equal(before, t) {
			return nil
		}
		return put(tx.Bucket(bucketTasks), []byte(taskID), t)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

func setPending(tx *boltdb.Tx, k []byte, st *tasksv1.Step) error {
	if st.GetStatus() == tasksv1.Step_STATUS_CREATED {
		return tx.Bucket(bucketPending).Put(k, nil)
	}
	return tx.Bucket(bucketPending).Delete(k)
}

func getStep(tx *boltdb.Tx, ref store.StepRef) ([]byte, *tasksv1.Step, error) {
	k := key([]byte(ref.TaskID), []byte(ref.StepID))
	v := tx.Bucket(bucketSteps).Get(k)
	if v == nil {
		return nil, nil, resource.NotFound("step", "tasks/"+ref.TaskID+"/steps/"+ref.StepID)
	}
	st := &tasksv1.Step{}
	if err := proto.Unmarshal(v, st); err != nil {
		return nil, nil, fmt.Errorf("decode step: %w", err)
	}
	return k, st, nil
}

// GetStep implements store.Store.
func (s *Store) GetStep(ctx context.Context, ref store.StepRef) (*tasksv1.Step, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var st *tasksv1.Step
	err := s.db.View(func(tx *boltdb.Tx) error {
		var err error
		_, st, err = getStep(tx, ref)
		return err
	})
	return st, err
}

// listChildren pages through bucket b's items of a task, decoding each
// with decode.
func listChildren[T proto.Message](tx *boltdb.Tx, b []byte, taskID string, offset, limit int, newT func() T) ([]T, error) {
	var out []T
	prefix := append([]byte(taskID), 0)
	c := tx.Bucket(b).Cursor()
	for k, v := c.Seek(key([]byte(taskID), seqBytes(uint64(offset)))); k != nil && bytes.HasPrefix(k, prefix) && len(out) < limit; k, v = c.Next() {
		m := newT()
		if err := proto.Unmarshal(v, m); err != nil {
			return nil, fmt.Errorf("decode %s of task %q: %w", b, taskID, err)
		}
		out = append(out, m)
	}
	return out, nil
}

// ListSteps implements store.Store.
func (s *Store) ListSteps(ctx context.Context, taskID string, offset, limit int) ([]*tasksv1.Step, int, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	var out []*tasksv1.Step
	var total int
	err := s.db.View(func(tx *boltdb.Tx) error {
		if _, err := getTask(tx, taskID); err != nil {
			return err
		}
		prefix := append([]byte(taskID), 0)
		c := tx.Bucket(bucketSteps).Cursor()
		for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
			if total >= offset && len(out) < limit {
				st := &tasksv1.Step{}
				if err := proto.Unmarshal(v, st); err != nil {
					return fmt.Errorf("decode step of task %q: %w", taskID, err)
				}
				out = append(out, st)
			}
			total++
		}
		return nil
	})
	return out, total, err
}

// UpdateStep implements store.Store.
func (s *Store) UpdateStep(ctx context.Context, ref store.StepRef, mutate func(*tasksv1.Task, *tasksv1.Step) ([]*tasksv1.Artifact, error)) (*tasksv1.Step, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var out *tasksv1.Step
	err := s.db.Update(func(tx *boltdb.Tx) error {
		t, err := getTask(tx, ref.TaskID)
		if err != nil {
			return err
		}
		k, st, err := getStep(tx, ref)
		if err != nil {
			return err
		}
		before := proto.CloneOf(t)
		arts, err := mutate(t, st)
		if err != nil {
			return err
		}
		for _, a := range arts {
			if err := addArtifact(tx, t, a); err != nil {
				return err
			}
		}
		if err := put(tx.Bucket(bucketSteps), k, st); err != nil {
			return err
		}
		if err := setPending(tx, k, st); err != nil {
			return err
		}
		out = st
		if proto.Equal(before, t) {
			return nil // most steps leave the task as it was: one page less to write
		}
		return put(tx.Bucket(bucketTasks), []byte(ref.TaskID), t)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// ListPending implements store.Store.
func (s *Store) ListPending(ctx context.Context) ([]store.StepRef, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var out []store.StepRef
	err := s.db.View(func(tx *boltdb.Tx) error {
		return tx.Bucket(bucketPending).ForEach(func(k, _ []byte) error {
			task, step, ok := bytes.Cut(k, []byte{0})
			if !ok {
				return fmt.Errorf("malformed pending key %q", k)
			}
			out = append(out, store.StepRef{TaskID: string(task), StepID: string(step)})
			return nil
		})
	})
	return out, err
}

// addArtifact stores a as t's next artifact; the caller stores t.
func addArtifact(tx *boltdb.Tx, t *tasksv1.Task, a *tasksv1.Artifact) error {
	taskID := resource.ID(t.GetName())
	idx := tx.Bucket(bucketArtifactIndex)
	ik := key([]byte(taskID), []byte(resource.ID(a.GetName())))
	if idx.Get(ik) != nil {
		return resource.AlreadyExists("artifact", a.GetName())
	}
	seq := seqBytes(uint64(t.GetArtifactCount()))
	t.ArtifactCount++
	if err := idx.Put(ik, seq); err != nil {
		return err
	}
	return put(tx.Bucket(bucketArtifacts), key([]byte(taskID), seq), a)
}

// CreateArtifact implements store.Store.
func (s *Store) CreateArtifact(ctx context.Context, taskID string, a *tasksv1.Artifact) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.Update(func(tx *boltdb.Tx) error {
		t, err := getTask(tx, taskID)
		if err != nil {
			return err
		}
		if err := addArtifact(tx, t, a); err != nil {
			return err
		}
		t.UpdateTime = a.GetCreateTime()
		return put(tx.Bucket(bucketTasks), []byte(taskID), t)
	})
}

// GetArtifact implements store.Store.
func (s *Store) GetArtifact(ctx context.Context, taskID, artifactID string) (*tasksv1.Artifact, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	a := &tasksv1.Artifact{}
	err := s.db.View(func(tx *boltdb.Tx) error {
		seq := tx.Bucket(bucketArtifactIndex).Get(key([]byte(taskID), []byte(artifactID)))
		if seq == nil {
			return resource.NotFound("artifact", "tasks/"+taskID+"/artifacts/"+artifactID)
		}
		return proto.Unmarshal(tx.Bucket(bucketArtifacts).Get(key([]byte(taskID), seq)), a)
	})
	if err != nil {
		return nil, err
	}
	return a, nil
}

// ListArtifacts implements store.Store.
func (s *Store) ListArtifacts(ctx context.Context, taskID string, offset, limit int) ([]*tasksv1.Artifact, int, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	var out []*tasksv1.Artifact
	var total int
	err := s.db.View(func(tx *boltdb.Tx) error {
		t, err := getTask(tx, taskID)
		if err != nil {
			return err
		}
		total = int(t.GetArtifactCount())
		out, err = listChildren(tx, bucketArtifacts, taskID, offset, limit, func() *tasksv1.Artifact { return &tasksv1.Artifact{} })
		return err
	})
	return out, total, err
}
