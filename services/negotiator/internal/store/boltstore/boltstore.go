// Package boltstore is the negotiator's embedded bbolt backend: one file,
// negotiator.db, in the data directory.
package boltstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"google.golang.org/protobuf/proto"

	negotiatorv1 "github.com/parleyhq/parley/gen/parley/negotiator/v1"
	"github.com/parleyhq/parley/platform/boltdb"
	"github.com/parleyhq/parley/platform/resource"
	"github.com/parleyhq/parley/services/negotiator/internal/store"
)

// FileName is the database file inside the data directory.
const FileName = "negotiator.db"

// Buckets, created by Open (platform/boltdb adds "meta" for schema_version).
var (
	// bucketLedger maps ledgerEntries/{16 hex} to a LedgerEntry; the hex id
	// comes from the bucket's sequence, so keys sort by time.
	bucketLedger = []byte("ledger")
	// bucketTotals maps a totals key (chosen by the ledger package) to a
	// CostSummary.
	bucketTotals = []byte("totals")
	// bucketVerdicts maps a verdict cache key to a SuitabilityVerdict.
	bucketVerdicts = []byte("verdicts")
	// bucketNegotiations maps negotiations/{id} to a Negotiation.
	bucketNegotiations = []byte("negotiations")
	// bucketCandidates maps routineCandidates/{id} to a RoutineCandidate.
	bucketCandidates = []byte("routine_candidates")
)

var allBuckets = [][]byte{bucketLedger, bucketTotals, bucketVerdicts, bucketNegotiations, bucketCandidates}

const schemaVersion = 1

// Store is the bbolt-backed store.
type Store struct {
	db *boltdb.DB
}

var _ store.Store = (*Store)(nil)

// Open opens (creating if needed) the database in dir. If another process
// holds the file, it fails after lockTimeout instead of waiting forever.
// Writes are group-committed by platform/boltdb: each returns once on disk.
func Open(dir string, lockTimeout time.Duration) (*Store, error) {
	db, err := boltdb.Open(filepath.Join(dir, FileName), boltdb.Options{
		Buckets:       allBuckets,
		SchemaVersion: schemaVersion,
		LockTimeout:   lockTimeout,
	})
	if err != nil {
		return nil, err
	}
	return &Store{db: db}, nil
}

// Ping reports whether the database is open.
func (s *Store) Ping(ctx context.Context) error { return s.db.Ping(ctx) }

// Close finishes queued writes and closes the database.
func (s *Store) Close() error { return s.db.Close() }

// get decodes key of b into m; a missing key is a *resource.Error
// of kind.
func get[T proto.Message](b *boltdb.Bucket, kind, key string, m T) error {
	v := b.Get([]byte(key))
	if v == nil {
		return resource.NotFound(kind, key)
	}
	if err := proto.Unmarshal(v, m); err != nil {
		return fmt.Errorf("decode %s: %w", key, err)
	}
	return nil
}

func put(b *boltdb.Bucket, key string, m proto.Message) error {
	v, err := proto.Marshal(m)
	if err != nil {
		return fmt.Errorf("encode %s: %w", key, err)
	}
	return b.Put([]byte(key), v)
}

