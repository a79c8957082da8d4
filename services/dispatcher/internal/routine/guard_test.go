package routine

import (
	"context"
	"encoding/json"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestAllocationBudget: operations that allocate a lot in one step are
// refused before they allocate, however they are spelled. (The bound is
// on bytes, not on wall time, which -race on a loaded machine stretched
// past any fixed figure.)
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
			p, err := Compile(t.Context(), "r", "def reply(q, m):\n    "+tt.body+"\n", nil, testLimits(Limits{Timeout: time.Minute}))
			if err != nil {
				t.Fatal(err)
			}
			// What the run allocated, from the process's own count (the
			// run is in process, and the tests of this package do not run
			// in parallel): a refused step allocates nothing, so the run
			// allocates at most about its budget in the steps before it.
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			out, _, err := p.Call(t.Context(), "reply", []json.RawMessage{json.RawMessage(`1`)}, json.RawMessage(`{}`))
			runtime.ReadMemStats(&after)
			if !errors.Is(err, ErrBudget) {
				t.Fatalf("Call = %s, %v; want ErrBudget", out, err)
			}
			// 4× the budget leaves room for a list's growth by copying;
			// unguarded, each of these allocates gigabytes or more.
			if got, bound := after.TotalAlloc-before.TotalAlloc, uint64(4*testLimits(Limits{}).MaxAllocBytes); got > bound {
				t.Errorf("the run allocated %d MiB before it was refused, want at most %d MiB (4× its allocation budget)", got>>20, bound>>20)
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
	p, err := Compile(t.Context(), "r", src, nil, testLimits(Limits{}))
	if err != nil {
		t.Fatal(err)
	}
	out, _, err := p.Call(t.Context(), "reply", []json.RawMessage{json.RawMessage(`1`)}, json.RawMessage(`{}`))
	const want = `{"a":[1,2],"c":[0,0,1],"j":"u, v","k":"abab","l":[0,1,2],"n":7,"r":"a+b","s":"x-3","t":"pq"}`
	if err != nil || string(out) != want {
		t.Fatalf("Call = %s, %v; want %s", out, err, want)
	}
}

// TestAugmentedTargetWithCalls: an augmented target that calls functions
// compiles, and its calls run once, in order.
func TestAugmentedTargetWithCalls(t *testing.T) {
	src := `
calls = []
def g(k):
    calls.append(k)
    return k
def reply(q, m):
    counts = {"a": 1}
    counts["A".lower()] += 1
    l = [[0, 0]]
    n = []
    def h(k):
        n.append(k)
        return k
    l[h(0)][h(1)] += 5
    for k in ["x", "y", "x"]:
        m[k.upper()] = m.get(k.upper(), 0)
        m[k.upper()] += 1
    return {"counts": counts, "l": l, "n": n, "m": m}
`
	p, err := Compile(t.Context(), "r", src, nil, testLimits(Limits{}))
	if err != nil {
		t.Fatal(err)
	}
	out, _, err := p.Call(t.Context(), "reply", []json.RawMessage{json.RawMessage(`1`)}, json.RawMessage(`{}`))
	const want = `{"counts":{"a":2},"l":[[0,5]],"m":{"X":2,"Y":1},"n":[0,1]}`
	if err != nil || string(out) != want {
		t.Fatalf("Call = %s, %v; want %s", out, err, want)
	}
}

func TestGuardedCompile(t *testing.T) {
	if _, err := Compile(t.Context(), "r", "x = '$add'\n", nil, testLimits(Limits{})); err != nil {
		t.Errorf("Compile = %v", err)
	}
}

// TestAllocationBudgetOneStep: operations that build a large value in one
// step, or in few steps each copying a large value, are refused under a
// 1 MiB budget before they allocate much more than it.
func TestAllocationBudgetOneStep(t *testing.T) {
	tests := []struct{ name, body string }{
		{"join of a set with a big separator", "sep = 'x' * (1 << 16)\n    st = set([str(i) for i in range(1000)])\n    return len(sep.join(st))"},
		{"join of a dict with a big separator", "sep = 'x' * (1 << 16)\n    d = {str(i): 1 for i in range(1000)}\n    return len(sep.join(d))"},
		{"format with a repeated keyword", "s = 'x' * (1 << 16)\n    return len(('{a}' * 1000).format(a=s))"},
		{"percent with a mapping", "s = 'x' * (1 << 16)\n    return len(('%(a)s' * 1000) % {'a': s})"},
		{"upper retained", "s = 'x' * (1 << 16)\n    k = []\n    for i in range(1000):\n        k.append(s.upper())\n    return len(k)"},
		{"split retained", "s = ',' * (1 << 16)\n    k = []\n    for i in range(100):\n        k.append(s.split(','))\n    return len(k)"},
		{"whitespace split retained", "s = ' x' * (1 << 15)\n    k = []\n    for i in range(100):\n        k.append(s.split())\n    return len(k)"},
		{"json.decode retained", "s = '[' + '[],' * (1 << 14) + '[]]'\n    k = []\n    for i in range(100):\n        k.append(json.decode(s))\n    return len(k)"},
		{"list slice copies", "l = [0] * (1 << 12)\n    k = []\n    for i in range(1000):\n        k.append(l[:])\n    return len(k)"},
		{"string slice copies", "s = 'x' * (1 << 16)\n    k = []\n    for i in range(1000):\n        k.append(s[::1])\n    return len(k)"},
		{"dict items retained", "d = {i: i for i in range(4000)}\n    k = []\n    for i in range(1000):\n        k.append(d.items())\n    return len(k)"},
		{"bytes retained", "s = 'x' * (1 << 16)\n    k = []\n    for i in range(1000):\n        k.append(bytes(s))\n    return len(k)"},
		{"set union method retained", "a = set(range(4000))\n    k = []\n    for i in range(1000):\n        k.append(a.union(a))\n    return len(k)"},
		{"set union retained", "a = set(range(4000))\n    k = []\n    for i in range(1000):\n        k.append(a | a)\n    return len(k)"},
		{"bigint squaring", "x = 3\n    for i in range(23):\n        x = x * x\n    return x % 7"},
		{"bigint shifting", "x = 1\n    for i in range(100000):\n        x = x << 500\n    return x % 7"},
		{"str of deep nesting", "s = 'x' * (1 << 16)\n    x = [s] * 100\n    for i in range(70):\n        x = [x]\n    return len(str(x))"},
		{"str of a set of tuples", "s = 'x' * (1 << 10)\n    t = tuple([s] * 1000)\n    return len(str(set([t])))"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Compile(t.Context(), "r", "def reply(q, m):\n    "+tt.body+"\n", nil, testLimits(Limits{Timeout: time.Minute, MaxSteps: 10_000_000, MaxAllocBytes: 1 << 20}))
			if err != nil {
				t.Fatal(err)
			}
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			out, _, err := p.Call(t.Context(), "reply", []json.RawMessage{json.RawMessage(`1`)}, json.RawMessage(`{}`))
			runtime.ReadMemStats(&after)
			if !errors.Is(err, ErrBudget) || !strings.Contains(err.Error(), "allocation budget") {
				t.Fatalf("Call = %s, %v; want the allocation budget's ErrBudget", out, err)
			}
			if got := after.TotalAlloc - before.TotalAlloc; got > 16<<20 {
				t.Errorf("allocated %d MiB before the refusal, want little over the 1 MiB budget", got>>20)
			}
		})
	}
}

