package pgstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/resource"
	"github.com/parleyhq/parley/services/registry/internal/store"
)

// groupTx is a GroupReader and GroupWriter over one transaction. Its
// methods take no context, so it keeps the one of the call that made it.
type groupTx struct {
	ctx context.Context //nolint:containedctx // lives for one transaction, as the interface asks
	tx  pgx.Tx
	s   *Store
}

// ViewGroups implements store.GroupStore.
func (s *Store) ViewGroups(ctx context.Context, fn func(store.GroupReader) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.View(ctx, func(tx pgx.Tx) error { return fn(&groupTx{ctx: ctx, tx: tx, s: s}) })
}

// UpdateGroups implements store.GroupStore.
func (s *Store) UpdateGroups(ctx context.Context, fn func(store.GroupWriter) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.Update(ctx, func(tx pgx.Tx) error { return fn(&groupTx{ctx: ctx, tx: tx, s: s}) })
}

func (g *groupTx) AgentExists(agent string) (bool, error) {
	return exists(g.ctx, g.tx, `SELECT 1 FROM agents WHERE name = $1`, agent)
}

func (g *groupTx) Group(path string) (*registryv1.Group, error) {
	return one(g.ctx, g.tx, &registryv1.Group{}, resource.NotFound("group", path), `SELECT data FROM groups WHERE path = $1`, path)
}

func (g *groupTx) Descendants(path string) ([]*registryv1.Group, error) {
	return many(g.ctx, g.tx, func() *registryv1.Group { return &registryv1.Group{} },
		`SELECT data FROM groups WHERE starts_with(path, $1) ORDER BY path`, path+"/")
}

func (g *groupTx) Member(path, agent string) (*registryv1.GroupMember, error) {
	return one(g.ctx, g.tx, &registryv1.GroupMember{}, resource.NotFound("group member", agent),
		`SELECT data FROM group_members WHERE path = $1 AND agent = $2`, path, agent)
}

func newMember() *registryv1.GroupMember { return &registryv1.GroupMember{} }

func (g *groupTx) Members(path string, opts store.ListOptions) ([]*registryv1.GroupMember, error) {
	return many(g.ctx, g.tx, newMember,
		`SELECT data FROM group_members WHERE path = $1 AND agent > $2 ORDER BY agent LIMIT $3`, path, opts.After, opts.Limit)
}

// EachMember reads the members first: fn may query the transaction.
func (g *groupTx) EachMember(path string, fn func(*registryv1.GroupMember) error) error {
	all, err := many(g.ctx, g.tx, newMember, `SELECT data FROM group_members WHERE path = $1 ORDER BY agent`, path)
	if err != nil {
		return err
	}
	for _, m := range all {
		if err := fn(m); err != nil {
			return err
		}
	}
	return nil
}

func (g *groupTx) AgentGroups(agent string, opts store.ListOptions) ([]*registryv1.GroupMember, error) {
	return many(g.ctx, g.tx, newMember,
		`SELECT data FROM group_members WHERE agent = $1 AND path > $2 ORDER BY path LIMIT $3`, agent, opts.After, opts.Limit)
}

func (g *groupTx) JoinRequest(path, agent string) (*registryv1.GroupJoinRequest, error) {
	return one(g.ctx, g.tx, &registryv1.GroupJoinRequest{}, resource.NotFound("group join request", agent),
		`SELECT data FROM group_join_requests WHERE path = $1 AND agent = $2`, path, agent)
}

func (g *groupTx) JoinRequests(path string, limit int) ([]*registryv1.GroupJoinRequest, error) {
	return many(g.ctx, g.tx, func() *registryv1.GroupJoinRequest { return &registryv1.GroupJoinRequest{} },
		`SELECT data FROM group_join_requests WHERE path = $1 ORDER BY agent LIMIT $2`, path, limit)
}

func (g *groupTx) Invite(path, agent string) (*registryv1.GroupInvite, error) {
	return one(g.ctx, g.tx, &registryv1.GroupInvite{}, resource.NotFound("group invite", agent),
		`SELECT data FROM group_invites WHERE agent = $1 AND path = $2`, agent, path)
}

func (g *groupTx) Invites(agent string, limit int) ([]*registryv1.GroupInvite, error) {
	return many(g.ctx, g.tx, func() *registryv1.GroupInvite { return &registryv1.GroupInvite{} },
		`SELECT data FROM group_invites WHERE agent = $1 ORDER BY path LIMIT $2`, agent, limit)
}

func (g *groupTx) IsFollowing(follower, agent string) (bool, error) {
	return exists(g.ctx, g.tx, `SELECT 1 FROM follows WHERE follower = $1 AND agent = $2`, follower, agent)
}

func (g *groupTx) InClientGroup(agent string) (bool, error) {
	return exists(g.ctx, g.tx, `SELECT 1 FROM client_group_members WHERE agent = $1`, agent)
}

// upsert stores m under the key columns of table.
func (g *groupTx) upsert(sql string, m proto.Message, keys ...any) error {
	val, err := proto.Marshal(m)
	if err != nil {
		return err
	}
	_, err = g.tx.Exec(g.ctx, sql, append(keys, val)...)
	return err
}

func (g *groupTx) PutGroup(gr *registryv1.Group) error {
	return g.upsert(`INSERT INTO groups (path, data) VALUES ($1, $2) ON CONFLICT (path) DO UPDATE SET data = excluded.data`, gr, gr.GetPath())
}

