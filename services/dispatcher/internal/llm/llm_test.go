package llm

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/parleyhq/parley/services/dispatcher/internal/metrics"
)

type fakeLLM struct {
	res Result
	err error
}

func (f fakeLLM) Complete(context.Context, Request) (Result, error) { return f.res, f.err }

func TestCounted(t *testing.T) {
	m := metrics.New(nil)
	ok := Counted{LLM: fakeLLM{res: Result{Output: json.RawMessage(`"hi"`), InputTokens: 7, OutputTokens: 3}}, Metrics: m}
	if out, err := ok.Complete(t.Context(), Request{Purpose: PurposeReply}); err != nil || string(out) != `"hi"` {
		t.Fatalf("Complete = %s, %v; want \"hi\"", out, err)
	}
	if got := testutil.ToFloat64(m.LLMCalls.WithLabelValues("reply")); got != 1 {
		t.Errorf("llm calls{reply} = %v, want 1", got)
	}
	if got := testutil.ToFloat64(m.LLMTokens.WithLabelValues("input")); got != 7 {
		t.Errorf("llm tokens{input} = %v, want 7", got)
	}
	// No call was made: not counted.
	if _, err := (Counted{LLM: NoLLM{}, Metrics: m}).Complete(t.Context(), Request{Purpose: PurposeReply}); !errors.Is(err, ErrNoLLM) {
		t.Errorf("Complete(NoLLM) = %v, want ErrNoLLM", err)
	}
	if got := testutil.ToFloat64(m.LLMCalls.WithLabelValues("reply")); got != 1 {
		t.Errorf("llm calls{reply} after NoLLM = %v, want still 1", got)
	}
	bad := Counted{LLM: fakeLLM{res: Result{Output: json.RawMessage(`not json`)}}, Metrics: m}
	if _, err := bad.Complete(t.Context(), Request{Purpose: PurposeSend}); err == nil {
		t.Error("Complete(output not JSON) = nil error")
	}
}

func TestFailure_budgetSaysRoutinesStillWork(t *testing.T) {
	msg := Failure(errors.Join(ErrLLMBudget))
	if !strings.Contains(msg, "routine") || !strings.Contains(msg, "budget is exhausted") {
		t.Errorf("Failure(budget) = %q, want it to say the budget is exhausted and routines still work", msg)
	}
}
