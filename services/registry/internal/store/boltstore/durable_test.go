package boltstore

import (
	"testing"
	"time"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/services/registry/internal/store"
	"github.com/parleyhq/parley/services/registry/internal/store/storetest"
)

// Every write returns only after a commit that bbolt fsynced. A kill -9
// test cannot see a missing fsync (the page cache outlives the process), so
// this reads platform/boltdb's commit counts instead: a store opened with
// NoSync fails here.
func TestWrites_returnOnlyAfterASyncedCommit(t *testing.T) {
	s, err := Open(t.TempDir(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.db.Durable(); err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	const agent = "clients/c/agents/a"
	writes := []struct {
		name string
		do   func() error
	}{
		{"CreateProtocol", func() error { _, _, err := s.CreateProtocol(ctx, storetest.Protocol("pd")); return err }},
		{"CreateClient", func() error {
			_, err := s.CreateClient(ctx, &registryv1.Client{Name: "clients/c"}, key("clients/c", "k0"))
			return err
		}},
		{"CreateKey", func() error { return s.CreateKey(ctx, key("clients/c", "k1")) }},
		{"RotateKey", func() error { return s.RotateKey(ctx, "clients/c/keys/k1", key("clients/c", "k2")) }},
		{"DeleteKey", func() error { return s.DeleteKey(ctx, "clients/c/keys/k2") }},
		{"CreateAgent", func() error { _, err := s.CreateAgent(ctx, &registryv1.Agent{Name: agent}, nil, "req-1"); return err }},
		{"UpdateAgent", func() error {
			_, err := s.UpdateAgent(ctx, agent, "req-2", func(a *registryv1.Agent) error { a.DisplayName = "x"; return nil })
			return err
		}},
		{"SweepRequests", func() error { _, err := s.SweepRequests(ctx, time.Now().Add(time.Hour)); return err }},
		{"DeleteAgent", func() error { return s.DeleteAgent(ctx, agent) }},
	}
	for _, w := range writes {
		before := s.db.Commits()
		if err := w.do(); err != nil {
			t.Fatalf("%s: %v", w.name, err)
		}
		if after := s.db.Commits(); after.Synced == before.Synced || after.Unsynced != 0 {
			t.Errorf("%s: commits went %+v -> %+v; want it to return after a synced commit, and no unsynced one", w.name, before, after)
		}
	}
}

func key(parent, id string) store.StoredKey {
	k := store.StoredKey{ID: id, Key: &registryv1.Key{Name: parent + "/keys/" + id}}
	copy(k.Hash[:], "hash-of-"+id)
	return k
}
