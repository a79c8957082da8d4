package routine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// slack is the generous margin the time bounds below allow on top of a
// run's budget and the pool's kill margin: the bound under test is
// budget + KillMargin, but a loaded 2-core CI machine (and -race) can
// delay the kill's delivery and the test's own goroutines by seconds. A run
// that is never stopped fails the bound by far more: it runs forever.
const slack = 5 * time.Second

// killMargin is the boundary's stated margin (the PoolOptions.KillMargin
// newTestPool gives, the dispatcher's default): a run ends within its budget plus this.
const killMargin = 250 * time.Millisecond

// TestBoundary runs the bad inputs through real worker processes
// and checks, for each: the failure kind, the time bound, that another
// agent's calls all succeed while it runs, that the workers are idle after
// it; and, at the end, the memory bound.
func TestBoundary(t *testing.T) {
	const budget = 500 * time.Millisecond
	// Two workers: an agent's share is one, so the bad runs (agent a) hold
	// one and the victim keeps the other.
	pool := newTestPool(t, PoolOptions{Workers: 2, MemoryBytes: 256 << 20})
	limits := testLimits(Limits{Pool: pool, Timeout: budget})
	// The victim's budget is generous, so that a loaded machine does not
	// make its good calls fail; that it never waits behind a bad run is
	// checked directly: none of its calls ever waits for a worker.
	victim, err := Compile(t.Context(), "clients/c/agents/victim/routines/r", "def reply(q, m):\n    return {'echo': q}\n", nil, testLimits(Limits{Pool: pool, Timeout: time.Minute}))
	if err != nil {
		t.Fatal(err)
	}
	victimWaits := countWaits(pool, "clients/c/agents/victim")
	parentBefore := peakSelf(t)
	body := func(expr string) string { return "def reply(q, m):\n    return " + expr + "\n" }
	loop := func(stmts string) string { return "def reply(q, m):\n" + stmts + "\n    return 1\n" }
	huge := "1 << 62"
	cases := []struct {
		name   string
		src    string
		arg    string
		limits *Limits
		// compiles: the source compiles, and the call is what fails (a
		// compile that fails instead, a loaded machine making it run past
		// its budget say, must not pass for the call's failure).
		compiles bool
		kinds    []Kind // acceptable kinds; the first is the expected one
	}{
		{"all over a huge range (one builtin, no steps)", body("all(range(1, " + huge + "))"), "1", nil, true, []Kind{KindTime}},
		// The bounded builtins (max over 30M, int of a million
		// digits, sorted over 4M took 1.2–2 s), ten times larger: on a
		// quick machine the originals can end within this table's budget.
		{"max over 300M", body("max(range(300000000))"), "1", nil, true, []Kind{KindTime}},
		{"int of ten million digits", body(`int("9" * 10000000)`), "1", nil, true, []Kind{KindTime}},
		{"sorted over 40M", body("sorted(range(40000000))"), "1", nil, true, []Kind{KindTime, KindMemory}},
		{"json.decode of half a million levels", body(`json.decode("[" * 500000 + "]" * 500000)`), "1", nil, true, []Kind{KindError}},
		{"a query nested half a million levels", body("q"), strings.Repeat("[", 500000) + strings.Repeat("]", 500000), nil, true, []Kind{KindError}},
		{"recursion", "def f(n):\n    return f(n + 1)\ndef reply(q, m):\n    return f(0)\n", "1", nil, true, []Kind{KindError}},
		{"while True", loop("    while True:\n        pass"), "1", nil, true, []Kind{KindSteps, KindTime}},
		// The doubling loops reach the allocation budget in a few rounds,
		// unless a slow machine (or -race) reaches the wall time first.
		{"string doubling", loop("    s = 'x'\n    while True:\n        s = s + s"), "1", nil, true, []Kind{KindMemory, KindTime}},
		{"list doubling", loop("    l = [0]\n    while True:\n        l = l + l"), "1", nil, true, []Kind{KindMemory, KindTime}},
		{"list doubling in place", loop("    l = [0]\n    while True:\n        l += l"), "1", nil, true, []Kind{KindMemory, KindTime}},
		{"dict doubling", loop("    d = {0: 0}\n    while True:\n        d = d | {k + len(d): v for k, v in d.items()}"), "1", nil, true, []Kind{KindMemory, KindSteps, KindTime}},
		{"set doubling", loop("    s = set([0])\n    while True:\n        s = s.union([x + len(s) for x in s])"), "1", nil, true, []Kind{KindMemory, KindSteps, KindTime}},
		{"a large shift", body("1 << (1 << 30)"), "1", nil, true, []Kind{KindMemory}},
		{"a power (no ** in Starlark)", body("10 ** 10 ** 8"), "1", nil, false, []Kind{KindError}},
		{"sorted", body("sorted(range(" + huge + "))"), "1", nil, true, []Kind{KindMemory}},
		{"max", body("max(range(" + huge + "))"), "1", nil, true, []Kind{KindTime}},
		{"min", body("min(range(" + huge + ", 0, -1))"), "1", nil, true, []Kind{KindTime}},
		{"any", body("any([0] * (1 << 30))"), "1", nil, true, []Kind{KindMemory}},
		{"enumerate", body("enumerate(range(" + huge + "))"), "1", nil, true, []Kind{KindMemory}},
		{"zip", body("zip(range(" + huge + "), range(" + huge + "))"), "1", nil, true, []Kind{KindMemory}},
		{"reversed", body("reversed(range(" + huge + "))"), "1", nil, true, []Kind{KindMemory}},
		{"str.join", body(`("ab" * (1 << 20)).join(["a"] * (1 << 16))`), "1", nil, true, []Kind{KindMemory}},
		{"str.replace", body(`("x" * (1 << 24)).replace("x", "yyyy")`), "1", nil, true, []Kind{KindMemory}},
		{"str.split", body(`("x " * (1 << 22)).split(" ")`), "1", nil, true, []Kind{KindMemory}},
		{"% formatting", loop("    s = 'x' * (1 << 24)\n    t = '%s%s%s%s%s' % (s, s, s, s, s)"), "1", nil, true, []Kind{KindMemory}},
		{"a huge result", body(`"x" * 100000`), "1", nil, true, []Kind{KindOutput}},
		{"a deeply nested result", "def reply(q, m):\n    x = []\n    for i in range(1000):\n        x = [x]\n    return x\n", "1", nil, true, []Kind{KindOutput}},
		{"print in a loop", loop("    while True:\n        print('x')"), "1", nil, true, []Kind{KindSteps, KindTime}},
		{"past the worker's memory cap (the guard set too high to see it)", body(`len("x" * (1 << 29))`), "1",
			new(testLimits(Limits{Pool: pool, Timeout: budget, MaxAllocBytes: 8 << 30})), true, []Kind{KindMemory}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := limits
			if tc.limits != nil {
				l = *tc.limits
			}
			if tc.kinds[0] != KindTime {
				// Cases that other budgets stop get a wall time no loaded
				// machine reaches first, so their kind is deterministic.
				l.Timeout = 5 * time.Second
			}
			// Compile, then Call: each is one run with its own budget.
			bound := 2 * (l.Timeout + killMargin + slack)
			done := make(chan error, 1)
			var ran time.Duration // the failing run's wall time, for the log
			var compileErr error
			go func() {
				start := time.Now()
				p, err := Compile(t.Context(), "clients/c/agents/a/routines/r", tc.src, nil, l)
				compileErr = err
				if err == nil {
					start = time.Now()
					_, _, err = p.Call(t.Context(), "reply", []json.RawMessage{json.RawMessage(tc.arg)}, json.RawMessage(`{}`))
				}
				ran = time.Since(start)
				done <- err
			}()
			// Another agent's calls, made while the run goes on, all
			// succeed (polled every 10 ms, so they do not load the machine
			// themselves).
			var err error
			timeout := time.After(bound)
			for calls, running := 0, true; running; calls++ {
				select {
				case err = <-done:
					running = false
					continue
				case <-timeout:
					t.Fatalf("the run was not stopped within %v (stated margin included)", bound)
				default:
				}
				q := strconv.Itoa(calls)
				out, _, verr := victim.Call(t.Context(), "reply", []json.RawMessage{json.RawMessage(q)}, json.RawMessage(`{}`))
				if verr != nil || string(out) != `{"echo":`+q+`}` {
					t.Fatalf("another agent's call %d during the run = %s, %v", calls, out, verr)
				}
				time.Sleep(10 * time.Millisecond)
			}
			if n := victimWaits.Load(); n != 0 {
				t.Errorf("another agent's calls waited for a worker %d times during the run, want never", n)
			}
			if err == nil {
				t.Fatal("the run succeeded, want a failure")
			}
			switch {
			case tc.compiles && compileErr != nil:
				t.Fatalf("Compile = %v, want success: the call is what should fail", compileErr)
			case !tc.compiles && compileErr == nil:
				t.Fatalf("Compile succeeded and the call failed with %v, want the compile to fail", err)
			}
			if k := KindOf(err); !slices.Contains(tc.kinds, k) {
				t.Errorf("kind %v (%v), want one of %v", k, err, tc.kinds)
			}
			stopped := time.Now()
			waitIdle(t, pool)
			t.Logf("kind %v after %v (budget %v); workers idle %v later", KindOf(err), ran.Round(time.Millisecond), l.Timeout, time.Since(stopped).Round(time.Millisecond))
		})
	}
	stats := pool.Stats()
	if stats.Kills[KindTime] == 0 || stats.Kills[KindMemory] == 0 {
		t.Errorf("kills by kind %v, want time and memory kills", stats.Kills)
	}
	_ = pool.Close()
	// A worker holds at most its cap above its start size; its start size
	// (the binary's pages, the runtime, and under -race the detector's own
	// memory) is the fixed overhead, stated here as 256 MiB. Under -race the
	// detector's shadow grows with the heap, and a run on a loaded machine
	// (late collections) was measured at 456 MiB against 448 with 192.
	const overhead = 256 << 20
	if got, bound := pool.Stats().PeakRSS, pool.Options().MemoryBytes+overhead; got > bound || got == 0 {
		t.Errorf("a worker's peak RSS was %d MiB, want at most %d MiB", got>>20, bound>>20)
	}
	// The server side parses nothing deep and holds nothing big.
	if grew := peakSelf(t) - parentBefore; grew > 128<<20 {
		t.Errorf("the test process's peak RSS grew %d MiB during the table, want under 128", grew>>20)
	}
}

