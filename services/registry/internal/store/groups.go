package store

import (
	"context"
	"strings"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
)

// Groups, their members, join requests and invites are read and changed
// through a GroupReader or GroupWriter that lives for one transaction
// (ViewGroups, UpdateGroups), so that a rule reading several of them (is
// the actor an admin? does the parent match?) and the change it allows are
// one atomic step, together with the notifications the change sends.
//
// Group paths are "client/name/..."; members and requests are listed in
// agent name order, an agent's memberships and invites in path order.
// Missing records are *resource.Error values matching ErrNotFound, of
// kind "group", "group member", "group join request" or "group invite".

// GroupReader reads groups inside one transaction. It must not be used
// after the function it was passed to returns.
type GroupReader interface {
	// AgentExists reports whether the agent is registered.
	AgentExists(agent string) (bool, error)
	// Group returns a group by path, or ErrNotFound.
	Group(path string) (*registryv1.Group, error)
	// Descendants returns every group under path (not path itself), in
	// path order.
	Descendants(path string) ([]*registryv1.Group, error)
	// Member returns agent's membership of the group, or ErrNotFound.
	Member(path, agent string) (*registryv1.GroupMember, error)
	// Members returns the group's members after opts.After (an agent
	// name), at most opts.Limit.
	Members(path string, opts ListOptions) ([]*registryv1.GroupMember, error)
	// EachMember calls fn for every member of the group, in agent order,
	// stopping at fn's first error, which it returns.
	EachMember(path string, fn func(*registryv1.GroupMember) error) error
	// AgentGroups returns agent's memberships after opts.After (a path),
	// at most opts.Limit.
	AgentGroups(agent string, opts ListOptions) ([]*registryv1.GroupMember, error)
	// JoinRequest returns agent's pending request to join the group, or
	// ErrNotFound.
	JoinRequest(path, agent string) (*registryv1.GroupJoinRequest, error)
	// JoinRequests returns the group's pending requests, at most limit.
	JoinRequests(path string, limit int) ([]*registryv1.GroupJoinRequest, error)
	// Invite returns agent's pending invite to the group, or ErrNotFound.
	Invite(path, agent string) (*registryv1.GroupInvite, error)
	// Invites returns agent's pending invites, at most limit.
	Invites(agent string, limit int) ([]*registryv1.GroupInvite, error)
	// IsFollowing reports whether follower follows agent.
	IsFollowing(follower, agent string) (bool, error)
	// InClientGroup reports whether agent is in its client's group.
	InClientGroup(agent string) (bool, error)
}

// GroupWriter changes groups inside one transaction: everything it
// writes commits together, or nothing does when the function fails.
type GroupWriter interface {
	GroupReader
	// PutGroup creates or replaces a group.
	PutGroup(g *registryv1.Group) error
	// PutMember creates or replaces a membership.
	PutMember(m *registryv1.GroupMember) error
	// DeleteMember removes a membership, if any.
	DeleteMember(path, agent string) error
	// PutJoinRequest creates or replaces a join request.
	PutJoinRequest(r *registryv1.GroupJoinRequest) error
	// DeleteJoinRequest removes a join request, if any.
	DeleteJoinRequest(path, agent string) error
	// PutInvite creates or replaces an invite.
	PutInvite(i *registryv1.GroupInvite) error
	// DeleteInvite removes an invite, if any.
	DeleteInvite(path, agent string) error
	// Notify appends n to the notification outbox, setting its Sequence
	// and, when empty, its Id and CreateTime.
	Notify(n *registryv1.Notification) error
}

// GroupStore is the part of Store that keeps groups and the notification
// outbox.
type GroupStore interface {
	// ViewGroups runs fn in one read transaction.
	ViewGroups(ctx context.Context, fn func(GroupReader) error) error
	// UpdateGroups runs fn in one write transaction, which commits durably
	// when fn returns nil and writes nothing when it fails; fn's error is
	// returned as is. fn may run more than once: it must set its results
	// afresh on every run.
	UpdateGroups(ctx context.Context, fn func(GroupWriter) error) error
	// SearchGroups returns the groups that are not restricted_private and
	// whose path, display name, description or agent description contain
	// opts.Query (see GroupMatches), in path order after opts.After, at
	// most opts.Limit.
	SearchGroups(ctx context.Context, opts ListOptions) ([]*registryv1.Group, error)
	// ListNotifications returns the outbox's notifications with a sequence
	// above after, at most limit, and the oldest sequence kept (0 when
	// the outbox has never held one).
	ListNotifications(ctx context.Context, after uint64, limit int) (notes []*registryv1.Notification, first uint64, err error)
	// TrimNotifications drops at most limit of the notifications up to
	// and including through, the oldest first, in one transaction, and
	// returns how many it dropped: fewer than limit when no more are due,
	// or (PostgreSQL) when the others are being changed at that moment.
	TrimNotifications(ctx context.Context, through uint64, limit int) (int, error)
}

// MaxOutbox is how many notifications the outbox keeps by default:
// appending one more drops the oldest, so an outbox nobody reads stays
// bounded.
const MaxOutbox = 1 << 20

// GroupMatches reports whether g's path, display name or one of its
// descriptions contains query, ignoring case. Backends use it to define
// SearchGroups.
func GroupMatches(g *registryv1.Group, query string) bool {
	q := strings.ToLower(query)
	for _, s := range []string{g.GetPath(), g.GetDisplayName(), g.GetDescription(), g.GetAgentDescription()} {
		if strings.Contains(strings.ToLower(s), q) {
			return true
		}
	}
	return false
}
