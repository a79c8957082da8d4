package storetest

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/timestamppb"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/services/registry/internal/store"
)

// key returns a stored key named parent/keys/id, created at second n, with
// a hash derived from id.
func key(parent, id string, n int64) store.StoredKey {
	k := store.StoredKey{
		ID:  id,
		Key: &registryv1.Key{Name: parent + "/keys/" + id, CreateTime: timestamppb.New(time.Unix(n, 0))},
	}
	copy(k.Hash[:], "hash-of-"+id)
	return k
}

func testClients(t *testing.T, s store.Store) {
	ctx := t.Context()
	for i, id := range []string{"b", "a", "c"} {
		c := &registryv1.Client{Name: "clients/" + id, DisplayName: id}
		if _, err := s.CreateClient(ctx, c, key(c.GetName(), fmt.Sprintf("%016x", i), 1)); err != nil {
			t.Fatalf("CreateClient(%s): %v", id, err)
		}
	}
	if _, err := s.CreateClient(ctx, &registryv1.Client{Name: "clients/a"}, key("clients/a", "00000000000000ff", 1)); !errors.Is(err, store.ErrAlreadyExists) {
		t.Errorf("CreateClient(taken) error = %v, want ErrAlreadyExists", err)
	}
	if _, err := s.GetKeyByID(ctx, "00000000000000ff"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetKeyByID(key of refused client) error = %v, want ErrNotFound: a refused create stores nothing", err)
	}
	got, err := s.GetClient(ctx, "clients/a")
	if err != nil || got.GetDisplayName() != "a" {
		t.Errorf("GetClient(clients/a) = %v, %v", got, err)
	}
	if _, err := s.GetClient(ctx, "clients/zz"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetClient(missing) error = %v, want ErrNotFound", err)
	}
	var names []string
	after := ""
	for {
		page, err := s.ListClients(ctx, store.ListOptions{After: after, Limit: 2})
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		for _, c := range page {
			names = append(names, c.GetName())
		}
		after = page[len(page)-1].GetName()
	}
	if diff := cmp.Diff([]string{"clients/a", "clients/b", "clients/c"}, names); diff != "" {
		t.Errorf("ListClients pages (-want +got):\n%s", diff)
	}
}

func testKeys(t *testing.T, s store.Store) {
	ctx := t.Context()
	a := agent("acme", "bot")
	first := key(a.GetName(), "0000000000000001", 10)
	if _, err := s.CreateAgent(ctx, a, &first, ""); err != nil {
		t.Fatal(err)
	}
	second := key(a.GetName(), "0000000000000002", 5) // older: listed first
	if err := s.CreateKey(ctx, second); err != nil {
		t.Fatalf("CreateKey: %v", err)
	}
	got, err := s.GetKeyByID(ctx, first.ID)
	if err != nil || got.Hash != first.Hash || got.Key.GetName() != first.Key.GetName() {
		t.Errorf("GetKeyByID(%s) = %+v, %v; want %+v", first.ID, got, err, first)
	}
	list, err := s.ListKeys(ctx, a.GetName())
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]*registryv1.Key{second.Key, first.Key}, list, protocmp.Transform()); diff != "" {
		t.Errorf("ListKeys(%s) (-want +got):\n%s", a.GetName(), diff)
	}
	third := key(a.GetName(), "0000000000000003", 20)
	if err := s.RotateKey(ctx, first.Key.GetName(), third); err != nil {
		t.Fatalf("RotateKey: %v", err)
	}
	if _, err := s.GetKeyByID(ctx, first.ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetKeyByID(rotated away) error = %v, want ErrNotFound", err)
	}
	if err := s.RotateKey(ctx, first.Key.GetName(), key(a.GetName(), "0000000000000004", 30)); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("RotateKey(gone) error = %v, want ErrNotFound", err)
	}
	if _, err := s.GetKeyByID(ctx, "0000000000000004"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("a failed RotateKey stored its new key: GetKeyByID error = %v", err)
	}
	if err := s.DeleteKey(ctx, second.Key.GetName()); err != nil {
		t.Fatalf("DeleteKey: %v", err)
	}
	if err := s.DeleteKey(ctx, second.Key.GetName()); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("DeleteKey(again) error = %v, want ErrNotFound", err)
	}
	list, _ = s.ListKeys(ctx, a.GetName())
	if diff := cmp.Diff([]*registryv1.Key{third.Key}, list, protocmp.Transform()); diff != "" {
		t.Errorf("ListKeys after rotate and delete (-want +got):\n%s", diff)
	}
	if list, _ := s.ListKeys(ctx, "clients/acme"); len(list) != 0 {
		t.Errorf("ListKeys(clients/acme) = %v, want none: agent keys are not the client's", list)
	}
}

func testKeysOwnerMissing(t *testing.T, s store.Store) {
	for _, parent := range []string{"clients/nobody", "clients/nobody/agents/x"} {
		if err := s.CreateKey(t.Context(), key(parent, "0000000000000001", 1)); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("CreateKey(under %s) error = %v, want ErrNotFound", parent, err)
		}
	}
}

func testKeysLimit(t *testing.T, s store.Store) {
	ctx := t.Context()
	c := &registryv1.Client{Name: "clients/acme"}
	if _, err := s.CreateClient(ctx, c, key(c.GetName(), "1000000000000000", 1)); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < store.MaxKeys; i++ {
		if err := s.CreateKey(ctx, key(c.GetName(), fmt.Sprintf("%016x", i), 1)); err != nil {
			t.Fatalf("CreateKey #%d: %v", i+1, err)
		}
	}
	if err := s.CreateKey(ctx, key(c.GetName(), "2000000000000000", 1)); !errors.Is(err, store.ErrTooManyKeys) {
		t.Errorf("CreateKey(#%d) error = %v, want ErrTooManyKeys", store.MaxKeys+1, err)
	}
}

func testKeysDeletedWithAgent(t *testing.T, s store.Store) {
	ctx := t.Context()
	a := agent("acme", "bot")
	k := key(a.GetName(), "0000000000000001", 1)
	if _, err := s.CreateAgent(ctx, a, &k, ""); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteAgent(ctx, a.GetName()); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetKeyByID(ctx, k.ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetKeyByID(key of deleted agent) error = %v, want ErrNotFound", err)
	}
	if _, err := s.CreateAgent(ctx, a, nil, ""); err != nil {
		t.Fatal(err)
	}
	if list, _ := s.ListKeys(ctx, a.GetName()); len(list) != 0 {
		t.Errorf("ListKeys(recreated agent) = %v, want none", list)
	}
}

func testKeysSecretNeverStored(t *testing.T, s store.Store) {
	ctx := t.Context()
	a := agent("acme", "bot")
	k := key(a.GetName(), "0000000000000001", 1)
	k.Key.Secret = "parley_ak_must-not-be-stored"
	if _, err := s.CreateAgent(ctx, a, &k, ""); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetKeyByID(ctx, k.ID)
	if err != nil || got.Key.GetSecret() != "" {
		t.Errorf("GetKeyByID() secret = %q, %v; want it never stored", got.Key.GetSecret(), err)
	}
}
