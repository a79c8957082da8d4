package benchnet_test

import (
	"testing"

	"github.com/parleyhq/parley/bench/negotiator/benchnet"
)

// TestRun runs a small network: it checks the harness works, not figures.
func TestRun(t *testing.T) {
	if testing.Short() {
		t.Skip("runs three strategies over a small network")
	}
	rep, err := benchnet.Run(t.Context(), benchnet.Options{Agents: 6, Servers: 3, FreeTextServers: 1, Queries: 30, Window: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != 3 {
		t.Fatalf("results = %+v", rep.Results)
	}
	nl, paper, first := rep.Results[0], rep.Results[1], rep.Results[2]
	if nl.QueriesNeedingLLM != 30 || nl.CostUSD <= 0 {
		t.Errorf("nl-only = %+v, want every query to need an LLM", nl)
	}
	// With only 30 queries the paper's thresholds (negotiate after 5
	// conversations per pair) may save nothing, and their extra checks can
	// cost a little more than natural language; only first contact must win.
	if !(first.CostUSD < nl.CostUSD && first.CostUSD <= paper.CostUSD) {
		t.Errorf("costs nl %.4f, paper thresholds %.4f, first contact %.4f: want first contact cheapest", nl.CostUSD, paper.CostUSD, first.CostUSD)
	}
	if first.Negotiations == 0 || len(first.LLMShareByWindow) != 3 {
		t.Errorf("first contact = %+v", first)
	}
	sum := 0
	for _, b := range rep.Budgets {
		sum += b
	}
	if sum != 30 {
		t.Errorf("budgets %v sum to %d, want 30", rep.Budgets, sum)
	}
}