// AppendLedgerEntry implements store.Store. It group-commits with db.Batch:
// concurrent appends share one fsync, and each is durable when it returns.
func (s *Store) AppendLedgerEntry(ctx context.Context, e *negotiatorv1.LedgerEntry, totalKeys []string) (*negotiatorv1.LedgerEntry, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var out *negotiatorv1.LedgerEntry
	// Batch may run the function again after a failed batch, so it starts
	// from e each time and only assigns out at the end.
	err := s.db.Update(func(tx *boltdb.Tx) error {
		b := tx.Bucket(bucketLedger)
		seq, err := b.NextSequence()
		if err != nil {
			return err
		}
		entry := &negotiatorv1.LedgerEntry{}
		if e != nil {
			entry = proto.CloneOf(e)
		}
		entry.Name = fmt.Sprintf("ledgerEntries/%016x", seq)
		if err := put(b, entry.Name, entry); err != nil {
			return err
		}
		tb := tx.Bucket(bucketTotals)
		for _, k := range totalKeys {
			t := &negotiatorv1.CostSummary{}
			if err := get(tb, "cost total", k, t); err != nil && !errors.Is(err, store.ErrNotFound) {
				return err
			}
			t.Calls++
			t.PromptTokens += entry.GetPromptTokens()
			t.CompletionTokens += entry.GetCompletionTokens()
			t.CostMicroUsd += entry.GetCostMicroUsd()
			if err := put(tb, k, t); err != nil {
				return err
			}
		}
		out = entry
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// ListLedgerEntries implements store.Store.
func (s *Store) ListLedgerEntries(ctx context.Context, f store.LedgerFilter, after string, limit int) ([]*negotiatorv1.LedgerEntry, string, error) {
	if err := ctx.Err(); err != nil {
		return nil, "", err
	}
	var out []*negotiatorv1.LedgerEntry
	next := ""
	err := s.db.View(func(tx *boltdb.Tx) error {
		c := tx.Bucket(bucketLedger).Cursor()
		k, v := c.First()
		if after != "" {
			k, v = c.Seek([]byte(after))
			if k != nil && bytes.Equal(k, []byte(after)) {
				k, v = c.Next()
			}
		}
		for ; k != nil; k, v = c.Next() {
			e := &negotiatorv1.LedgerEntry{}
			if err := proto.Unmarshal(v, e); err != nil {
				return fmt.Errorf("decode %s: %w", k, err)
			}
			if (f.Agent != "" && e.GetAgent() != f.Agent) || (f.Role != "" && e.GetRole() != f.Role) {
				continue
			}
			if len(out) == limit {
				next = out[len(out)-1].GetName()
				return nil
			}
			out = append(out, e)
		}
		return nil
	})
	return out, next, err
}

// Totals implements store.Store.
func (s *Store) Totals(ctx context.Context, key string) (*negotiatorv1.CostSummary, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	t := &negotiatorv1.CostSummary{}
	err := s.db.View(func(tx *boltdb.Tx) error {
		if err := get(tx.Bucket(bucketTotals), "cost total", key, t); err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
		return nil
	})
	return t, err
}

// GetVerdict implements store.Store.
func (s *Store) GetVerdict(ctx context.Context, key string) (*negotiatorv1.SuitabilityVerdict, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	v := &negotiatorv1.SuitabilityVerdict{}
	err := s.db.View(func(tx *boltdb.Tx) error { return get(tx.Bucket(bucketVerdicts), "verdict", key, v) })
	if err != nil {
		return nil, err
	}
	return v, nil
}

// PutVerdict implements store.Store.
func (s *Store) PutVerdict(ctx context.Context, key string, v *negotiatorv1.SuitabilityVerdict) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.Update(func(tx *boltdb.Tx) error { return put(tx.Bucket(bucketVerdicts), key, v) })
}

// CreateNegotiation implements store.Store.
func (s *Store) CreateNegotiation(ctx context.Context, n *negotiatorv1.Negotiation) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.Update(func(tx *boltdb.Tx) error {
		b := tx.Bucket(bucketNegotiations)
		if b.Get([]byte(n.GetName())) != nil {
			return resource.AlreadyExists("negotiation", n.GetName())
		}
		return put(b, n.GetName(), n)
	})
}

// GetNegotiation implements store.Store.
func (s *Store) GetNegotiation(ctx context.Context, name string) (*negotiatorv1.Negotiation, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	n := &negotiatorv1.Negotiation{}
	if err := s.db.View(func(tx *boltdb.Tx) error { return get(tx.Bucket(bucketNegotiations), "negotiation", name, n) }); err != nil {
		return nil, err
	}
	return n, nil
}

// UpdateNegotiation implements store.Store.
func (s *Store) UpdateNegotiation(ctx context.Context, name string, mutate func(*negotiatorv1.Negotiation) error) (*negotiatorv1.Negotiation, error) {
	n := &negotiatorv1.Negotiation{}
	if err := update(ctx, s.db, bucketNegotiations, "negotiation", name, n, func() error { return mutate(n) }); err != nil {
		return nil, err
	}
	return n, nil
}

// PutRoutineCandidate implements store.Store.
func (s *Store) PutRoutineCandidate(ctx context.Context, c *negotiatorv1.RoutineCandidate) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.Update(func(tx *boltdb.Tx) error { return put(tx.Bucket(bucketCandidates), c.GetName(), c) })
}

// GetRoutineCandidate implements store.Store.
func (s *Store) GetRoutineCandidate(ctx context.Context, name string) (*negotiatorv1.RoutineCandidate, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c := &negotiatorv1.RoutineCandidate{}
	if err := s.db.View(func(tx *boltdb.Tx) error { return get(tx.Bucket(bucketCandidates), "routine candidate", name, c) }); err != nil {
		return nil, err
	}
	return c, nil
}

// UpdateRoutineCandidate implements store.Store.
func (s *Store) UpdateRoutineCandidate(ctx context.Context, name string, mutate func(*negotiatorv1.RoutineCandidate) error) (*negotiatorv1.RoutineCandidate, error) {
	c := &negotiatorv1.RoutineCandidate{}
	if err := update(ctx, s.db, bucketCandidates, "routine candidate", name, c, func() error { return mutate(c) }); err != nil {
		return nil, err
	}
	return c, nil
}

// update decodes key into m, runs mutate and writes m back, in one
// transaction. mutate's error is returned unwrapped.
func update(ctx context.Context, db *boltdb.DB, bucket []byte, kind, key string, m proto.Message, mutate func() error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return db.Update(func(tx *boltdb.Tx) error {
		b := tx.Bucket(bucket)
		if err := get(b, kind, key, m); err != nil {
			return err
		}
		if err := mutate(); err != nil {
			return err
		}
		return put(b, key, m)
	})
}
