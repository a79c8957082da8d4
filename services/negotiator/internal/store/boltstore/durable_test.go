package boltstore

import (
	"testing"
	"time"

	negotiatorv1 "github.com/parleyhq/parley/gen/parley/negotiator/v1"
)

// Every write returns only after a commit that bbolt fsynced. A kill -9
// test cannot see a missing fsync (the page cache outlives the process), so
// this reads platform/boltdb's commit counts instead: a store opened with
// NoSync fails here.
func TestWrites_returnOnlyAfterASyncedCommit(t *testing.T) {
	s, err := Open(t.TempDir(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.db.Durable(); err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	writes := []struct {
		name string
		do   func() error
	}{
		{"AppendLedgerEntry", func() error {
			_, err := s.AppendLedgerEntry(ctx, &negotiatorv1.LedgerEntry{PromptTokens: 3}, []string{"all"})
			return err
		}},
		{"PutVerdict", func() error { return s.PutVerdict(ctx, "k", &negotiatorv1.SuitabilityVerdict{}) }},
		{"CreateNegotiation", func() error { return s.CreateNegotiation(ctx, &negotiatorv1.Negotiation{Name: "negotiations/n"}) }},
		{"UpdateNegotiation", func() error {
			_, err := s.UpdateNegotiation(ctx, "negotiations/n", func(*negotiatorv1.Negotiation) error { return nil })
			return err
		}},
		{"PutRoutineCandidate", func() error {
			return s.PutRoutineCandidate(ctx, &negotiatorv1.RoutineCandidate{Name: "routineCandidates/c"})
		}},
		{"UpdateRoutineCandidate", func() error {
			_, err := s.UpdateRoutineCandidate(ctx, "routineCandidates/c", func(*negotiatorv1.RoutineCandidate) error { return nil })
			return err
		}},
	}
	for _, w := range writes {
		before := s.db.Commits()
		if err := w.do(); err != nil {
			t.Fatalf("%s: %v", w.name, err)
		}
		if after := s.db.Commits(); after.Synced == before.Synced || after.Unsynced != 0 {
			t.Errorf("%s: commits went %+v -> %+v; want it to return after a synced commit, and no unsynced one", w.name, before, after)
		}
	}
}
