package boltstore

import (
	"testing"
	"time"

	negotiatorv1 "github.com/parleyhq/parley/gen/parley/negotiator/v1"
	"github.com/parleyhq/parley/platform/boltdb/boltdbtest"
)

// Every acknowledged write returns only after a commit that bbolt fsynced
// (boltdbtest.SyncedWrites says why that is checked this way): a store
// opened with NoSync fails here.
func TestWrites_returnOnlyAfterASyncedCommit(t *testing.T) {
	s, err := Open(t.TempDir(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := t.Context()
	writes := []boltdbtest.Write{
		{Name: "AppendLedgerEntry", Do: func() error {
			_, err := s.AppendLedgerEntry(ctx, &negotiatorv1.LedgerEntry{PromptTokens: 3}, []string{"all"})
			return err
		}},
		{Name: "PutVerdict", Do: func() error { return s.PutVerdict(ctx, "k", &negotiatorv1.SuitabilityVerdict{}) }},
		{Name: "CreateNegotiation", Do: func() error { return s.CreateNegotiation(ctx, &negotiatorv1.Negotiation{Name: "negotiations/n"}) }},
		{Name: "UpdateNegotiation", Do: func() error {
			_, err := s.UpdateNegotiation(ctx, "negotiations/n", func(*negotiatorv1.Negotiation) error { return nil })
			return err
		}},
		{Name: "PutRoutineCandidate", Do: func() error {
			return s.PutRoutineCandidate(ctx, &negotiatorv1.RoutineCandidate{Name: "routineCandidates/c"})
		}},
		{Name: "UpdateRoutineCandidate", Do: func() error {
			_, err := s.UpdateRoutineCandidate(ctx, "routineCandidates/c", func(*negotiatorv1.RoutineCandidate) error { return nil })
			return err
		}},
	}
	boltdbtest.SyncedWrites(t, s.db, writes)
}