// TestGuardedSemanticsMore: the newly guarded operations keep their
// meaning, and growing a list by += is charged only what it adds.
func TestGuardedSemanticsMore(t *testing.T) {
	src := `
def reply(q, m):
    l = []
    for i in range(5000):
        l += [i]
    d = {"a": 1}
    d |= {"b": 2}
    c = []
    c.append(c)
    return {
        "c": str(c), "un": sorted(set([1]).union([2], [3])),
        "n": len(l), "d": d, "s": "abcdef"[1:4], "r": [1, 2, 3][::-1], "t": "abc"[-2:],
        "u": "aB".upper() + "aB".lower(), "sp": "a,b".split(","), "ws": " a  b ".split(),
        "rs": "a,b,c".rsplit(",", 1), "sl": "a\nb".splitlines(), "pa": "a=b".partition("="),
        "f": "{a}{a}{0}".format("z", a="y"), "p": "%(a)s%(a)s" % {"a": "w"},
        "j": "-".join(set(["x"])), "i": sorted(d.items()), "k": sorted(d.keys()),
        "set": sorted(set([1, 2]) | set([3])), "x": 6 ^ 3, "o": 4 | 1, "a": 7 & 2, "sh": 1 << 3,
        "b": len(bytes("hi")), "big": (1 << 70) * 3 % 1000,
    }
`
	p, err := Compile(t.Context(), "r", src, nil, testLimits(Limits{MaxAllocBytes: 1 << 20}))
	if err != nil {
		t.Fatal(err)
	}
	out, _, err := p.Call(t.Context(), "reply", []json.RawMessage{json.RawMessage(`1`)}, json.RawMessage(`{}`))
	const want = `{"a":2,"b":2,"big":272,"c":"[[...]]","d":{"a":1,"b":2},"f":"yyz","i":[["a",1],["b",2]],"j":"x","k":["a","b"],"n":5000,"o":5,"p":"ww","pa":["a","=","b"],"r":[3,2,1],"rs":["a,b","c"],"s":"bcd","set":[1,2,3],"sh":8,"sl":["a","b"],"sp":["a","b"],"t":"bc","u":"ABab","un":[1,2,3],"ws":["a","b"],"x":5}`
	if err != nil || string(out) != want {
		t.Fatalf("Call = %s, %v;\nwant %s", out, err, want)
	}
}

