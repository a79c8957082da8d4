package boltstore_test

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	tasksv1 "github.com/parleyhq/parley/gen/parley/tasks/v1"
	"github.com/parleyhq/parley/services/tasks/internal/store"
	"github.com/parleyhq/parley/services/tasks/internal/store/boltstore"
	"github.com/parleyhq/parley/services/tasks/internal/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		s, err := boltstore.Open(t.TempDir(), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

func TestOpen_reportsLockedFile(t *testing.T) {
	dir := t.TempDir()
	s, err := boltstore.Open(dir, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s2, err := boltstore.Open(dir, 50*time.Millisecond); err == nil {
		s2.Close()
		t.Errorf("Open(%q) while open = nil error, want locked", dir)
	}
}

func TestReopen_keepsWritesAndPending(t *testing.T) {
	dir := t.TempDir()
	s, err := boltstore.Open(dir, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if err := s.CreateTask(ctx, &tasksv1.Task{Name: "tasks/t", Agent: "clients/c/agents/a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateStep(ctx, "t", &tasksv1.Step{Name: "tasks/t/steps/s", Status: tasksv1.Step_STATUS_CREATED}, func(*tasksv1.Task, *tasksv1.Step) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = boltstore.Open(dir, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.GetStep(ctx, store.StepRef{TaskID: "t", StepID: "s"}); err != nil {
		t.Errorf("GetStep after reopen: %v", err)
	}
	pending, err := s.ListPending(ctx)
	if err != nil || len(pending) != 1 {
		t.Errorf("ListPending after reopen = %v, %v; want the created step", pending, err)
	}
	if err := s.CreateTask(ctx, &tasksv1.Task{Name: "tasks/t"}); !errors.Is(err, store.ErrAlreadyExists) {
		t.Errorf("CreateTask(existing) after reopen = %v, want ErrAlreadyExists", err)
	}
}

func TestOpen_refusesPreReleaseSchema(t *testing.T) {
	dir := t.TempDir()
	db, err := bolt.Open(filepath.Join(dir, boltstore.FileName), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucket([]byte("meta"))
		if err != nil {
			return err
		}
		return b.Put([]byte("schema_version"), []byte("1"))
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	s, err := boltstore.Open(dir, time.Second)
	if err == nil {
		s.Close()
		t.Fatal("Open(schema 1) = nil error, want refusal")
	}
	if !strings.Contains(err.Error(), "not migrated") {
		t.Errorf("Open(schema 1) = %v; want it to say the data is not migrated", err)
	}
}
