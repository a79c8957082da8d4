package boltstore

import (
	"testing"
	"time"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/boltdb/boltdbtest"
	"github.com/parleyhq/parley/services/registry/internal/store"
	"github.com/parleyhq/parley/services/registry/internal/store/storetest"
)

// Every acknowledged write returns only after a commit that bbolt fsynced
// (boltdbtest.SyncedWrites says why that is checked this way): a store
// opened with NoSync fails here.
func TestWrites_returnOnlyAfterASyncedCommit(t *testing.T) {
	s, err := Open(t.TempDir(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := t.Context()
	const agent = "clients/c/agents/a"
	writes := []boltdbtest.Write{
		{Name: "CreateProtocol", Do: func() error { _, _, err := s.CreateProtocol(ctx, storetest.Protocol("pd")); return err }},
		{Name: "CreateClient", Do: func() error {
			_, err := s.CreateClient(ctx, &registryv1.Client{Name: "clients/c"}, key("clients/c", "k0"))
			return err
		}},
		{Name: "CreateKey", Do: func() error { return s.CreateKey(ctx, key("clients/c", "k1")) }},
		{Name: "RotateKey", Do: func() error { return s.RotateKey(ctx, "clients/c/keys/k1", key("clients/c", "k2")) }},
		{Name: "DeleteKey", Do: func() error { return s.DeleteKey(ctx, "clients/c/keys/k2") }},
		{Name: "CreateAgent", Do: func() error { _, err := s.CreateAgent(ctx, &registryv1.Agent{Name: agent}, nil, "req-1"); return err }},
		{Name: "UpdateAgent", Do: func() error {
			_, err := s.UpdateAgent(ctx, agent, "req-2", func(a *registryv1.Agent) error { a.DisplayName = "x"; return nil })
			return err
		}},
		{Name: "SweepRequests", Do: func() error { _, err := s.SweepRequests(ctx, time.Now().Add(time.Hour), 10); return err }},
		{Name: "DeleteAgent", Do: func() error { return s.DeleteAgent(ctx, agent) }},
	}
	boltdbtest.SyncedWrites(t, s.db, writes)
}

func key(parent, id string) store.StoredKey {
	k := store.StoredKey{ID: id, Key: &registryv1.Key{Name: parent + "/keys/" + id}}
	copy(k.Hash[:], "hash-of-"+id)
	return k
}
