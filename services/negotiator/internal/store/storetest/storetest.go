// Package storetest is the conformance suite every store.Store backend
// must pass.
package storetest

import (
	"errors"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	negotiatorv1 "github.com/parleyhq/parley/gen/parley/negotiator/v1"
	"github.com/parleyhq/parley/services/negotiator/internal/store"
)

// Run runs the suite; open returns a fresh, empty store.
func Run(t *testing.T, open func(t *testing.T) store.Store) {
	t.Run("LedgerAppendListTotals", func(t *testing.T) { testLedger(t, open(t)) })
	t.Run("LedgerConcurrentAppends", func(t *testing.T) { testLedgerConcurrent(t, open(t)) })
	t.Run("Verdicts", func(t *testing.T) { testVerdicts(t, open(t)) })
	t.Run("Negotiations", func(t *testing.T) { testNegotiations(t, open(t)) })
	t.Run("RoutineCandidates", func(t *testing.T) { testCandidates(t, open(t)) })
}

func testLedger(t *testing.T, s store.Store) {
	ctx := t.Context()
	var names []string
	for i := range 5 {
		agent := "clients/c/agents/a"
		role := "checking"
		if i%2 == 1 {
			agent, role = "clients/c/agents/b", "negotiation"
		}
		e, err := s.AppendLedgerEntry(ctx, &negotiatorv1.LedgerEntry{Agent: agent, Role: role, PromptTokens: 10, CompletionTokens: 2, CostMicroUsd: 100}, []string{"all", "a/" + agent})
		if err != nil {
			t.Fatalf("AppendLedgerEntry(%d): %v", i, err)
		}
		if e.GetName() == "" || (len(names) > 0 && e.GetName() <= names[len(names)-1]) {
			t.Fatalf("AppendLedgerEntry(%d) name %q does not increase after %v", i, e.GetName(), names)
		}
		names = append(names, e.GetName())
	}
	tot, err := s.Totals(ctx, "all")
	if err != nil {
		t.Fatal(err)
	}
	want := &negotiatorv1.CostSummary{Calls: 5, PromptTokens: 50, CompletionTokens: 10, CostMicroUsd: 500}
	if diff := cmp.Diff(want, tot, protocmp.Transform()); diff != "" {
		t.Errorf("Totals(all) (-want +got):\n%s", diff)
	}
	tb, _ := s.Totals(ctx, "a/clients/c/agents/b")
	if tb.GetCalls() != 2 {
		t.Errorf("Totals(agent b).Calls = %d, want 2", tb.GetCalls())
	}
	none, err := s.Totals(ctx, "missing")
	if err != nil || none.GetCalls() != 0 {
		t.Errorf("Totals(missing) = %v, %v; want zero", none, err)
	}

	// Paging to the end, two at a time.
	var got []string
	after := ""
	for range 10 {
		page, next, err := s.ListLedgerEntries(ctx, store.LedgerFilter{}, after, 2)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range page {
			got = append(got, e.GetName())
		}
		if next == "" {
			break
		}
		after = next
	}
	if diff := cmp.Diff(names, got); diff != "" {
		t.Errorf("paged ListLedgerEntries (-want +got):\n%s", diff)
	}
	filtered, next, err := s.ListLedgerEntries(ctx, store.LedgerFilter{Agent: "clients/c/agents/a", Role: "checking"}, "", 10)
	if err != nil || next != "" || len(filtered) != 3 {
		t.Errorf("ListLedgerEntries(agent a, checking) = %d entries, next %q, %v; want 3", len(filtered), next, err)
	}
}