// TestFairShare: 64 concurrent runaway calls from one agent take only
// that agent's share; another agent's calls, made during the attack, all
// succeed, and the attacker's excess gets ErrBusy.
func TestFairShare(t *testing.T) {
	pool := newTestPool(t, PoolOptions{Workers: 4})
	runaway, err := Compile(t.Context(), "clients/c/agents/attacker/routines/r", "def reply(q, m):\n    return all(range(1, 1 << 62))\n", nil, testLimits(Limits{Pool: pool, Timeout: 2 * time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	// The victim's budget is generous (a loaded machine does not make its
	// calls fail); that it never waits behind the runaways is checked
	// directly.
	victim, err := Compile(t.Context(), "clients/c/agents/victim/routines/r", "def reply(q, m):\n    return {'echo': q}\n", nil, testLimits(Limits{Pool: pool, Timeout: time.Minute}))
	if err != nil {
		t.Fatal(err)
	}
	victimWaits := countWaits(pool, "clients/c/agents/victim")
	var wg sync.WaitGroup
	var mu sync.Mutex
	kinds := map[string]int{}
	attackDone := make(chan struct{})
	for range 64 {
		wg.Go(func() {
			_, _, err := runaway.Call(t.Context(), "reply", []json.RawMessage{json.RawMessage(`1`)}, json.RawMessage(`{}`))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case errors.Is(err, ErrBusy):
				kinds["busy"]++
			case err != nil:
				kinds[KindOf(err).String()]++
			default:
				kinds["ok"]++
			}
		})
	}
	go func() { wg.Wait(); close(attackDone) }()
	calls := 0
	for attacking := true; attacking || calls < 20; calls++ {
		select {
		case <-attackDone:
			attacking = false
		default:
		}
		q := strconv.Itoa(calls)
		out, _, err := victim.Call(t.Context(), "reply", []json.RawMessage{json.RawMessage(q)}, json.RawMessage(`{}`))
		if err != nil || string(out) != `{"echo":`+q+`}` {
			t.Fatalf("the victim's call %d during the attack = %s, %v", calls, out, err)
		}
	}
	if kinds["time"] == 0 || kinds["busy"] == 0 || kinds["ok"] != 0 || kinds["time"]+kinds["busy"] != 64 {
		t.Errorf("the attacker's 64 calls ended %v, want time kills and busy failures only", kinds)
	}
	if n := victimWaits.Load(); n != 0 {
		t.Errorf("the victim's calls waited for a worker %d times during the attack, want never", n)
	}
	waitIdle(t, pool)
}

// TestFairShare_twoFloodersAndAQuietAgent: two agents flood the pool at
// once with slow calls (each waits in a tool until the test ends, so no
// worker they hold frees up); once every flood call holds room or waits
// for it, a third agent's calls all succeed, one at a time and several at
// once, and the flooders' excess is theirs alone to wait for.
func TestFairShare_twoFloodersAndAQuietAgent(t *testing.T) {
	pool := newTestPool(t, PoolOptions{Workers: 4})
	release := make(chan struct{})
	wait := FuncTool(func(ctx context.Context, _ json.RawMessage) (json.RawMessage, error) {
		select {
		case <-release:
			return json.RawMessage(`1`), nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	})
	const flood = 16
	var wg sync.WaitGroup
	var mu sync.Mutex
	floodErrs := map[string]int{}
	for _, agent := range []string{"clients/c/agents/a", "clients/c/agents/b"} {
		slow, err := Compile(t.Context(), agent+"/routines/r", "def reply(q, m):\n    return wait(q)\n", map[string]Tool{"wait": wait},
			testLimits(Limits{Pool: pool, Timeout: time.Minute}))
		if err != nil {
			t.Fatal(err)
		}
		for range flood {
			wg.Go(func() {
				_, _, err := slow.Call(t.Context(), "reply", []json.RawMessage{json.RawMessage(`1`)}, json.RawMessage(`{}`))
				if err != nil {
					mu.Lock()
					floodErrs[err.Error()]++
					mu.Unlock()
				}
			})
		}
	}
	defer wg.Wait()
	defer close(release)
	// Settled: every flood call holds room on a worker or waits for it.
	for _, agent := range []string{"clients/c/agents/a", "clients/c/agents/b"} {
		waitSettled(t, pool, agent, flood)
	}
	pool.mu.Lock()
	t.Logf("the flooders hold %d and %d workers; %d free", len(pool.agents["clients/c/agents/a"].held), len(pool.agents["clients/c/agents/b"].held), len(pool.free))
	pool.mu.Unlock()
	quietWaits := countWaits(pool, "clients/c/agents/quiet")
	quiet, err := Compile(t.Context(), "clients/c/agents/quiet/routines/r", "def reply(q, m):\n    return {'echo': q}\n", nil,
		testLimits(Limits{Pool: pool, Timeout: time.Minute}))
	if err != nil {
		t.Fatalf("the quiet agent's compile during the flood = %v", err)
	}
	call := func(i int) error {
		q := strconv.Itoa(i)
		out, _, err := quiet.Call(t.Context(), "reply", []json.RawMessage{json.RawMessage(q)}, json.RawMessage(`{}`))
		if err == nil && string(out) != `{"echo":`+q+`}` {
			err = fmt.Errorf("answer %s", out)
		}
		return err
	}
	for i := range 20 {
		if err := call(i); err != nil {
			t.Fatalf("the quiet agent's call %d during the flood = %v", i, err)
		}
	}
	if n := quietWaits.Load(); n != 0 {
		t.Errorf("the quiet agent's compile and calls one at a time waited for a worker %d times, want never", n)
	}
	// All at once they may wait for each other (the agent's own calls),
	// never for the flood.
	errs := make(chan error, 8)
	for i := range 8 {
		go func() { errs <- call(100 + i) }()
	}
	for range 8 {
		if err := <-errs; err != nil {
			t.Errorf("the quiet agent's concurrent call during the flood = %v", err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(floodErrs) != 0 {
		t.Errorf("flood calls failed before the test released them: %v", floodErrs)
	}
}

// TestFairShare_newcomerFirst: when a newcomer has taken the last free
// worker, an agent holding two gives one back as soon as a call on it
// ends, and a freed worker goes to the waiting agent holding the fewest.
func TestFairShare_newcomerFirst(t *testing.T) {
	pool := newTestPool(t, PoolOptions{Workers: 4})
	until := time.Now().Add(time.Minute)
	acquire := func(agent string) *worker {
		t.Helper()
		w, err := pool.acquire(t.Context(), agent, until, time.Minute)
		if err != nil {
			t.Fatalf("acquire for %s: %v", agent, err)
		}
		return w
	}
	// a takes half the workers, and no more while so few are free.
	a1, a2 := acquire("a"), acquire("a")
	if a1 == a2 {
		t.Fatal("a's second call shares its first worker; want a second worker (calls are pipelined only behind a worker's running call)")
	}
	pool.mu.Lock()
	mayA := pool.mayLease(pool.agents["a"], len(pool.free))
	pool.mu.Unlock()
	if mayA {
		t.Fatal("a holding 2 of 4 workers may lease a third")
	}
	b1, c1 := acquire("b"), acquire("c") // c takes the last free worker
	if b1 == a1 || b1 == a2 || c1 == a1 || c1 == a2 || b1 == c1 {
		t.Fatal("b or c shares a worker")
	}
	for range pipelineDepth - 1 { // b's worker is full
		if w := acquire("b"); w != b1 {
			t.Fatal("b's calls took a second worker")
		}
	}
	// A call of b, then one of d, wait for room: a freed worker goes to d,
	// who holds none, though b began to wait first.
	waiting := func(agent string) chan *worker {
		got := make(chan *worker, 1)
		go func() {
			w, err := pool.acquire(t.Context(), agent, until, time.Minute)
			if err != nil {
				t.Error(err)
			}
			got <- w
		}()
		return got
	}
	pool.mu.Lock()
	seq := pool.seq
	pool.mu.Unlock()
	b2 := waiting("b")
	waitSeq(t, pool, seq+1)
	d := waiting("d")
	waitSeq(t, pool, seq+2)
	pool.release(a1) // a holds 2 and none is free: a1 goes back
	if w := <-d; w != a1 {
		t.Fatalf("d got %p, want the worker a gave back, %p", w, a1)
	}
	// c goes idle: its worker is free again, and stays free for the next
	// newcomer: b, holding one, waits for its own.
	pool.release(c1)
	pool.mu.Lock()
	free, bWaits := len(pool.free), len(pool.agents["b"].waiters)
	pool.mu.Unlock()
	if free != 1 || bWaits != 1 {
		t.Fatalf("after c went idle: %d free, %d calls of b waiting; want 1 and 1", free, bWaits)
	}
	pool.release(b1)
	if w := <-b2; w != b1 {
		t.Fatalf("b got %p, want its own worker %p", w, b1)
	}
	for _, w := range []*worker{a1, a2, b1, b1, b1, b1} {
		pool.release(w)
	}
	waitIdle(t, pool)
}

// waitSeq waits until the pool's seq-th call waits for room.
func waitSeq(t *testing.T, p *Pool, seq uint64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		p.mu.Lock()
		got := p.seq
		p.mu.Unlock()
		if got >= seq {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d calls waited, want %d", got, seq)
		}
		time.Sleep(time.Millisecond)
	}
}

// countWaits counts the calls of agent that wait for a worker.
func countWaits(p *Pool, agent string) *atomic.Int64 {
	var n atomic.Int64
	p.mu.Lock()
	p.waits = func(a string) {
		if a == agent {
			n.Add(1)
		}
	}
	p.mu.Unlock()
	return &n
}

// waitSettled waits until agent's n calls all hold room on its workers or
// wait for room.
func waitSettled(t *testing.T, p *Pool, agent string, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		p.mu.Lock()
		got := -1
		if sh := p.agents[agent]; sh != nil {
			got = len(sh.waiters)
			for _, w := range sh.held {
				got += w.load
			}
		}
		p.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent %s has %d of its %d calls on a worker or waiting", agent, got, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestToolCallbacks: a tool that is not a table is answered by the server
// during the run, and a table tool in the worker itself.
func TestToolCallbacks(t *testing.T) {
	pool := newTestPool(t, PoolOptions{Workers: 1})
	var seen []string
	echo := FuncTool(func(_ context.Context, arg json.RawMessage) (json.RawMessage, error) {
		seen = append(seen, string(arg))
		if string(arg) == `"fail"` {
			return nil, errors.New("declined")
		}
		return json.RawMessage(`{"got":` + string(arg) + `}`), nil
	})
	table, err := TableTool(`{"Paris": 7}`)
	if err != nil {
		t.Fatal(err)
	}
	p, err := Compile(t.Context(), "r", "def reply(q, m):\n    m['n'] = 1\n    return [echo(q), t('Paris'), call_tool('echo', [1])]\ndef fail(q):\n    return echo('fail')\n", map[string]Tool{"echo": echo, "t": table}, testLimits(Limits{Pool: pool}))
	if err != nil {
		t.Fatal(err)
	}
	if !p.Has("reply") || p.Has("nope") || fmt.Sprint(p.Functions()) != "[fail reply]" {
		t.Errorf("Has/Functions = %v", p.Functions())
	}
	out, mem, err := p.Call(t.Context(), "reply", []json.RawMessage{json.RawMessage(`"hi"`)}, json.RawMessage(`{}`))
	if err != nil || string(out) != `[{"got":"hi"},7,{"got":[1]}]` || string(mem) != `{"n":1}` {
		t.Fatalf("Call = %s, %s, %v", out, mem, err)
	}
	if _, _, err := p.Call(t.Context(), "fail", []json.RawMessage{json.RawMessage(`1`)}, nil); err == nil || !strings.Contains(err.Error(), "declined") || KindOf(err) != KindError {
		t.Fatalf("Call of a failing tool = %v, want the tool's error", err)
	}
	if len(seen) != 3 {
		t.Errorf("the server answered %d tool calls (%v), want 3", len(seen), seen)
	}
}

// waitIdle waits until every worker slot is back in the pool and every
// live worker is asleep on its pipe: nothing a killed or failed run left
// behind keeps burning CPU. A worker may spend a moment in its garbage
// collector after a large run, so the wait allows a generous 5 s.
func waitIdle(t *testing.T, p *Pool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		p.mu.Lock()
		free := len(p.free)
		p.mu.Unlock()
		busy := fmt.Sprintf("%d of %d worker slots back", free, p.opts.Workers)
		if free == p.opts.Workers {
			busy = ""
			for _, pid := range p.Stats().Workers {
				if s := procState(t, pid); s != "S" {
					busy = fmt.Sprintf("worker %d in state %s", pid, s)
				}
			}
		}
		if busy == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pool is not idle: %s", busy)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// procState is a process's state letter (R running, S asleep, …), or "gone".
func procState(t *testing.T, pid int) string {
	t.Helper()
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "gone"
	}
	// The state follows the command name in parentheses.
	return strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))[0]
}

// peakSelf is this process's peak RSS, in bytes.
func peakSelf(t *testing.T) int64 {
	t.Helper()
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(status)) {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmHWM")
	return 0
}

// TestFrameCap: a worker that announces a frame larger than its run's
// limits allow (a result and memory, or a tool's argument, each at most
// the output cap; the program's names) is killed, and the run fails with
// kind output, without the server reading or allocating the frame.
func TestFrameCap(t *testing.T) {
	for _, mode := range []string{"compile", "call"} {
		t.Run(mode, func(t *testing.T) {
			pool := newTestPool(t, PoolOptions{Workers: 1, Executable: rogueWorker(t, mode)})
			before := peakSelf(t)
			done := make(chan error, 1)
			go func() {
				p, err := Compile(t.Context(), "clients/c/agents/a/routines/r", "def reply(q, m):\n    return q\n", nil, testLimits(Limits{Pool: pool, Timeout: 5 * time.Second}))
				if err == nil {
					_, _, err = p.Call(t.Context(), "reply", []json.RawMessage{json.RawMessage(`1`)}, json.RawMessage(`{}`))
				}
				done <- err
			}()
			var err error
			select {
			case err = <-done:
			case <-time.After(5*time.Second + killMargin + slack):
				t.Fatal("the run did not end")
			}
			if KindOf(err) != KindOutput || !strings.Contains(err.Error(), "over the cap") {
				t.Fatalf("run = %v (kind %v), want kind output naming the frame cap", err, KindOf(err))
			}
			if got := pool.Stats().Kills[KindOutput]; got != 1 {
				t.Errorf("output kills = %d, want 1", got)
			}
			waitIdle(t, pool)
			// 200 MiB was announced; the server reads only its header.
			if grew := peakSelf(t) - before; grew > 64<<20 {
				t.Errorf("the test process's peak RSS grew %d MiB, want under 64", grew>>20)
			}
		})
	}
}

// TestToolArgumentCap: a tool's argument gets the output cap, whether the
// tool is answered in the worker (a table) or by the server.
func TestToolArgumentCap(t *testing.T) {
	table, err := TableTool(`{"k": 1}`)
	if err != nil {
		t.Fatal(err)
	}
	called := false
	server := FuncTool(func(context.Context, json.RawMessage) (json.RawMessage, error) {
		called = true
		return json.RawMessage(`1`), nil
	})
	pool := newTestPool(t, PoolOptions{Workers: 1})
	limits := testLimits(Limits{Pool: pool, MaxOutputBytes: 1 << 10})
	for _, src := range []string{
		"def reply(q):\n    return table('x' * 2000)\n",
		"def reply(q):\n    return table(['x'] * 500)\n",
		"def reply(q):\n    return server({'k': 'x' * 2000})\n",
	} {
		p, err := Compile(t.Context(), "clients/c/agents/a/routines/r", src, map[string]Tool{"table": table, "server": server}, limits)
		if err != nil {
			t.Fatal(err)
		}
		_, _, err = p.Call(t.Context(), "reply", []json.RawMessage{json.RawMessage(`1`)}, nil)
		if KindOf(err) != KindOutput || !strings.Contains(err.Error(), "argument of tool") {
			t.Errorf("%q: Call = %v (kind %v), want kind output naming the argument", src, err, KindOf(err))
		}
	}
	if called {
		t.Error("the server's tool was called with an argument over the cap")
	}
	// At the cap it still works.
	p, err := Compile(t.Context(), "clients/c/agents/a/routines/r", "def reply(q):\n    return server('x' * 1000)\n", map[string]Tool{"server": server}, limits)
	if err != nil {
		t.Fatal(err)
	}
	if out, _, err := p.Call(t.Context(), "reply", []json.RawMessage{json.RawMessage(`1`)}, nil); err != nil || string(out) != "1" {
		t.Errorf("Call with an argument under the cap = %s, %v, want 1", out, err)
	}
}

// TestCPULimit: with the wall-time kill out of the way (a kill margin of
// ten minutes), a run stuck in one builtin is still stopped, by the
// kernel's CPU limit: its budget (1 s) plus one to two seconds of CPU.
func TestCPULimit(t *testing.T) {
	pool := newTestPool(t, PoolOptions{Workers: 1, KillMargin: 10 * time.Minute})
	p, err := Compile(t.Context(), "clients/c/agents/a/routines/r", "def reply(q, m):\n    return all(range(1, 1 << 62))\n", nil, testLimits(Limits{Pool: pool, Timeout: time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, _, err := p.Call(t.Context(), "reply", []json.RawMessage{json.RawMessage(`1`)}, json.RawMessage(`{}`))
		done <- err
	}()
	select {
	case err = <-done:
	case <-time.After(3 * time.Minute): // 3 s of CPU, on a machine loaded far past anything seen
		t.Fatal("the run was not stopped by its CPU limit")
	}
	if KindOf(err) != KindTime || !strings.Contains(err.Error(), "CPU time budget") {
		t.Fatalf("Call = %v (kind %v), want kind time naming the CPU budget", err, KindOf(err))
	}
	waitIdle(t, pool)
}

// TestWorkerRecycling: a worker whose life's CPU left is less than a
// run's budget (plus the soft limit's slack) is replaced before the run,
// so the kernel's hard limit never kills it in one; every run succeeds.
func TestWorkerRecycling(t *testing.T) {
	// A run's budget is 2 s: with 6 s of life, a worker is replaced once it
	// has used 1 s. Each call is small (a few ms of CPU) so that a loaded
	// machine stretching its wall time stays far inside the 2 s budget.
	pool := newTestPool(t, PoolOptions{Workers: 1, WorkerCPU: 6 * time.Second})
	p, err := Compile(t.Context(), "clients/c/agents/a/routines/r", "def reply(q, m):\n    s = 0\n    for i in range(q):\n        s += i\n    return s\n", nil,
		testLimits(Limits{Pool: pool, Timeout: 2 * time.Second, MaxSteps: 1 << 30}))
	if err != nil {
		t.Fatal(err)
	}
	for calls := 0; pool.Stats().Recycled == 0; calls++ {
		if calls == 5000 {
			t.Fatalf("no worker recycled after %d calls (stats %+v)", calls, pool.Stats())
		}
		if _, _, err := p.Call(t.Context(), "reply", []json.RawMessage{json.RawMessage(`20000`)}, json.RawMessage(`{}`)); err != nil {
			t.Fatalf("call %d: %v", calls, err)
		}
	}
	if out, _, err := p.Call(t.Context(), "reply", []json.RawMessage{json.RawMessage(`3`)}, json.RawMessage(`{}`)); err != nil || string(out) != "3" {
		t.Fatalf("Call after the recycling = %s, %v, want 3", out, err)
	}
	if s := pool.Stats(); s.Started < 2 || len(s.Kills) != 0 {
		t.Errorf("stats %+v, want a second worker started and no kills", s)
	}
}
