package pgstore

import (
	"context"
	"strings"

	"github.com/jackc/pgx/v5"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/resource"
	"github.com/parleyhq/parley/services/registry/internal/store"
)

// agentsExist fails with NotFound naming the first missing agent.
func agentsExist(ctx context.Context, tx pgx.Tx, agents ...string) error {
	for _, name := range agents {
		ok, err := exists(ctx, tx, `SELECT 1 FROM agents WHERE name = $1`, name)
		if err != nil {
			return err
		}
		if !ok {
			return resource.NotFound("agent", name)
		}
	}
	return nil
}

// Follow implements store.Store.
func (s *Store) Follow(ctx context.Context, follower, agent string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	var created bool
	err := s.db.Update(ctx, func(tx pgx.Tx) error {
		created = false
		if err := agentsExist(ctx, tx, follower, agent); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `INSERT INTO follows (follower, agent) VALUES ($1, $2) ON CONFLICT DO NOTHING`, follower, agent)
		if err != nil || tag.RowsAffected() == 0 {
			return err
		}
		created = true
		return s.notify(ctx, tx, &registryv1.Notification{Type: "followed", Recipient: agent, Agent: follower})
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
	return s.db.Update(ctx, func(tx pgx.Tx) error {
		if err := agentsExist(ctx, tx, follower); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `DELETE FROM follows WHERE follower = $1 AND agent = $2`, follower, agent)
		if err != nil || tag.RowsAffected() == 0 {
			return err
		}
		return s.notify(ctx, tx, &registryv1.Notification{Type: "unfollowed", Recipient: agent, Agent: follower})
	})
}

// ListFollowers implements store.Store.
func (s *Store) ListFollowers(ctx context.Context, agent string, opts store.ListOptions) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return names(ctx, s.db.Pool(), `SELECT follower FROM follows WHERE agent = $1 AND follower > $2 ORDER BY follower LIMIT $3`, agent, opts.After, opts.Limit)
}

// ListFollowing implements store.Store.
func (s *Store) ListFollowing(ctx context.Context, follower string, opts store.ListOptions) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return names(ctx, s.db.Pool(), `SELECT agent FROM follows WHERE follower = $1 AND agent > $2 ORDER BY agent LIMIT $3`, follower, opts.After, opts.Limit)
}

// IsFollowing implements store.Store.
func (s *Store) IsFollowing(ctx context.Context, follower, agent string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	return exists(ctx, s.db.Pool(), `SELECT 1 FROM follows WHERE follower = $1 AND agent = $2`, follower, agent)
}

// JoinClientGroup implements store.Store.
func (s *Store) JoinClientGroup(ctx context.Context, agent string) error {
	return s.clientGroup(ctx, agent, `INSERT INTO client_group_members (agent) VALUES ($1) ON CONFLICT DO NOTHING`)
}

// LeaveClientGroup implements store.Store.
func (s *Store) LeaveClientGroup(ctx context.Context, agent string) error {
	return s.clientGroup(ctx, agent, `DELETE FROM client_group_members WHERE agent = $1`)
}

// clientGroup runs sql on agent, which must exist.
func (s *Store) clientGroup(ctx context.Context, agent, sql string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.Update(ctx, func(tx pgx.Tx) error {
		if err := agentsExist(ctx, tx, agent); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, sql, agent)
		return err
	})
}

// ListClientGroupMembers implements store.Store.
func (s *Store) ListClientGroupMembers(ctx context.Context, client string, opts store.ListOptions) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	prefix := client + "/agents/"
	after := prefix + strings.TrimPrefix(opts.After, prefix)
	return names(ctx, s.db.Pool(), `SELECT agent FROM client_group_members WHERE starts_with(agent, $1) AND agent >= $2 AND ($3 = '' OR agent > $2)
ORDER BY agent LIMIT $4`, prefix, after, opts.After, opts.Limit)
}

// InClientGroup implements store.Store.
func (s *Store) InClientGroup(ctx context.Context, agent string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	return exists(ctx, s.db.Pool(), `SELECT 1 FROM client_group_members WHERE agent = $1`, agent)
}