func testLedgerConcurrent(t *testing.T, s store.Store) {
	const n = 32
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Go(func() {
			_, err := s.AppendLedgerEntry(t.Context(), &negotiatorv1.LedgerEntry{CostMicroUsd: 1}, []string{"all"})
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	tot, _ := s.Totals(t.Context(), "all")
	if tot.GetCalls() != n || tot.GetCostMicroUsd() != n {
		t.Errorf("Totals after %d concurrent appends = %v", n, tot)
	}
	page, _, _ := s.ListLedgerEntries(t.Context(), store.LedgerFilter{}, "", 1000)
	seen := map[string]bool{}
	for _, e := range page {
		seen[e.GetName()] = true
	}
	if len(seen) != n {
		t.Errorf("%d distinct entry names, want %d", len(seen), n)
	}
}

func testVerdicts(t *testing.T, s store.Store) {
	ctx := t.Context()
	if _, err := s.GetVerdict(ctx, "k"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetVerdict(missing) = %v, want ErrNotFound", err)
	}
	v := &negotiatorv1.SuitabilityVerdict{Fit: true, Reasons: []string{"schemas match"}, Source: negotiatorv1.VerdictSource_VERDICT_SOURCE_LLM}
	if err := s.PutVerdict(ctx, "k", v); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetVerdict(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(v, got, protocmp.Transform()); diff != "" {
		t.Errorf("GetVerdict (-want +got):\n%s", diff)
	}
}

func testNegotiations(t *testing.T, s store.Store) {
	ctx := t.Context()
	n := &negotiatorv1.Negotiation{Name: "negotiations/0123", Agent: "clients/c/agents/a", State: negotiatorv1.NegotiationState_NEGOTIATION_STATE_OPEN}
	if err := s.CreateNegotiation(ctx, n); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateNegotiation(ctx, n); !errors.Is(err, store.ErrAlreadyExists) {
		t.Errorf("CreateNegotiation(again) = %v, want ErrAlreadyExists", err)
	}
	if _, err := s.GetNegotiation(ctx, "negotiations/missing"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetNegotiation(missing) = %v, want ErrNotFound", err)
	}
	boom := errors.New("boom")
	if _, err := s.UpdateNegotiation(ctx, n.GetName(), func(m *negotiatorv1.Negotiation) error {
		m.Rounds = 99
		return boom
	}); !errors.Is(err, boom) {
		t.Errorf("UpdateNegotiation(failing mutate) = %v, want boom", err)
	}
	got, err := s.UpdateNegotiation(ctx, n.GetName(), func(m *negotiatorv1.Negotiation) error {
		m.Rounds++
		m.Transcript = append(m.Transcript, &negotiatorv1.NegotiationMessage{Sent: true, BodyJson: []byte(`{"type":"propose"}`)})
		return nil
	})
	if err != nil || got.GetRounds() != 1 {
		t.Fatalf("UpdateNegotiation = %v, %v; want rounds 1", got, err)
	}
	again, err := s.GetNegotiation(ctx, n.GetName())
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(got, again, protocmp.Transform()); diff != "" {
		t.Errorf("GetNegotiation after update (-want +got):\n%s", diff)
	}
	if _, err := s.UpdateNegotiation(ctx, "negotiations/missing", func(*negotiatorv1.Negotiation) error { return nil }); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("UpdateNegotiation(missing) = %v, want ErrNotFound", err)
	}
}

func testCandidates(t *testing.T, s store.Store) {
	ctx := t.Context()
	c := &negotiatorv1.RoutineCandidate{Name: "routineCandidates/ab", Source: "def reply(query, memory):\n    return query\n", State: negotiatorv1.RoutineCandidateState_ROUTINE_CANDIDATE_STATE_SHADOW, ShadowCallsRequired: 2}
	if err := s.PutRoutineCandidate(ctx, c); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		got, err := s.UpdateRoutineCandidate(ctx, c.GetName(), func(m *negotiatorv1.RoutineCandidate) error {
			m.Agreements++
			return nil
		})
		if err != nil || got.GetAgreements() != int32(i+1) {
			t.Fatalf("UpdateRoutineCandidate #%d = %v, %v", i, got, err)
		}
	}
	got, err := s.GetRoutineCandidate(ctx, c.GetName())
	if err != nil || got.GetAgreements() != 2 || got.GetSource() != c.GetSource() {
		t.Errorf("GetRoutineCandidate = %v, %v", got, err)
	}
	if _, err := s.GetRoutineCandidate(ctx, "routineCandidates/none"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetRoutineCandidate(missing) = %v, want ErrNotFound", err)
	}
}
