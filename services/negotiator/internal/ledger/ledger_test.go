package ledger_test

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/parleyhq/parley/services/negotiator/internal/ledger"
	"github.com/parleyhq/parley/services/negotiator/internal/llm"
	"github.com/parleyhq/parley/services/negotiator/internal/store"
	"github.com/parleyhq/parley/services/negotiator/internal/store/boltstore"
	"github.com/parleyhq/parley/services/negotiator/negotiatortest/llmtest"
)

func openStore(t *testing.T) *boltstore.Store {
	t.Helper()
	s, err := boltstore.Open(t.TempDir(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestParsePrices(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		model   string
		want    ledger.Price
		wantErr bool
	}{
		{name: "default gpt-4o", in: "", model: "gpt-4o", want: ledger.Price{In: 5, Out: 15}},
		{name: "prefix match", in: "", model: "gpt-4o-2024-08-06", want: ledger.Price{In: 5, Out: 15}},
		{name: "longest prefix wins", in: "gpt-4o-mini=0.15/0.6", model: "gpt-4o-mini-2024", want: ledger.Price{In: 0.15, Out: 0.6}},
		{name: "override", in: "gemini-1.5-pro=1/2", model: "gemini-1.5-pro", want: ledger.Price{In: 1, Out: 2}},
		{name: "malformed", in: "gpt-4o=5", wantErr: true},
		{name: "negative", in: "x=-1/2", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := ledger.ParsePrices(tt.in, ledger.DefaultPrices())
			if (err != nil) != tt.wantErr {
				t.Fatalf("ParsePrices(%q) error = %v, wantErr %v", tt.in, err, tt.wantErr)
			}
			if tt.wantErr {
				return
			}
			if got, _ := p.Lookup(tt.model); got != tt.want {
				t.Errorf("Lookup(%q) = %v, want %v", tt.model, got, tt.want)
			}
		})
	}
	if got := (ledger.Price{In: 5, Out: 15}).CostMicroUSD(1000, 100); got != 6500 {
		t.Errorf("CostMicroUSD(1000, 100) at 5/15 = %d, want 6500", got)
	}
}

func TestLedger_recordsAndEnforcesBudget(t *testing.T) {
	f, err := llmtest.NewFakeServer(func(llmtest.Call) llmtest.Reply {
		return llmtest.Reply{Text: "a forty-byte answer of fairly many words"}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	st := openStore(t)
	client := llm.NewClient(&llm.OpenAI{BaseURL: f.URL + "/v1"}, llmtest.Options(llm.Options{DefaultModel: "gpt-4o"}))
	m := ledger.NewMetrics()
	reg := prometheus.NewRegistry()
	reg.MustRegister(m.Collectors()...)
	// Each call costs a few hundred micro-USD; the budget allows two.
	l := ledger.New(client, st, ledger.DefaultPrices(), ledger.Budgets{PerAgent: 300}, m, nil)
	call := ledger.Call{Agent: "clients/c/agents/alice", Peer: "bob", Operation: "test"}
	req := llm.Request{Role: llm.RoleConversation, Messages: []llm.Message{{Role: "user", Content: "What is the weather in Paris tomorrow?"}}}

	var calls int
	for i := range 10 {
		_, err := l.Complete(t.Context(), call, req)
		if errors.Is(err, ledger.ErrBudgetExhausted) {
			break
		}
		if err != nil {
			t.Fatalf("Complete #%d: %v", i, err)
		}
		calls++
	}
	if calls == 0 || calls == 10 {
		t.Fatalf("made %d calls before the budget stopped them", calls)
	}
	if got := len(f.Calls()); got != calls {
		t.Errorf("provider saw %d calls, want %d (none after exhaustion)", got, calls)
	}
	var be *ledger.BudgetError
	_, err = l.Complete(t.Context(), call, req)
	if !errors.As(err, &be) || be.Scope != "agent" {
		t.Errorf("Complete after exhaustion = %v, want agent BudgetError", err)
	}
	// Another agent still has budget.
	if _, err := l.Complete(t.Context(), ledger.Call{Agent: "clients/c/agents/carol", Peer: "bob"}, req); err != nil {
		t.Errorf("Complete for another agent: %v", err)
	}

	sum, err := l.Summary(t.Context(), call.Agent)
	if err != nil {
		t.Fatal(err)
	}
	prompt, completion := f.Tokens()
	all, _ := l.Summary(t.Context(), "")
	if all.GetPromptTokens() != prompt || all.GetCompletionTokens() != completion || all.GetCalls() != int64(calls+1) {
		t.Errorf("Summary(all) = %v, want %d calls and the fake's %d/%d tokens", all, calls+1, prompt, completion)
	}
	if want := (ledger.Price{In: 5, Out: 15}).CostMicroUSD(sum.GetPromptTokens(), sum.GetCompletionTokens()); sum.GetCostMicroUsd() < want-int64(calls) || sum.GetCostMicroUsd() > want+int64(calls) {
		t.Errorf("agent cost = %d, want about %d", sum.GetCostMicroUsd(), want)
	}
	entries, _, err := st.ListLedgerEntries(t.Context(), store.LedgerFilter{Agent: call.Agent}, "", 100)
	if err != nil || len(entries) != calls {
		t.Fatalf("ledger has %d entries for alice, %v; want %d", len(entries), err, calls)
	}
	e := entries[0]
	if e.GetModel() != "gpt-4o" || e.GetRole() != "conversation" || e.GetPeer() != "bob" || e.GetOperation() != "test" || e.GetLatency() == nil {
		t.Errorf("entry = %v", e)
	}
	if got := testutil.ToFloat64(m.Collectors()[0].(*prometheus.CounterVec).WithLabelValues("conversation", "gpt-4o", "prompt")); int64(got) != prompt {
		t.Errorf("prompt tokens metric = %v, want %d", got, prompt)
	}
}

func TestLedger_peerBudget(t *testing.T) {
	f, err := llmtest.NewFakeServer(func(llmtest.Call) llmtest.Reply {
		return llmtest.Reply{Text: "an answer long enough to cost something"}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	client := llm.NewClient(&llm.OpenAI{BaseURL: f.URL + "/v1"}, llmtest.Options(llm.Options{DefaultModel: "gpt-4o"}))
	l := ledger.New(client, openStore(t), ledger.DefaultPrices(), ledger.Budgets{PerPeer: 1}, nil, nil)
	req := llm.Request{Messages: []llm.Message{{Role: "user", Content: "hi"}}}
	if _, err := l.Complete(t.Context(), ledger.Call{Agent: "clients/c/agents/a", Peer: "mallory"}, req); err != nil {
		t.Fatal(err)
	}
	// Another agent talking to the same peer is refused: the peer's
	// budget is spent, whoever pays.
	var be *ledger.BudgetError
	if _, err := l.Complete(t.Context(), ledger.Call{Agent: "clients/c/agents/b", Peer: "mallory"}, req); !errors.As(err, &be) || be.Scope != "peer" || be.Who != "mallory" {
		t.Errorf("Complete for a spent peer = %v, want a peer BudgetError", err)
	}
	if _, err := l.Complete(t.Context(), ledger.Call{Agent: "clients/c/agents/b", Peer: "bob"}, req); err != nil {
		t.Errorf("Complete for another peer: %v", err)
	}
	if got := len(f.Calls()); got != 2 {
		t.Errorf("provider saw %d calls, want 2", got)
	}
}

func TestLedger_notConfigured(t *testing.T) {
	l := ledger.New(llm.NewClient(nil, llmtest.Options(llm.Options{})), openStore(t), ledger.DefaultPrices(), ledger.Budgets{}, nil, nil)
	if _, err := l.Complete(t.Context(), ledger.Call{}, llm.Request{}); !errors.Is(err, llm.ErrNotConfigured) {
		t.Errorf("Complete() = %v, want ErrNotConfigured", err)
	}
}

// TestLedger_unpricedModel: calls answered by a model with no price are
// counted by model and logged once per model.
func TestLedger_unpricedModel(t *testing.T) {
	f, err := llmtest.NewFakeServer(func(llmtest.Call) llmtest.Reply { return llmtest.Reply{Text: "ok"} })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	for _, tt := range []struct {
		model     string
		wantCalls float64
		wantLogs  int
	}{
		{"mystery-1", 3, 1},
		{"gpt-4o-2024-08-06", 0, 0},
	} {
		t.Run(tt.model, func(t *testing.T) {
			var logs bytes.Buffer
			client := llm.NewClient(&llm.OpenAI{BaseURL: f.URL + "/v1"}, llmtest.Options(llm.Options{DefaultModel: tt.model}))
			m := ledger.NewMetrics()
			l := ledger.New(client, openStore(t), ledger.DefaultPrices(), ledger.Budgets{}, m, slog.New(slog.NewTextHandler(&logs, nil)))
			req := llm.Request{Role: llm.RoleConversation, Messages: []llm.Message{{Role: "user", Content: "hi"}}}
			for range 3 {
				if _, err := l.Complete(t.Context(), ledger.Call{Agent: "clients/c/agents/a", Peer: "p"}, req); err != nil {
					t.Fatal(err)
				}
			}
			unpriced := m.Collectors()[4].(*prometheus.CounterVec)
			if got := testutil.ToFloat64(unpriced.WithLabelValues(tt.model)); got != tt.wantCalls {
				t.Errorf("unpriced calls = %v, want %v", got, tt.wantCalls)
			}
			if got := strings.Count(logs.String(), "has no price"); got != tt.wantLogs {
				t.Errorf("logged %d warnings, want %d:\n%s", got, tt.wantLogs, logs.String())
			}
		})
	}
}
