package routine

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestCall(t *testing.T) {
	table, err := TableTool(`{"Paris": {"t": 7}, "[1,2]": "list key"}`)
	if err != nil {
		t.Fatal(err)
	}
	p, err := Compile(t.Context(), "r", `
def reply(query, memory):
    memory["n"] = memory.get("n", 0) + 1
    return {"w": weather(query["city"]), "l": weather([1, 2]), "none": weather("Oslo"), "n": memory["n"], "enc": json.encode([1])}
`, map[string]Tool{"weather": table}, testLimits(Limits{}))
	if err != nil {
		t.Fatal(err)
	}
	out, mem, err := p.Call(t.Context(), "reply", []json.RawMessage{json.RawMessage(`{"city":"Paris"}`)}, json.RawMessage(`{"n":4}`))
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != `{"enc":"[1]","l":"list key","n":5,"none":null,"w":{"t":7}}` || string(mem) != `{"n":5}` {
		t.Errorf("Call = %s, memory %s", out, mem)
	}
}

func TestBudgets(t *testing.T) {
	const loop = "def reply(q, m):\n    while True:\n        pass\n"
	tests := []struct {
		name   string
		src    string
		limits Limits
		ctx    func(context.Context) context.Context
		kind   Kind
	}{
		{"steps", "def reply(q, m):\n    while True:\n        pass\n", testLimits(Limits{MaxSteps: 10_000, Timeout: time.Minute}), nil, KindSteps},
		{"wall time", "def reply(q, m):\n    while True:\n        pass\n", testLimits(Limits{MaxSteps: 1 << 62, Timeout: 20 * time.Millisecond}), nil, KindTime},
		{"output size", "def reply(q, m):\n    return 'x' * 1000\n", testLimits(Limits{MaxOutputBytes: 100}), nil, KindOutput},
		{"tool calls", "def reply(q, m):\n    for i in range(10):\n        t('a')\n", testLimits(Limits{MaxToolCalls: 3}), nil, KindSteps},
		{"request deadline before the wall time", loop, testLimits(Limits{MaxSteps: 1 << 62, Timeout: time.Minute}), func(ctx context.Context) context.Context {
			ctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
			t.Cleanup(cancel)
			return ctx
		}, KindTime},
		{"request cancelled before the call", loop, testLimits(Limits{MaxSteps: 1 << 62, Timeout: time.Minute}), func(ctx context.Context) context.Context {
			ctx, cancel := context.WithCancel(ctx)
			cancel()
			return ctx
		}, KindTime},
	}
	tool := func() Tool { tt, _ := TableTool(`{}`); return tt }()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Compile(t.Context(), "r", tt.src, map[string]Tool{"t": tool}, tt.limits)
			if err != nil {
				t.Fatal(err)
			}
			ctx := t.Context()
			if tt.ctx != nil {
				ctx = tt.ctx(ctx)
			}
			_, _, err = p.Call(ctx, "reply", []json.RawMessage{json.RawMessage(`1`)}, json.RawMessage(`{}`))
			if !errors.Is(err, ErrBudget) || KindOf(err) != tt.kind {
				t.Errorf("Call = %v (kind %v), want ErrBudget of kind %v", err, KindOf(err), tt.kind)
			}
		})
	}
}

// TestSandbox: a routine cannot load code or reach the host; each attempt
// fails as the routine's own error (KindError, not a budget), with the
// reason, in process and behind the worker boundary.
func TestSandbox(t *testing.T) {
	pool := newTestPool(t, PoolOptions{Workers: 1})
	for _, tc := range []struct{ src, want string }{
		{`load("x.star", "y")`, "load is not allowed in routines"},
		{"def reply(q, m):\n    return open('/etc/passwd')\n", "undefined: open"},
		{"def reply(q, m):\n    return getattr(json, 'os')\n", "no .os field"},
	} {
		for _, limits := range []Limits{testLimits(Limits{}), testLimits(Limits{Pool: pool})} {
			p, err := Compile(t.Context(), "r", tc.src, nil, limits)
			if err == nil {
				_, _, err = p.Call(t.Context(), "reply", []json.RawMessage{json.RawMessage(`1`)}, json.RawMessage(`{}`))
			}
			if err == nil || KindOf(err) != KindError || errors.Is(err, ErrBudget) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("routine %q (pool %v): err = %v (kind %v), want a routine error saying %q", tc.src, limits.Pool != nil, err, KindOf(err), tc.want)
			}
		}
	}
}

