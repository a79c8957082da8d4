package boltstore

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/boltdb"
	"github.com/parleyhq/parley/platform/resource"
	"github.com/parleyhq/parley/services/registry/internal/store"
)

// groupTx implements store.GroupWriter over one bbolt transaction.
type groupTx struct {
	tx       *boltdb.Tx
	maxNotes int
}

// ViewGroups implements store.Store.
func (s *Store) ViewGroups(ctx context.Context, fn func(store.GroupReader) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.View(func(tx *boltdb.Tx) error { return fn(&groupTx{tx: tx}) })
}

// UpdateGroups implements store.Store.
func (s *Store) UpdateGroups(ctx context.Context, fn func(store.GroupWriter) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.Update(func(tx *boltdb.Tx) error { return fn(&groupTx{tx: tx, maxNotes: s.maxOutbox}) })
}

// SetOutboxLimit changes how many notifications the outbox keeps
// (store.MaxOutbox by default); the oldest go first.
func (s *Store) SetOutboxLimit(n int) { s.maxOutbox = n }

func (g *groupTx) AgentExists(agent string) (bool, error) {
	return g.tx.Bucket(bucketAgents).Get([]byte(agent)) != nil, nil
}

func (g *groupTx) Group(path string) (*registryv1.Group, error) {
	v := g.tx.Bucket(bucketGroups).Get([]byte(path))
	if v == nil {
		return nil, resource.NotFound("group", path)
	}
	return resource.Decode(v, &registryv1.Group{})
}

func (g *groupTx) Descendants(path string) ([]*registryv1.Group, error) {
	var out []*registryv1.Group
	prefix := []byte(path + "/")
	c := g.tx.Bucket(bucketGroups).Cursor()
	for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
		d, err := resource.Decode(v, &registryv1.Group{})
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}

func (g *groupTx) Member(path, agent string) (*registryv1.GroupMember, error) {
	v := g.tx.Bucket(bucketGroupMembers).Get(edge(path, agent))
	if v == nil {
		return nil, resource.NotFound("group member", agent)
	}
	return resource.Decode(v, &registryv1.GroupMember{})
}

func (g *groupTx) Members(path string, opts store.ListOptions) ([]*registryv1.GroupMember, error) {
	return scanValues(g.tx.Bucket(bucketGroupMembers), path, opts, func() *registryv1.GroupMember { return &registryv1.GroupMember{} })
}

func (g *groupTx) EachMember(path string, fn func(*registryv1.GroupMember) error) error {
	all := store.ListOptions{Limit: int(^uint(0) >> 1)}
	return walkPrefix(g.tx.Bucket(bucketGroupMembers), []byte(path+edgeSep), all, func(_, v []byte) error {
		m, err := resource.Decode(v, &registryv1.GroupMember{})
		if err != nil {
			return err
		}
		return fn(m)
	})
}

func (g *groupTx) AgentGroups(agent string, opts store.ListOptions) ([]*registryv1.GroupMember, error) {
	return scanValues(g.tx.Bucket(bucketAgentGroups), agent, opts, func() *registryv1.GroupMember { return &registryv1.GroupMember{} })
}

func (g *groupTx) JoinRequest(path, agent string) (*registryv1.GroupJoinRequest, error) {
	v := g.tx.Bucket(bucketJoinRequests).Get(edge(path, agent))
	if v == nil {
		return nil, resource.NotFound("group join request", agent)
	}
	return resource.Decode(v, &registryv1.GroupJoinRequest{})
}

func (g *groupTx) JoinRequests(path string, limit int) ([]*registryv1.GroupJoinRequest, error) {
	return scanValues(g.tx.Bucket(bucketJoinRequests), path, store.ListOptions{Limit: limit}, func() *registryv1.GroupJoinRequest { return &registryv1.GroupJoinRequest{} })
}

func (g *groupTx) Invite(path, agent string) (*registryv1.GroupInvite, error) {
	v := g.tx.Bucket(bucketInvites).Get(edge(agent, path))
	if v == nil {
		return nil, resource.NotFound("group invite", agent)
	}
	return resource.Decode(v, &registryv1.GroupInvite{})
}

