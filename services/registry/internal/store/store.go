// Package store defines the registry's storage contract. Backends live in
// sub-packages (boltstore); handlers see only this interface. Every backend
// passes the storetest conformance suite.
//
// Protocols are content-addressed and immutable: keyed by SHA-1, indexed by
// SHA-256 too, never replaced. Agents are keyed by resource name
// (clients/{client}/agents/{agent}) and changed only through UpdateAgent.
//
// Request ids (AIP-155): a non-empty requestID passed to an agent write is
// an opaque key the caller makes unique per operation. The first
// successful write records it with its result in the write's own
// transaction; a later write with a recorded requestID changes nothing and
// returns the recorded result, even if the agent has changed or gone since.
// Failed writes record nothing. Records last until SweepRequests drops
// them.
package store

import (
	"context"
	"errors"
	"strings"
	"time"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/resource"
	"github.com/parleyhq/parley/services/registry/internal/pd"
)

// Sentinel errors; backends wrap them.
var (
	// ErrNotFound is matched by every *resource.Error the store
	// returns; they carry the kind ("agent", "protocol") and the name.
	ErrNotFound      = resource.ErrNotFound
	ErrAlreadyExists = resource.ErrAlreadyExists
	// ErrConflict reports a protocol whose SHA-1 is already stored for
	// different bytes (a SHA-1 collision): the stored one is kept.
	ErrConflict = errors.New("sha-1 collision with a stored protocol")
	// ErrTooManyKeys reports a key beyond MaxKeys for one owner.
	ErrTooManyKeys = errors.New("too many keys")
)

// MaxKeys is the most live keys a client or an agent may hold.
const MaxKeys = 20

// StoredKey is a key as the store keeps it: the resource, whose Secret is
// always empty, plus its id and the SHA-256 of the secret. Secrets are
// never stored.
type StoredKey struct {
	Key  *registryv1.Key
	ID   string
	Hash [32]byte
}

// ListOptions select a page of a list.
type ListOptions struct {
	// After is the key the page starts after: a protocol's lowercase SHA-1
	// hex, or an agent's resource name. Empty starts at the beginning.
	After string
	// Limit is the most items returned; it must be positive.
	Limit int
	// Query, for protocols, keeps only those whose title, description or a
	// tag contains it, case-insensitively (see Matches). Empty keeps all.
	Query string
	// Client, for agents, keeps only that client's agents. Empty keeps all.
	Client string
}

