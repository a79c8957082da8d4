// Package store is the negotiator's persistence contract: the cost ledger
// and its running totals, cached suitability verdicts, negotiations with
// their transcripts, and routine candidates. Backends live in sub-packages
// and pass storetest.
package store

import (
	"context"

	negotiatorv1 "github.com/parleyhq/parley/gen/parley/negotiator/v1"
	"github.com/parleyhq/parley/platform/resource"
)

// Sentinel errors; backends wrap them.
var (
	// ErrNotFound is matched by every *resource.Error the store
	// returns; they carry the kind ("negotiation") and the name.
	ErrNotFound      = resource.ErrNotFound
	ErrAlreadyExists = resource.ErrAlreadyExists
)

// LedgerFilter selects ledger entries; empty fields match everything.
type LedgerFilter struct {
	Agent string
	Role  string
}

// Store is the negotiator's storage.
type Store interface {
	// Ping reports whether the store is usable.
	Ping(ctx context.Context) error
	// Close releases the store.
	Close() error

	// AppendLedgerEntry stores e under a new name ledgerEntries/{16 hex},
	// increasing with every call, and adds its calls, tokens and cost to
	// the running totals under each of totalKeys, in the same transaction.
	// It returns the stored entry.
	AppendLedgerEntry(ctx context.Context, e *negotiatorv1.LedgerEntry, totalKeys []string) (*negotiatorv1.LedgerEntry, error)
	// ListLedgerEntries returns up to limit entries matching f with names
	// after the name after (all when empty), oldest first, and the name to
	// resume after, empty when there are no more.
	ListLedgerEntries(ctx context.Context, f LedgerFilter, after string, limit int) ([]*negotiatorv1.LedgerEntry, string, error)
	// Totals returns the running totals under key; zero when none.
	Totals(ctx context.Context, key string) (*negotiatorv1.CostSummary, error)

	// GetVerdict returns the cached verdict under key, or ErrNotFound.
	GetVerdict(ctx context.Context, key string) (*negotiatorv1.SuitabilityVerdict, error)
	// PutVerdict caches v under key, replacing any previous verdict.
	PutVerdict(ctx context.Context, key string, v *negotiatorv1.SuitabilityVerdict) error

	// CreateNegotiation stores n under n.Name, or fails with
	// ErrAlreadyExists.
	CreateNegotiation(ctx context.Context, n *negotiatorv1.Negotiation) error
	// GetNegotiation returns a negotiation, or ErrNotFound.
	GetNegotiation(ctx context.Context, name string) (*negotiatorv1.Negotiation, error)
	// UpdateNegotiation reads a negotiation, lets mutate change it and
	// writes it back, all in one transaction. If mutate fails nothing is
	// written and its error is returned as is.
	UpdateNegotiation(ctx context.Context, name string, mutate func(*negotiatorv1.Negotiation) error) (*negotiatorv1.Negotiation, error)

	// PutRoutineCandidate stores c under c.Name, replacing any candidate
	// of that name.
	PutRoutineCandidate(ctx context.Context, c *negotiatorv1.RoutineCandidate) error
	// GetRoutineCandidate returns a candidate, or ErrNotFound.
	GetRoutineCandidate(ctx context.Context, name string) (*negotiatorv1.RoutineCandidate, error)
	// UpdateRoutineCandidate is the read-modify-write of a candidate, like
	// UpdateNegotiation.
	UpdateRoutineCandidate(ctx context.Context, name string, mutate func(*negotiatorv1.RoutineCandidate) error) (*negotiatorv1.RoutineCandidate, error)
}
