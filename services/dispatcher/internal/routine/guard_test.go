package routine

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"
)

// TestAllocationBudget: operations that allocate a lot in one step are
// refused before they allocate, however they are spelled.
func TestAllocationBudget(t *testing.T) {
	tests := []struct{ name, body string }{
		{"string repetition", `return "x" * (1 << 29)`},
		{"repetition, count first", `return (1 << 29) * "x"`},
		{"huge count", `return "x" * (1 << 70)`},
		{"list repetition", `return len([0] * (1 << 28))`},
		{"doubling by concatenation", "s = 'x' * 1024\n    for i in range(40):\n        s = s + s\n    return len(s)"},
		{"augmented doubling", "s = ['x'] * 1024\n    for i in range(40):\n        s += s\n    return len(s)"},
		{"augmented doubling in a dict", "d = {'k': 'x' * 1024}\n    for i in range(40):\n        d['k'] *= 2\n    return len(d['k'])"},
		{"join of shared strings", "s = 'x' * (1 << 20)\n    return len(''.join([s] * 1000))"},
		{"join reached by getattr", "s = 'x' * (1 << 20)\n    return len(getattr('', 'join')([s] * 1000))"},
		{"join as a value", "s = 'x' * (1 << 20)\n    j = ''.join\n    return len(j([s] * 1000))"},
		{"replace", "s = 'x' * 10000\n    return len(s.replace('x', s))"},
		{"format", "s = 'x' * (1 << 20)\n    return len(('{0}' * 100).format(s))"},
		{"percent", "s = 'x' * (1 << 20)\n    return len(('%s' * 100) % tuple([s] * 100))"},
		{"range materialised", `return len(list(range(1 << 29)))`},
		{"extend by a range", "l = []\n    l.extend(range(1 << 29))\n    return len(l)"},
		{"json.encode of shared values", "s = 'x' * (1 << 20)\n    return len(json.encode([s] * 1000))"},
		{"str of shared values", "s = 'x' * (1 << 20)\n    return len(str([s] * 1000))"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Compile(t.Context(), "r", "def reply(q, m):\n    "+tt.body+"\n", nil, Limits{Timeout: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			out, _, err := p.Call(t.Context(), "reply", []json.RawMessage{json.RawMessage(`1`)}, json.RawMessage(`{}`))
			if !errors.Is(err, ErrBudget) {
				t.Fatalf("Call = %s, %v; want ErrBudget", out, err)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("refused after %v, want it refused before allocating", d)
			}
		})
	}
}

// TestGuardedSemantics: the rewritten operators and methods keep their
// meaning, including in-place += on lists.
func TestGuardedSemantics(t *testing.T) {
	src := `
def reply(q, m):
    a = [1]
    b = a
    b += [2]
    d = {"k": "ab"}
    d["k"] *= 2
    s = "%s-%d" % ("x", 3)
    t = "{}{}".format("p", "q")
    f = getattr(", ", "join")
    l = []
    l.extend(range(3))
    return {"a": a, "k": d["k"], "s": s, "t": t, "j": f(["u", "v"]), "r": "a-b".replace("-", "+"), "l": l, "n": 2 * 3 + 1, "c": [0] * 2 + [1]}
`
	p, err := Compile(t.Context(), "r", src, nil, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	out, _, err := p.Call(t.Context(), "reply", []json.RawMessage{json.RawMessage(`1`)}, json.RawMessage(`{}`))
	const want = `{"a":[1,2],"c":[0,0,1],"j":"u, v","k":"abab","l":[0,1,2],"n":7,"r":"a+b","s":"x-3","t":"pq"}`
	if err != nil || string(out) != want {
		t.Fatalf("Call = %s, %v; want %s", out, err, want)
	}
}

func TestGuardedCompile(t *testing.T) {
	if _, err := Compile(t.Context(), "r", "def f(l):\n    l[g()] += [1]\n\ndef g():\n    return 0\n", nil, Limits{}); err == nil {
		t.Error("Compile accepted += on a target that calls a function")
	}
	if _, err := Compile(t.Context(), "r", "x = '$add'\n", nil, Limits{}); err != nil {
		t.Errorf("Compile = %v", err)
	}
}

// TestLateResult: a run that completes after its wall time fails, even when
// the work that overran was one uninterruptible step.
func TestLateResult(t *testing.T) {
	slow := FuncTool(func(ctx context.Context, _ json.RawMessage) (json.RawMessage, error) {
		time.Sleep(60 * time.Millisecond)
		return json.RawMessage(`1`), nil
	})
	p, err := Compile(t.Context(), "r", "def reply(q, m):\n    return t(1)\n", map[string]Tool{"t": slow}, Limits{Timeout: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if out, _, err := p.Call(t.Context(), "reply", []json.RawMessage{json.RawMessage(`1`)}, json.RawMessage(`{}`)); !errors.Is(err, ErrBudget) {
		t.Fatalf("Call = %s, %v; want ErrBudget", out, err)
	}
}

// TestOutputCapBeforeEncoding: a result far over the cap is refused by the
// size walk, before an encoding of it exists.
func TestOutputCapBeforeEncoding(t *testing.T) {
	p, err := Compile(t.Context(), "r", "s = 'x' * 60000\nbig = [s] * 1000\ndef reply(q, m):\n    return big\n", nil, Limits{MaxOutputBytes: 64 << 10, MaxAllocBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := p.Call(t.Context(), "reply", []json.RawMessage{json.RawMessage(`1`)}, json.RawMessage(`{}`)); !errors.Is(err, ErrBudget) {
		t.Fatalf("Call error = %v, want ErrBudget", err)
	}
	if _, err := encodeJSON(nil, p.globals["big"], 64<<10); !errors.Is(err, errTooLarge) {
		t.Errorf("encodeJSON error = %v, want errTooLarge", err)
	}
}

// TestPool: with every worker taken, a call waits at most its wall time and
// fails; it runs once a worker is free.
func TestPool(t *testing.T) {
	pool := NewPool(1)
	p, err := Compile(t.Context(), "r", "def reply(q, m):\n    return 1\n", nil, Limits{Pool: pool, Timeout: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	release, err := pool.acquire(t.Context(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := p.Call(t.Context(), "reply", []json.RawMessage{json.RawMessage(`1`)}, json.RawMessage(`{}`)); !errors.Is(err, ErrBusy) {
		t.Fatalf("Call with no free worker = %v, want ErrBusy", err)
	}
	release()
	// The same pool with a generous wall time, so a loaded machine cannot
	// turn the successful run into a late one.
	p, err = Compile(t.Context(), "r", "def reply(q, m):\n    return 1\n", nil, Limits{Pool: pool, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if out, _, err := p.Call(t.Context(), "reply", []json.RawMessage{json.RawMessage(`1`)}, json.RawMessage(`{}`)); err != nil || string(out) != "1" {
		t.Fatalf("Call = %s, %v", out, err)
	}
}