// TestCallTool: call_tool(name, args) reaches the same tools as their ids,
// and a table keyed by JSON objects matches whatever the key order.
func TestCallTool(t *testing.T) {
	table, err := TableTool(`{"{\"location\":\"Paris\",\"date\":\"2024-05-01\"}": {"temperature": 21}}`)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, src, want, wantErr string
	}{
		{"by name, keys in another order", `def reply(q, m):
    return call_tool("forecast", {"date": "2024-05-01", "location": "Paris"})`, `{"temperature":21}`, ""},
		{"by id", `def reply(q, m):
    return forecast({"location": "Paris", "date": "2024-05-01"})`, `{"temperature":21}`, ""},
		{"missing key", `def reply(q, m):
    return call_tool("forecast", {"date": "2024-05-02", "location": "Paris"})`, `null`, ""},
		{"unknown tool", `def reply(q, m):
    return call_tool("nope", {})`, "", `no tool "nope"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Compile(t.Context(), "r", tt.src, map[string]Tool{"forecast": table}, testLimits(Limits{}))
			if err != nil {
				t.Fatal(err)
			}
			out, _, err := p.Call(t.Context(), "reply", []json.RawMessage{json.RawMessage(`{}`)}, json.RawMessage(`{}`))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || string(out) != tt.want {
				t.Fatalf("Call = %s, %v; want %s", out, err, tt.want)
			}
		})
	}
}

// Compile takes its budgets as given: the dispatcher's config owns their
// values, so a budget left at zero (or negative) is refused with an error
// naming it, not filled in behind the caller's back.
func TestCompile_refusesUnsetBudgets(t *testing.T) {
	full := testLimits(Limits{})
	for _, tc := range []struct {
		field string
		clear func(*Limits)
	}{
		{"MaxSteps", func(l *Limits) { l.MaxSteps = 0 }},
		{"Timeout", func(l *Limits) { l.Timeout = 0 }},
		{"Timeout", func(l *Limits) { l.Timeout = -time.Second }},
		{"MaxOutputBytes", func(l *Limits) { l.MaxOutputBytes = 0 }},
		{"MaxToolCalls", func(l *Limits) { l.MaxToolCalls = 0 }},
		{"MaxAllocBytes", func(l *Limits) { l.MaxAllocBytes = 0 }},
	} {
		l := full
		tc.clear(&l)
		_, err := Compile(t.Context(), "r", "x = 1\n", nil, l)
		if !errors.Is(err, ErrLimits) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("Compile with %s unset = %v, want ErrLimits naming it", tc.field, err)
		}
	}
	if _, err := Compile(t.Context(), "r", "x = 1\n", nil, full); err != nil {
		t.Errorf("Compile with every budget set = %v", err)
	}
}

// TestCompile_refusesNoPool: a routine runs behind the worker boundary or,
// for tests only, in a pool named so (InProcessForTests); Limits that name
// no pool are refused, so no caller runs a routine in process by accident.
func TestCompile_refusesNoPool(t *testing.T) {
	l := testLimits(Limits{})
	l.Pool = nil
	p, err := Compile(t.Context(), "r", "def reply(q, m):\n    return q\n", nil, l)
	if !errors.Is(err, ErrNoPool) {
		t.Fatalf("Compile with no pool = %v, %v; want ErrNoPool", p, err)
	}
	if _, err := Compile(t.Context(), "r", "def reply(q, m):\n    return q\n", nil, testLimits(Limits{Pool: InProcessForTests()})); err != nil {
		t.Errorf("Compile in process (for tests) = %v", err)
	}
}
