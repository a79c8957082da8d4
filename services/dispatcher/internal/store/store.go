// Package store defines the dispatcher's storage contract. Backends live in
// sub-packages (boltstore); handlers see only this interface.
package store

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/platform/resource"
)

// Sentinel errors. Backends return *resource.Error values for the first two,
// which carry the resource's kind ("routine", "conversation") and name.
var (
	ErrNotFound      = resource.ErrNotFound
	ErrAlreadyExists = resource.ErrAlreadyExists
	// ErrLimit: a peer already holds its maximum of open conversations.
	ErrLimit = errors.New("limit reached")
)

// Conversation is a multiround Agora conversation of one hosted agent with
// one peer.
type Conversation struct {
	ID    string `json:"id"`
	Agent string `json:"agent"` // clients/{c}/agents/{a}
	Peer  string `json:"peer"`  // the caller it is bound to
	// ProtocolHash is the conversation's protocol, 40 hex; "" for natural
	// language.
	ProtocolHash string `json:"protocolHash,omitempty"`
	// Memory is the routine's memory, a JSON object.
	Memory     json.RawMessage `json:"memory,omitempty"`
	CreateTime time.Time       `json:"createTime"`
	ExpireTime time.Time       `json:"expireTime"`
}

// SendCount counts conversations an agent started for one (task, target).
type SendCount struct {
	Task          string
	TargetURL     string
	Conversations int64
	WithProtocol  int64
}

// Store is the dispatcher's persistent state. Every method checks ctx first.
type Store interface {
	// Ping reports whether the store is open and usable.
	Ping(ctx context.Context) error
	// Close releases the store. Calls after Close fail.
	Close() error

	// SetRoutine stores source as the next version of the routine name
	// (version 1 when new), active with no failures, and returns it.
	SetRoutine(ctx context.Context, name, source string, now time.Time) (*dispatcherv1.Routine, error)
	// GetRoutine returns the current version; ErrNotFound when absent.
	GetRoutine(ctx context.Context, name string) (*dispatcherv1.Routine, error)
	// ListRoutines returns up to limit routines of agent parent whose names
	// sort after after, in name order.
	ListRoutines(ctx context.Context, parent, after string, limit int) ([]*dispatcherv1.Routine, error)
	// RecordRoutineRun records one run of version of name: runErr "" is a
	// success, which clears the failure count; otherwise the count grows,
	// runErr and kind become the last failure, and reaching quarantineAfter
	// quarantines the routine. A run of an older version is ignored. It
	// returns the routine as stored.
	RecordRoutineRun(ctx context.Context, name string, version int64, runErr string, kind dispatcherv1.RoutineFailureKind, quarantineAfter int) (*dispatcherv1.Routine, error)

	// SetTool stores t (replacing a tool of the same name) and returns it.
	SetTool(ctx context.Context, t *dispatcherv1.Tool, now time.Time) (*dispatcherv1.Tool, error)
	// ListTools returns the tools of agent parent in name order.
	ListTools(ctx context.Context, parent string) ([]*dispatcherv1.Tool, error)

	// CreateConversation stores c unless c.Peer already has maxPerPeer
	// conversations that have not expired at now (ErrLimit).
	CreateConversation(ctx context.Context, c Conversation, maxPerPeer int, now time.Time) error
	// GetConversation returns a conversation, expired or not; ErrNotFound
	// when absent.
	GetConversation(ctx context.Context, id string) (Conversation, error)
	// UpdateConversation applies mutate in one transaction; if mutate fails
	// nothing is written and its error is returned.
	UpdateConversation(ctx context.Context, id string, mutate func(*Conversation) error) error
	// DeleteConversation removes a conversation; ErrNotFound when absent.
	DeleteConversation(ctx context.Context, id string) error
	// SweepConversations removes at most limit of the conversations that
	// expired before before, the earliest first, in one transaction, and
	// returns how many it removed: fewer than limit when no more are due,
	// or (PostgreSQL) when the others due are being changed at that
	// moment. It reads only what it removes.
	SweepConversations(ctx context.Context, before time.Time, limit int) (int, error)

	// CountSend adds one conversation to (agent, task, target).
	CountSend(ctx context.Context, agent, task, target string, withProtocol bool) error
	// ListSendCounts returns agent's counts in (task, target) order.
	ListSendCounts(ctx context.Context, agent string) ([]SendCount, error)
}
