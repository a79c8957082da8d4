package pgstore

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/proto"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/pgdb"
	"github.com/parleyhq/parley/platform/resource"
	"github.com/parleyhq/parley/services/registry/internal/store"
)

// CreateClient implements store.Store.
func (s *Store) CreateClient(ctx context.Context, c *registryv1.Client, key store.StoredKey) (*registryv1.Client, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c = proto.CloneOf(c)
	val, err := proto.Marshal(c)
	if err != nil {
		return nil, err
	}
	err = s.db.Update(ctx, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `INSERT INTO clients (name, data) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING`, c.GetName(), val)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return fmt.Errorf("client %s: %w", c.GetName(), store.ErrAlreadyExists)
		}
		return putKey(ctx, tx, key)
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
	return one(ctx, s.db.Pool(), &registryv1.Client{}, fmt.Errorf("client %s: %w", name, store.ErrNotFound), `SELECT data FROM clients WHERE name = $1`, name)
}

// ListClients implements store.Store.
func (s *Store) ListClients(ctx context.Context, opts store.ListOptions) ([]*registryv1.Client, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return many(ctx, s.db.Pool(), func() *registryv1.Client { return &registryv1.Client{} },
		`SELECT data FROM clients WHERE name > $1 ORDER BY name LIMIT $2`, opts.After, opts.Limit)
}

// CreateKey implements store.Store.
func (s *Store) CreateKey(ctx context.Context, k store.StoredKey) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	parent := store.KeyParent(k.Key.GetName())
	return s.db.Update(ctx, func(tx pgx.Tx) error {
		ok, err := exists(ctx, tx, `SELECT 1 FROM agents WHERE name = $1 UNION ALL SELECT 1 FROM clients WHERE name = $1`, parent)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("%s: %w", parent, store.ErrNotFound)
		}
		var n int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM keys WHERE owner = $1`, parent).Scan(&n); err != nil {
			return err
		}
		if n >= store.MaxKeys {
			return fmt.Errorf("%s holds %d keys: %w", parent, n, store.ErrTooManyKeys)
		}
		return putKey(ctx, tx, k)
	})
}

// ListKeys implements store.Store.
func (s *Store) ListKeys(ctx context.Context, parent string) ([]*registryv1.Key, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	out, err := many(ctx, s.db.Pool(), func() *registryv1.Key { return &registryv1.Key{} },
		`SELECT data FROM keys WHERE owner = $1 ORDER BY name`, parent)
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
	return deleteKey(ctx, s.db.Pool(), name)
}

// RotateKey implements store.Store.
func (s *Store) RotateKey(ctx context.Context, old string, k store.StoredKey) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if store.KeyParent(old) != store.KeyParent(k.Key.GetName()) {
		return fmt.Errorf("rotate %s: the new key %s has another owner", old, k.Key.GetName())
	}
	return s.db.Update(ctx, func(tx pgx.Tx) error {
		if err := deleteKey(ctx, tx, old); err != nil {
			return err
		}
		return putKey(ctx, tx, k)
	})
}

// GetKeyByID implements store.Store.
func (s *Store) GetKeyByID(ctx context.Context, id string) (store.StoredKey, error) {
	if err := ctx.Err(); err != nil {
		return store.StoredKey{}, err
	}
	var hash, data []byte
	err := s.db.Pool().QueryRow(ctx, `SELECT hash, data FROM keys WHERE id = $1`, id).Scan(&hash, &data)
	if errors.Is(err, pgx.ErrNoRows) {
		return store.StoredKey{}, fmt.Errorf("key id %s: %w", id, store.ErrNotFound)
	}
	if err != nil {
		return store.StoredKey{}, err
	}
	if len(hash) != 32 {
		return store.StoredKey{}, fmt.Errorf("key id %s: stored hash is %d bytes", id, len(hash))
	}
	k := store.StoredKey{ID: id}
	copy(k.Hash[:], hash)
	if k.Key, err = resource.Decode(data, &registryv1.Key{}); err != nil {
		return store.StoredKey{}, err
	}
	return k, nil
}

// putKey stores k, its secret cleared; a taken id or name is
// ErrAlreadyExists.
func putKey(ctx context.Context, q pgdb.Querier, k store.StoredKey) error {
	key := proto.CloneOf(k.Key)
	key.Secret = "" // never stored, whatever the caller left in it
	val, err := proto.Marshal(key)
	if err != nil {
		return err
	}
	tag, err := q.Exec(ctx, `INSERT INTO keys (id, name, owner, hash, data) VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING`,
		k.ID, key.GetName(), store.KeyParent(key.GetName()), k.Hash[:], val)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("key id %s: %w", k.ID, store.ErrAlreadyExists)
	}
	return nil
}

// deleteKey removes a key by name, or fails with ErrNotFound.
func deleteKey(ctx context.Context, q pgdb.Querier, name string) error {
	tag, err := q.Exec(ctx, `DELETE FROM keys WHERE name = $1`, name)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("key %s: %w", name, store.ErrNotFound)
	}
	return nil
}