func (g *groupTx) Invites(agent string, limit int) ([]*registryv1.GroupInvite, error) {
	return scanValues(g.tx.Bucket(bucketInvites), agent, store.ListOptions{Limit: limit}, func() *registryv1.GroupInvite { return &registryv1.GroupInvite{} })
}

func (g *groupTx) IsFollowing(follower, agent string) (bool, error) {
	return g.tx.Bucket(bucketFollowing).Get(edge(follower, agent)) != nil, nil
}

func (g *groupTx) InClientGroup(agent string) (bool, error) {
	return g.tx.Bucket(bucketClientGroups).Get([]byte(agent)) != nil, nil
}

func (g *groupTx) PutGroup(gr *registryv1.Group) error {
	return put(g.tx.Bucket(bucketGroups), []byte(gr.GetPath()), gr)
}

func (g *groupTx) PutMember(m *registryv1.GroupMember) error {
	if err := put(g.tx.Bucket(bucketGroupMembers), edge(m.GetGroup(), m.GetAgent()), m); err != nil {
		return err
	}
	return put(g.tx.Bucket(bucketAgentGroups), edge(m.GetAgent(), m.GetGroup()), m)
}

func (g *groupTx) DeleteMember(path, agent string) error {
	if err := g.tx.Bucket(bucketGroupMembers).Delete(edge(path, agent)); err != nil {
		return err
	}
	return g.tx.Bucket(bucketAgentGroups).Delete(edge(agent, path))
}

func (g *groupTx) PutJoinRequest(r *registryv1.GroupJoinRequest) error {
	return put(g.tx.Bucket(bucketJoinRequests), edge(r.GetGroup(), r.GetAgent()), r)
}

func (g *groupTx) DeleteJoinRequest(path, agent string) error {
	return g.tx.Bucket(bucketJoinRequests).Delete(edge(path, agent))
}

func (g *groupTx) PutInvite(i *registryv1.GroupInvite) error {
	return put(g.tx.Bucket(bucketInvites), edge(i.GetAgent(), i.GetGroup()), i)
}

func (g *groupTx) DeleteInvite(path, agent string) error {
	return g.tx.Bucket(bucketInvites).Delete(edge(agent, path))
}

func (g *groupTx) Notify(n *registryv1.Notification) error {
	return notify(g.tx, n, g.maxNotes)
}

// notify appends n to the outbox under the bucket's next sequence and
// drops the oldest entries beyond maxNotes (store.MaxOutbox when 0).
func notify(tx *boltdb.Tx, n *registryv1.Notification, maxNotes int) error {
	if maxNotes <= 0 {
		maxNotes = store.MaxOutbox
	}
	b := tx.Bucket(bucketOutbox)
	seq, err := b.NextSequence()
	if err != nil {
		return err
	}
	n.Sequence = seq
	if n.GetId() == "" {
		var id [16]byte
		_, _ = rand.Read(id[:]) // never fails (crypto/rand)
		n.Id = "ntf-" + hex.EncodeToString(id[:])
	}
	if n.GetCreateTime() == nil {
		n.CreateTime = timestamppb.New(time.Now())
	}
	if err := put(b, seqKey(seq), n); err != nil {
		return err
	}
	// Keys are sequences, so entries older than seq-maxNotes+1 go, at most
	// two per append (enough to shrink after a lowered limit, eventually).
	c := b.Cursor()
	var old [][]byte
	for k, _ := c.First(); k != nil && len(old) < 2 && binary.BigEndian.Uint64(k)+uint64(maxNotes) <= seq; k, _ = c.Next() {
		old = append(old, bytes.Clone(k))
	}
	for _, k := range old {
		if err := b.Delete(k); err != nil {
			return err
		}
	}
	return nil
}

func seqKey(seq uint64) []byte { return binary.BigEndian.AppendUint64(nil, seq) }