func (g *groupTx) PutMember(m *registryv1.GroupMember) error {
	return g.upsert(`INSERT INTO group_members (path, agent, data) VALUES ($1, $2, $3) ON CONFLICT (path, agent) DO UPDATE SET data = excluded.data`,
		m, m.GetGroup(), m.GetAgent())
}

func (g *groupTx) DeleteMember(path, agent string) error {
	_, err := g.tx.Exec(g.ctx, `DELETE FROM group_members WHERE path = $1 AND agent = $2`, path, agent)
	return err
}

func (g *groupTx) PutJoinRequest(r *registryv1.GroupJoinRequest) error {
	return g.upsert(`INSERT INTO group_join_requests (path, agent, data) VALUES ($1, $2, $3) ON CONFLICT (path, agent) DO UPDATE SET data = excluded.data`,
		r, r.GetGroup(), r.GetAgent())
}

func (g *groupTx) DeleteJoinRequest(path, agent string) error {
	_, err := g.tx.Exec(g.ctx, `DELETE FROM group_join_requests WHERE path = $1 AND agent = $2`, path, agent)
	return err
}

func (g *groupTx) PutInvite(i *registryv1.GroupInvite) error {
	return g.upsert(`INSERT INTO group_invites (agent, path, data) VALUES ($1, $2, $3) ON CONFLICT (agent, path) DO UPDATE SET data = excluded.data`,
		i, i.GetAgent(), i.GetGroup())
}

func (g *groupTx) DeleteInvite(path, agent string) error {
	_, err := g.tx.Exec(g.ctx, `DELETE FROM group_invites WHERE agent = $1 AND path = $2`, agent, path)
	return err
}

func (g *groupTx) Notify(n *registryv1.Notification) error { return g.s.notify(g.ctx, g.tx, n) }

// notify appends n to the outbox in tx, with the next sequence from
// outbox_seq (so sequences commit in order, without gaps), and drops what
// falls beyond the outbox limit.
func (s *Store) notify(ctx context.Context, tx pgx.Tx, n *registryv1.Notification) error {
	maxNotes := s.maxOutbox
	if maxNotes <= 0 {
		maxNotes = store.MaxOutbox
	}
	var seq int64
	if err := tx.QueryRow(ctx, `UPDATE outbox_seq SET n = n + 1 WHERE id = 1 RETURNING n`).Scan(&seq); err != nil {
		return err
	}
	n.Sequence = uint64(seq)
	if n.GetId() == "" {
		var id [16]byte
		_, _ = rand.Read(id[:]) // never fails (crypto/rand)
		n.Id = "ntf-" + hex.EncodeToString(id[:])
	}
	if n.GetCreateTime() == nil {
		n.CreateTime = timestamppb.New(time.Now())
	}
	val, err := proto.Marshal(n)
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO notification_outbox (seq, data) VALUES ($1, $2)`, seq, val); err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `DELETE FROM notification_outbox WHERE seq <= $1`, seq-int64(maxNotes))
	return err
}

// SearchGroups implements store.GroupStore. The filter runs here
// (store.GroupMatches), so rows are read until the page is full.
func (s *Store) SearchGroups(ctx context.Context, opts store.ListOptions) ([]*registryv1.Group, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	rows, err := s.db.Pool().Query(ctx, `SELECT data FROM groups WHERE path > $1 ORDER BY path`, opts.After)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*registryv1.Group
	for len(out) < opts.Limit && rows.Next() {
		var data []byte
		if err := rows.Scan(&data); err != nil {
			return nil, err
		}
		g, err := resource.Decode(data, &registryv1.Group{})
		if err != nil {
			return nil, err
		}
		if g.GetAccess() != registryv1.GroupAccess_GROUP_ACCESS_RESTRICTED_PRIVATE && store.GroupMatches(g, opts.Query) {
			out = append(out, g)
		}
	}
	rows.Close()
	return out, rows.Err()
}

// ListNotifications implements store.GroupStore.
func (s *Store) ListNotifications(ctx context.Context, after uint64, limit int) ([]*registryv1.Notification, uint64, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	var (
		out   []*registryv1.Notification
		first int64
	)
	err := s.db.View(ctx, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT coalesce(min(seq), 0) FROM notification_outbox`).Scan(&first); err != nil {
			return err
		}
		var err error
		out, err = many(ctx, tx, func() *registryv1.Notification { return &registryv1.Notification{} },
			`SELECT data FROM notification_outbox WHERE seq > $1 ORDER BY seq LIMIT $2`, int64(after), limit) //nolint:gosec // sequences fit in int64
		return err
	})
	return out, uint64(first), err //nolint:gosec // never negative
}

// TrimNotifications implements store.GroupStore: one DELETE of the oldest
// rows through the primary key, skipping rows another transaction holds.
func (s *Store) TrimNotifications(ctx context.Context, through uint64, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	tag, err := s.db.Pool().Exec(ctx, `DELETE FROM notification_outbox WHERE seq IN (
  SELECT seq FROM notification_outbox WHERE seq <= $1 ORDER BY seq LIMIT $2 FOR UPDATE SKIP LOCKED)`, int64(through), limit) //nolint:gosec // sequences fit in int64
	if err != nil {
		return 0, err
	}
	return int(tag.RowsAffected()), nil
}
