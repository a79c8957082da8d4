package boltstore

import (
	"bytes"
	"context"
	"strings"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/boltdb"
	"github.com/parleyhq/parley/platform/resource"
	"github.com/parleyhq/parley/services/registry/internal/store"
)

// edgeSep separates the two agent names of a follow key. Resource names
// never hold a NUL, and it sorts before every character a name may hold,
// so all of one agent's edges are contiguous and in name order.
const edgeSep = "\x00"

func edge(a, b string) []byte { return []byte(a + edgeSep + b) }

// Follow implements store.Store.
func (s *Store) Follow(ctx context.Context, follower, agent string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	var created bool
	err := s.db.Update(func(tx *boltdb.Tx) error {
		created = false
		agents := tx.Bucket(bucketAgents)
		for _, name := range []string{follower, agent} {
			if agents.Get([]byte(name)) == nil {
				return resource.NotFound("agent", name)
			}
		}
		following := tx.Bucket(bucketFollowing)
		if following.Get(edge(follower, agent)) != nil {
			return nil
		}
		created = true
		if err := following.Put(edge(follower, agent), []byte{}); err != nil {
			return err
		}
		if err := tx.Bucket(bucketFollowers).Put(edge(agent, follower), []byte{}); err != nil {
			return err
		}
		return notify(tx, &registryv1.Notification{Type: "followed", Recipient: agent, Agent: follower}, s.maxOutbox)
	})
	if err != nil {
		return false, err
	}
	return created, nil
}

// Unfollow implements store.Store.
func (s *Store) Unfollow(ctx context.Context, follower, agent string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.Update(func(tx *boltdb.Tx) error {
		if tx.Bucket(bucketAgents).Get([]byte(follower)) == nil {
			return resource.NotFound("agent", follower)
		}
		following := tx.Bucket(bucketFollowing)
		if following.Get(edge(follower, agent)) == nil {
			return nil
		}
		if err := following.Delete(edge(follower, agent)); err != nil {
			return err
		}
		if err := tx.Bucket(bucketFollowers).Delete(edge(agent, follower)); err != nil {
			return err
		}
		return notify(tx, &registryv1.Notification{Type: "unfollowed", Recipient: agent, Agent: follower}, s.maxOutbox)
	})
}

// ListFollowers implements store.Store.
func (s *Store) ListFollowers(ctx context.Context, agent string, opts store.ListOptions) ([]string, error) {
	return s.listEdges(ctx, bucketFollowers, agent, opts)
}

// ListFollowing implements store.Store.
func (s *Store) ListFollowing(ctx context.Context, follower string, opts store.ListOptions) ([]string, error) {
	return s.listEdges(ctx, bucketFollowing, follower, opts)
}

// listEdges returns the far ends of from's edges in bucket, after
// opts.After, at most opts.Limit.
func (s *Store) listEdges(ctx context.Context, bucket []byte, from string, opts store.ListOptions) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	prefix := []byte(from + edgeSep)
	var out []string
	err := s.db.View(func(tx *boltdb.Tx) error {
		out = scanPrefix(tx.Bucket(bucket), prefix, opts)
		return nil
	})
	return out, err
}

// scanPrefix returns the keys under prefix, without it, that sort after
// prefix+opts.After, at most opts.Limit.
func scanPrefix(b *boltdb.Bucket, prefix []byte, opts store.ListOptions) []string {
	var out []string
	_ = walkPrefix(b, prefix, opts, func(k, _ []byte) error {
		out = append(out, string(k[len(prefix):]))
		return nil
	})
	return out
}

// walkPrefix calls fn for the keys under prefix that sort after
// prefix+opts.After, at most opts.Limit of them, stopping at fn's first
// error.
func walkPrefix(b *boltdb.Bucket, prefix []byte, opts store.ListOptions, fn func(k, v []byte) error) error {
	c := b.Cursor()
	k, v := c.Seek(prefix)
	if opts.After != "" {
		start := append(bytes.Clone(prefix), opts.After...)
		if k, v = c.Seek(start); k != nil && bytes.Equal(k, start) {
			k, v = c.Next()
		}
	}
	for n := 0; k != nil && bytes.HasPrefix(k, prefix) && n < opts.Limit; k, v = c.Next() {
		if err := fn(k, v); err != nil {
			return err
		}
		n++
	}
	return nil
}

// IsFollowing implements store.Store.
func (s *Store) IsFollowing(ctx context.Context, follower, agent string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	var ok bool
	err := s.db.View(func(tx *boltdb.Tx) error {
		ok = tx.Bucket(bucketFollowing).Get(edge(follower, agent)) != nil
		return nil
	})
	return ok, err
}

// JoinClientGroup implements store.Store.
func (s *Store) JoinClientGroup(ctx context.Context, agent string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.Update(func(tx *boltdb.Tx) error {
		if tx.Bucket(bucketAgents).Get([]byte(agent)) == nil {
			return resource.NotFound("agent", agent)
		}
		return tx.Bucket(bucketClientGroups).Put([]byte(agent), []byte{})
	})
}

// LeaveClientGroup implements store.Store.
func (s *Store) LeaveClientGroup(ctx context.Context, agent string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.Update(func(tx *boltdb.Tx) error {
		if tx.Bucket(bucketAgents).Get([]byte(agent)) == nil {
			return resource.NotFound("agent", agent)
		}
		return tx.Bucket(bucketClientGroups).Delete([]byte(agent))
	})
}

// ListClientGroupMembers implements store.Store. Members are keyed by
// their names, so a client's members are those under its agent prefix.
func (s *Store) ListClientGroupMembers(ctx context.Context, client string, opts store.ListOptions) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	prefix := []byte(client + "/agents/")
	var out []string
	err := s.db.View(func(tx *boltdb.Tx) error {
		after := opts
		after.After = strings.TrimPrefix(opts.After, string(prefix))
		for _, id := range scanPrefix(tx.Bucket(bucketClientGroups), prefix, after) {
			out = append(out, string(prefix)+id)
		}
		return nil
	})
	return out, err
}

// InClientGroup implements store.Store.
func (s *Store) InClientGroup(ctx context.Context, agent string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	var ok bool
	err := s.db.View(func(tx *boltdb.Tx) error {
		ok = tx.Bucket(bucketClientGroups).Get([]byte(agent)) != nil
		return nil
	})
	return ok, err
}

// deleteConnections removes agent's follows both ways and its membership,
// inside the transaction deleting the agent. Keys are collected before
// any is deleted: never delete while walking a cursor.
func deleteConnections(tx *boltdb.Tx, agent string) error {
	all := store.ListOptions{Limit: int(^uint(0) >> 1)}
	following, followers := tx.Bucket(bucketFollowing), tx.Bucket(bucketFollowers)
	prefix := []byte(agent + edgeSep)
	for _, other := range scanPrefix(following, prefix, all) {
		if err := following.Delete(edge(agent, other)); err != nil {
			return err
		}
		if err := followers.Delete(edge(other, agent)); err != nil {
			return err
		}
	}
	for _, other := range scanPrefix(followers, prefix, all) {
		if err := followers.Delete(edge(agent, other)); err != nil {
			return err
		}
		if err := following.Delete(edge(other, agent)); err != nil {
			return err
		}
	}
	return tx.Bucket(bucketClientGroups).Delete([]byte(agent))
}