// Store is the registry's persistent state.
type Store interface {
	// Ping reports whether the store is open and usable.
	Ping(ctx context.Context) error
	// Close releases the store. Calls after Close fail.
	Close() error

	// CreateProtocol stores p, whose Content, Name, Sha1Hex, Sha256Hex and
	// every other field the caller filled are kept as given. If its SHA-1 is
	// already stored with the same SHA-256, nothing changes and the stored
	// protocol is returned with created false. With another SHA-256 it fails
	// with ErrConflict. Storing is atomic: content and both indexes, or none.
	CreateProtocol(ctx context.Context, p *registryv1.Protocol) (stored *registryv1.Protocol, created bool, err error)
	// GetProtocol returns a protocol with its content, or ErrNotFound.
	GetProtocol(ctx context.Context, sha1 pd.Hash) (*registryv1.Protocol, error)
	// ListProtocols returns protocols without content in SHA-1 order.
	ListProtocols(ctx context.Context, opts ListOptions) ([]*registryv1.Protocol, error)

	// CreateAgent stores a, stamping its etag, and its first key when key
	// is not nil, or fails with ErrAlreadyExists when its name is taken.
	// See the package comment for requestID: a repeat stores no key.
	CreateAgent(ctx context.Context, a *registryv1.Agent, key *StoredKey, requestID string) (*registryv1.Agent, error)
	// GetAgent returns an agent by resource name, or ErrNotFound.
	GetAgent(ctx context.Context, name string) (*registryv1.Agent, error)
	// ListAgents returns agents in name order.
	ListAgents(ctx context.Context, opts ListOptions) ([]*registryv1.Agent, error)
	// DeleteAgent removes an agent and its keys, or fails with ErrNotFound.
	DeleteAgent(ctx context.Context, name string) error
	// UpdateAgent runs mutate on the stored agent inside one transaction and
	// stores the result with a new etag. If mutate fails, nothing is written
	// and its error is returned as is. The name cannot change. See
	// the package comment for requestID.
	UpdateAgent(ctx context.Context, name, requestID string, mutate func(*registryv1.Agent) error) (*registryv1.Agent, error)
	// CreateClient stores c and its first key, or fails with
	// ErrAlreadyExists when its name is taken.
	CreateClient(ctx context.Context, c *registryv1.Client, key StoredKey) (*registryv1.Client, error)
	// GetClient returns a client by resource name, or ErrNotFound.
	GetClient(ctx context.Context, name string) (*registryv1.Client, error)
	// ListClients returns clients in name order.
	ListClients(ctx context.Context, opts ListOptions) ([]*registryv1.Client, error)

	// CreateKey stores a key. Its owner (the client or agent its name is
	// under) must exist, else ErrNotFound; an owner holding MaxKeys keys
	// gets ErrTooManyKeys.
	CreateKey(ctx context.Context, k StoredKey) error
	// ListKeys returns the keys of an owner (clients/{client} or
	// clients/{client}/agents/{agent}), oldest first. An owner without
	// keys, or missing, has none.
	ListKeys(ctx context.Context, parent string) ([]*registryv1.Key, error)
	// DeleteKey removes a key by resource name, or fails with ErrNotFound.
	DeleteKey(ctx context.Context, name string) error
	// RotateKey removes the key named old and stores k, which must have
	// the same owner, in one transaction; ErrNotFound when old is missing.
	RotateKey(ctx context.Context, old string, k StoredKey) error
	// GetKeyByID returns a key by its id, or ErrNotFound.
	GetKeyByID(ctx context.Context, id string) (StoredKey, error)

	// Follow records that follower follows agent; both must exist, else
	// ErrNotFound naming the missing one. Following again changes nothing
	// and returns created false. A new follow appends a `followed`
	// notification for agent to the outbox in the same transaction.
	Follow(ctx context.Context, follower, agent string) (created bool, err error)
	// Unfollow removes the follow, if any, and then appends an
	// `unfollowed` notification for agent in the same transaction. The
	// follower must exist, else ErrNotFound.
	Unfollow(ctx context.Context, follower, agent string) error
	// ListFollowers returns the names of the agents following agent, in
	// name order, starting after opts.After.
	ListFollowers(ctx context.Context, agent string, opts ListOptions) ([]string, error)
	// ListFollowing returns the names of the agents follower follows, in
	// name order, starting after opts.After.
	ListFollowing(ctx context.Context, follower string, opts ListOptions) ([]string, error)
	// IsFollowing reports whether follower follows agent.
	IsFollowing(ctx context.Context, follower, agent string) (bool, error)
	// JoinClientGroup makes agent a member of its client's group; it must
	// exist, else ErrNotFound. Joining again changes nothing.
	JoinClientGroup(ctx context.Context, agent string) error
	// LeaveClientGroup removes agent from its client's group, if a member;
	// it must exist, else ErrNotFound.
	LeaveClientGroup(ctx context.Context, agent string) error
	// ListClientGroupMembers returns the members of client's group
	// (clients/{client}), in name order, starting after opts.After.
	ListClientGroupMembers(ctx context.Context, client string, opts ListOptions) ([]string, error)
	// InClientGroup reports whether agent is a member of its client's
	// group.
	InClientGroup(ctx context.Context, agent string) (bool, error)
	// DeleteAgent (above) also removes the agent's follows, both ways, its
	// client-group membership, its group memberships, join requests and
	// invites.

	GroupStore

	// SweepRequests forgets at most limit of the request ids recorded
	// before t, the oldest first, in one transaction, and returns how many
	// it dropped: fewer than limit when no more are due, or (PostgreSQL)
	// when the others due are being changed at that moment. It reads only
	// what it drops.
	SweepRequests(ctx context.Context, before time.Time, limit int) (int, error)
}

// Matches reports whether p's title, description or one of its tags
// contains query, ignoring case. Backends use it to define Query.
func Matches(p *registryv1.Protocol, query string) bool {
	q := strings.ToLower(query)
	if strings.Contains(strings.ToLower(p.GetTitle()), q) || strings.Contains(strings.ToLower(p.GetDescription()), q) {
		return true
	}
	for _, t := range p.GetTags() {
		if strings.Contains(strings.ToLower(t), q) {
			return true
		}
	}
	return false
}

// KeyParent returns the owner of the key named name: the part before
// "/keys/{key}", or "" when name has no such part.
func KeyParent(name string) string {
	i := strings.LastIndex(name, "/keys/")
	if i < 0 {
		return ""
	}
	return name[:i]
}

// AgentPrefix returns the key prefix of client's agents.
func AgentPrefix(client string) string { return "clients/" + client + "/agents/" }
