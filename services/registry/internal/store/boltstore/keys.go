package boltstore

import (
	"bytes"
	"context"
	"fmt"
	"slices"

	"google.golang.org/protobuf/proto"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/boltdb"
	"github.com/parleyhq/parley/services/registry/internal/store"
)

// CreateClient implements store.Store.
func (s *Store) CreateClient(ctx context.Context, c *registryv1.Client, key store.StoredKey) (*registryv1.Client, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c = proto.Clone(c).(*registryv1.Client)
	val, err := proto.Marshal(c)
	if err != nil {
		return nil, err
	}
	err = s.db.Update(func(tx *boltdb.Tx) error {
		b := tx.Bucket(bucketClients)
		if b.Get([]byte(c.GetName())) != nil {
			return fmt.Errorf("client %s: %w", c.GetName(), store.ErrAlreadyExists)
		}
		if err := b.Put([]byte(c.GetName()), val); err != nil {
			return err
		}
		return putKey(tx, key)
	})
	if err != nil {
		return nil, err
	}
	return c, nil
}

// GetClient implements store.Store.
func (s *Store) GetClient(ctx context.Context, name string) (*registryv1.Client, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c := &registryv1.Client{}
	err := s.db.View(func(tx *boltdb.Tx) error {
		val := tx.Bucket(bucketClients).Get([]byte(name))
		if val == nil {
			return fmt.Errorf("client %s: %w", name, store.ErrNotFound)
		}
		return proto.Unmarshal(val, c)
	})
	if err != nil {
		return nil, err
	}
	return c, nil
}

// ListClients implements store.Store.
func (s *Store) ListClients(ctx context.Context, opts store.ListOptions) ([]*registryv1.Client, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var out []*registryv1.Client
	err := s.db.View(func(tx *boltdb.Tx) error {
		c := tx.Bucket(bucketClients).Cursor()
		k, v := c.First()
		if opts.After != "" {
			if k, v = c.Seek([]byte(opts.After)); k != nil && string(k) == opts.After {
				k, v = c.Next()
			}
		}
		for ; k != nil && len(out) < opts.Limit; k, v = c.Next() {
			cl := &registryv1.Client{}
			if err := proto.Unmarshal(v, cl); err != nil {
				return fmt.Errorf("decode client: %w", err)
			}
			out = append(out, cl)
		}
		return nil
	})
	return out, err
}

// CreateKey implements store.Store.
func (s *Store) CreateKey(ctx context.Context, k store.StoredKey) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.Update(func(tx *boltdb.Tx) error {
		parent := store.KeyParent(k.Key.GetName())
		if !ownerExists(tx, parent) {
			return fmt.Errorf("%s: %w", parent, store.ErrNotFound)
		}
		if n := len(keyNames(tx, parent)); n >= store.MaxKeys {
			return fmt.Errorf("%s holds %d keys: %w", parent, n, store.ErrTooManyKeys)
		}
		return putKey(tx, k)
	})
}

// ListKeys implements store.Store.
func (s *Store) ListKeys(ctx context.Context, parent string) ([]*registryv1.Key, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var out []*registryv1.Key
	err := s.db.View(func(tx *boltdb.Tx) error {
		ids := tx.Bucket(bucketKeyNames)
		for _, name := range keyNames(tx, parent) {
			k, err := getKey(tx, string(ids.Get(name)))
			if err != nil {
				return err
			}
			out = append(out, k.Key)
		}
		return nil
	})
	slices.SortStableFunc(out, func(a, b *registryv1.Key) int {
		return a.GetCreateTime().AsTime().Compare(b.GetCreateTime().AsTime())
	})
	return out, err
}

// DeleteKey implements store.Store.
func (s *Store) DeleteKey(ctx context.Context, name string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.Update(func(tx *boltdb.Tx) error { return deleteKey(tx, name) })
}

// RotateKey implements store.Store.
func (s *Store) RotateKey(ctx context.Context, old string, k store.StoredKey) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if store.KeyParent(old) != store.KeyParent(k.Key.GetName()) {
		return fmt.Errorf("rotate %s: the new key %s has another owner", old, k.Key.GetName())
	}
	return s.db.Update(func(tx *boltdb.Tx) error {
		if err := deleteKey(tx, old); err != nil {
			return err
		}
		return putKey(tx, k)
	})
}

// GetKeyByID implements store.Store.
func (s *Store) GetKeyByID(ctx context.Context, id string) (store.StoredKey, error) {
	if err := ctx.Err(); err != nil {
		return store.StoredKey{}, err
	}
	var k store.StoredKey
	err := s.db.View(func(tx *boltdb.Tx) error {
		var err error
		k, err = getKey(tx, id)
		return err
	})
	return k, err
}

func putKey(tx *boltdb.Tx, k store.StoredKey) error {
	key := proto.Clone(k.Key).(*registryv1.Key)
	key.Secret = "" // never stored, whatever the caller left in it
	val, err := proto.Marshal(key)
	if err != nil {
		return err
	}
	b := tx.Bucket(bucketKeys)
	if b.Get([]byte(k.ID)) != nil {
		return fmt.Errorf("key id %s: %w", k.ID, store.ErrAlreadyExists)
	}
	if err := b.Put([]byte(k.ID), append(k.Hash[:], val...)); err != nil {
		return err
	}
	return tx.Bucket(bucketKeyNames).Put([]byte(key.GetName()), []byte(k.ID))
}

func getKey(tx *boltdb.Tx, id string) (store.StoredKey, error) {
	val := tx.Bucket(bucketKeys).Get([]byte(id))
	if val == nil {
		return store.StoredKey{}, fmt.Errorf("key id %s: %w", id, store.ErrNotFound)
	}
	if len(val) < 32 {
		return store.StoredKey{}, fmt.Errorf("key id %s: stored value too short", id)
	}
	k := store.StoredKey{ID: id, Key: &registryv1.Key{}}
	copy(k.Hash[:], val[:32])
	if err := proto.Unmarshal(val[32:], k.Key); err != nil {
		return store.StoredKey{}, fmt.Errorf("decode key: %w", err)
	}
	return k, nil
}

func deleteKey(tx *boltdb.Tx, name string) error {
	names := tx.Bucket(bucketKeyNames)
	id := names.Get([]byte(name))
	if id == nil {
		return fmt.Errorf("key %s: %w", name, store.ErrNotFound)
	}
	if err := tx.Bucket(bucketKeys).Delete(bytes.Clone(id)); err != nil {
		return err
	}
	return names.Delete([]byte(name))
}

// deleteKeys removes every key of owner.
func deleteKeys(tx *boltdb.Tx, owner string) error {
	for _, name := range keyNames(tx, owner) {
		if err := deleteKey(tx, string(name)); err != nil {
			return err
		}
	}
	return nil
}

// keyNames returns the names of owner's keys, copied so that the caller
// may delete them (never while walking the cursor).
func keyNames(tx *boltdb.Tx, owner string) [][]byte {
	prefix := []byte(owner + "/keys/")
	var out [][]byte
	c := tx.Bucket(bucketKeyNames).Cursor()
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
		out = append(out, bytes.Clone(k))
	}
	return out
}

// ownerExists reports whether a client or agent named name is stored.
func ownerExists(tx *boltdb.Tx, name string) bool {
	if tx.Bucket(bucketAgents).Get([]byte(name)) != nil {
		return true
	}
	return tx.Bucket(bucketClients).Get([]byte(name)) != nil
}