// TestPoolCallerGone: a caller whose context ends while it waits for a
// worker gets its context's error, not the pool's.
func TestPoolCallerGone(t *testing.T) {
	pool := newTestPool(t, PoolOptions{Workers: 1})
	w, err := pool.acquire(t.Context(), "a", time.Now().Add(time.Second), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.release(w)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Millisecond)
	defer cancel()
	_, err = pool.acquire(ctx, "b", time.Now().Add(time.Minute), time.Minute)
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrBusy) || errors.Is(err, ErrBudget) {
		t.Fatalf("acquire = %v, want context.DeadlineExceeded only", err)
	}
}

// TestLateResult: a run that completes after its wall time fails, even when
// the work that overran was one uninterruptible step.
func TestLateResult(t *testing.T) {
	slow := FuncTool(func(ctx context.Context, _ json.RawMessage) (json.RawMessage, error) {
		time.Sleep(60 * time.Millisecond)
		return json.RawMessage(`1`), nil
	})
	p, err := Compile(t.Context(), "r", "def reply(q, m):\n    return t(1)\n", map[string]Tool{"t": slow}, testLimits(Limits{Timeout: 20 * time.Millisecond}))
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
	p, err := Compile(t.Context(), "r", "s = 'x' * 60000\nbig = [s] * 1000\ndef reply(q, m):\n    return big\n", nil, testLimits(Limits{MaxOutputBytes: 64 << 10, MaxAllocBytes: 1 << 20}))
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
	pool := newTestPool(t, PoolOptions{Workers: 1})
	p, err := Compile(t.Context(), "r", "def reply(q, m):\n    return 1\n", nil, testLimits(Limits{Pool: pool, Timeout: 10 * time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	w, err := pool.acquire(t.Context(), "someone else", time.Now().Add(time.Second), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	if _, _, err := p.Call(ctx, "reply", []json.RawMessage{json.RawMessage(`1`)}, json.RawMessage(`{}`)); err == nil || errors.Is(err, ErrBusy) == errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Call with no free worker = %v, want the caller's deadline", err)
	}
	short, err := Compile(t.Context(), "r", "def reply(q, m):\n    return 1\n", nil, testLimits(Limits{Pool: pool, Timeout: 20 * time.Millisecond}))
	if err == nil {
		_, _, err = short.Call(t.Context(), "reply", []json.RawMessage{json.RawMessage(`1`)}, json.RawMessage(`{}`))
	}
	if !errors.Is(err, ErrBusy) {
		t.Fatalf("Compile or Call with no free worker = %v, want ErrBusy", err)
	}
	pool.release(w)
	if out, _, err := p.Call(t.Context(), "reply", []json.RawMessage{json.RawMessage(`1`)}, json.RawMessage(`{}`)); err != nil || string(out) != "1" {
		t.Fatalf("Call = %s, %v", out, err)
	}
}

// TestTimeBudgetIsMarked: a run stopped by its wall time matches
// ErrTimeBudget; one stopped by its step budget does not.
func TestTimeBudgetIsMarked(t *testing.T) {
	loop := "def reply(q, m):\n    while True:\n        pass\n"
	for _, tc := range []struct {
		name     string
		limits   Limits
		wantTime bool
	}{
		{"wall time", testLimits(Limits{MaxSteps: 1 << 62, Timeout: 20 * time.Millisecond}), true},
		{"steps", testLimits(Limits{MaxSteps: 1000, Timeout: 10 * time.Second}), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Compile(t.Context(), "r", loop, nil, tc.limits)
			if err != nil {
				t.Fatal(err)
			}
			_, _, err = p.Call(t.Context(), "reply", []json.RawMessage{json.RawMessage(`1`)}, json.RawMessage(`{}`))
			if !errors.Is(err, ErrBudget) || errors.Is(err, ErrTimeBudget) != tc.wantTime {
				t.Errorf("Call error = %v; want ErrBudget, ErrTimeBudget %v", err, tc.wantTime)
			}
		})
	}
}