// SearchGroups implements store.Store: a scan of every group, which the
// 350-result bound of the API keeps short per call.
func (s *Store) SearchGroups(ctx context.Context, opts store.ListOptions) ([]*registryv1.Group, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var out []*registryv1.Group
	err := s.db.View(func(tx *boltdb.Tx) error {
		c := tx.Bucket(bucketGroups).Cursor()
		k, v := c.First()
		if opts.After != "" {
			if k, v = c.Seek([]byte(opts.After)); k != nil && string(k) == opts.After {
				k, v = c.Next()
			}
		}
		for ; k != nil && len(out) < opts.Limit; k, v = c.Next() {
			g, err := resource.Decode(v, &registryv1.Group{})
			if err != nil {
				return err
			}
			if g.GetAccess() != registryv1.GroupAccess_GROUP_ACCESS_RESTRICTED_PRIVATE && store.GroupMatches(g, opts.Query) {
				out = append(out, g)
			}
		}
		return nil
	})
	return out, err
}

// ListNotifications implements store.Store.
func (s *Store) ListNotifications(ctx context.Context, after uint64, limit int) ([]*registryv1.Notification, uint64, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	var (
		out   []*registryv1.Notification
		first uint64
	)
	err := s.db.View(func(tx *boltdb.Tx) error {
		c := tx.Bucket(bucketOutbox).Cursor()
		if k, _ := c.First(); k != nil {
			first = binary.BigEndian.Uint64(k)
		}
		for k, v := c.Seek(seqKey(after + 1)); k != nil && len(out) < limit; k, v = c.Next() {
			n, err := resource.Decode(v, &registryv1.Notification{})
			if err != nil {
				return err
			}
			out = append(out, n)
		}
		return nil
	})
	return out, first, err
}

// TrimNotifications implements store.Store.
func (s *Store) TrimNotifications(ctx context.Context, through uint64, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	n := 0
	err := s.db.Update(func(tx *boltdb.Tx) error {
		b := tx.Bucket(bucketOutbox)
		var old [][]byte // collected first: never delete while walking a cursor
		c := b.Cursor()
		for k, _ := c.First(); k != nil && binary.BigEndian.Uint64(k) <= through && len(old) < limit; k, _ = c.Next() {
			old = append(old, bytes.Clone(k))
		}
		for _, k := range old {
			if err := b.Delete(k); err != nil {
				return err
			}
		}
		n = len(old)
		return nil
	})
	return n, err
}

// scanValues decodes the values of the keys "from NUL x" after
// "from NUL opts.After", at most opts.Limit.
func scanValues[T proto.Message](b *boltdb.Bucket, from string, opts store.ListOptions, newT func() T) ([]T, error) {
	var out []T
	err := walkPrefix(b, []byte(from+edgeSep), opts, func(_, v []byte) error {
		m, err := resource.Decode(v, newT())
		out = append(out, m)
		return err
	})
	return out, err
}

func put(b *boltdb.Bucket, key []byte, m proto.Message) error {
	v, err := proto.Marshal(m)
	if err != nil {
		return err
	}
	return b.Put(key, v)
}

// deleteGroupRecords removes agent's memberships, invites and join
// requests, inside the transaction deleting the agent.
func deleteGroupRecords(tx *boltdb.Tx, agent string) error {
	all := store.ListOptions{Limit: int(^uint(0) >> 1)}
	g := &groupTx{tx: tx}
	for _, path := range scanPrefix(tx.Bucket(bucketAgentGroups), []byte(agent+edgeSep), all) {
		if err := g.DeleteMember(path, agent); err != nil {
			return err
		}
	}
	invites := tx.Bucket(bucketInvites)
	for _, path := range scanPrefix(invites, []byte(agent+edgeSep), all) {
		if err := invites.Delete(edge(agent, path)); err != nil {
			return err
		}
	}
	// Requests are keyed by group first: find this agent's by a scan.
	requests := tx.Bucket(bucketJoinRequests)
	var mine [][]byte
	suffix := []byte(edgeSep + agent)
	if err := requests.ForEach(func(k, _ []byte) error {
		if bytes.HasSuffix(k, suffix) {
			mine = append(mine, bytes.Clone(k))
		}
		return nil
	}); err != nil {
		return err
	}
	for _, k := range mine {
		if err := requests.Delete(k); err != nil {
			return err
		}
	}
	return nil
}
