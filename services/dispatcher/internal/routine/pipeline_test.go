package routine

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"
)

// TestPipelining: an agent's calls beyond the workers of its share take
// room on those workers, up to pipelineDepth calls each, without waiting;
// the next one waits, and gets room when one is released.
func TestPipelining(t *testing.T) {
	pool := newTestPool(t, PoolOptions{Workers: 2, AgentShare: 1})
	until := time.Now().Add(time.Minute)
	var held []*worker
	for i := range pipelineDepth {
		w, err := pool.acquire(t.Context(), "a", until, time.Minute)
		if err != nil {
			t.Fatalf("acquire %d: %v", i, err)
		}
		if i > 0 && w != held[0] {
			t.Fatalf("acquire %d leased a second worker, past the agent's share of 1", i)
		}
		held = append(held, w)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	if _, err := pool.acquire(ctx, "a", until, time.Minute); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("acquire past the share's pipelines = %v, want to wait (the caller's deadline)", err)
	}
	// Another agent has the other worker.
	other, err := pool.acquire(t.Context(), "b", until, time.Minute)
	if err != nil || other == held[0] {
		t.Fatalf("acquire of another agent = %v, %v, want the other worker", other, err)
	}
	pool.release(other)
	got := make(chan *worker, 1)
	go func() {
		w, err := pool.acquire(t.Context(), "a", until, time.Minute)
		if err != nil {
			t.Error(err)
		}
		got <- w
	}()
	pool.release(held[0])
	if w := <-got; w != held[0] {
		t.Fatalf("the waiting call got %p, want the worker with room, %p", w, held[0])
	}
	for _, w := range held {
		pool.release(w)
	}
	waitIdle(t, pool)
}

// TestPipelineRequeue: a call written behind its agent's runaway call, on
// the same worker, is sent again when the runaway's worker is killed, and
// succeeds on a fresh worker; the runaway is killed at its budget.
func TestPipelineRequeue(t *testing.T) {
	pool := newTestPool(t, PoolOptions{Workers: 2, AgentShare: 1})
	pool.fresh = time.Hour // however long the runaway has run when the call comes
	const name = "clients/c/agents/a/routines/r"
	runaway, err := Compile(t.Context(), name, "def reply(q, m):\n    return all(range(1, 1 << 62))\n", nil, testLimits(Limits{Pool: pool, Timeout: time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	normal, err := Compile(t.Context(), name, "def reply(q, m):\n    return q\n", nil, testLimits(Limits{Pool: pool, Timeout: 30 * time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	done := callAsync(t, runaway)
	// Once the runaway holds the agent's one worker, the normal call is
	// written behind it.
	first := waitLoad(t, pool, "clients/c/agents/a", 1)
	out, _, err := normal.Call(t.Context(), "reply", []json.RawMessage{json.RawMessage(`7`)}, json.RawMessage(`{}`))
	if err != nil || string(out) != "7" {
		t.Fatalf("the call behind the runaway = %s, %v, want 7", out, err)
	}
	if err := <-done; KindOf(err) != KindTime {
		t.Fatalf("the runaway = %v (kind %v), want kind time", err, KindOf(err))
	}
	if !first.dead.Load() {
		t.Error("the call was not run behind the runaway: its worker is alive")
	}
	if s := pool.Stats(); s.Kills[KindTime] != 1 || s.Started < 2 {
		t.Errorf("stats %+v, want one time kill and a second worker", s)
	}
	waitIdle(t, pool)
}

// TestPipelineBusy: a call written behind its agent's slow call, whose
// wait budget ends before the slow call does, is answered busy by the
// worker instead of starting late; the slow call succeeds.
func TestPipelineBusy(t *testing.T) {
	pool := newTestPool(t, PoolOptions{Workers: 2, AgentShare: 1})
	pool.fresh = time.Hour // however long the slow call has run when the next comes
	const name = "clients/c/agents/a/routines/r"
	const wait = 50 * time.Millisecond
	quick, err := Compile(t.Context(), name, "def reply(q, m):\n    return q\n", nil, testLimits(Limits{Pool: pool, Timeout: wait}))
	if err != nil {
		t.Fatal(err)
	}
	unblock := make(chan struct{})
	done := startSlow(t, pool, name, unblock)
	waitLoad(t, pool, "clients/c/agents/a", 1)
	start := time.Now()
	quickDone := callAsync(t, quick)
	waitLoad(t, pool, "clients/c/agents/a", 2)
	// The quick call is queued on the worker; let its wait budget pass
	// before the slow call ends.
	for time.Since(start) < 2*wait {
		time.Sleep(5 * time.Millisecond)
	}
	close(unblock)
	if err := <-done; err != nil {
		t.Fatalf("the slow call = %v", err)
	}
	if err := <-quickDone; !errors.Is(err, ErrBusy) {
		t.Fatalf("the call queued past its wait budget = %v, want ErrBusy", err)
	}
	if s := pool.Stats(); len(s.Kills) != 0 {
		t.Errorf("stats %+v, want no kills", s)
	}
	waitIdle(t, pool)
}

// TestPipelineNotBehindSlow: no call is written behind one that has run
// longer than pipelineFresh, nor behind a dry run (the anonymous share,
// shared by every agent): those calls wait for a worker as without
// pipelining.
func TestPipelineNotBehindSlow(t *testing.T) {
	for _, agent := range []string{"clients/c/agents/a", ""} {
		t.Run("agent "+agent, func(t *testing.T) {
			pool := newTestPool(t, PoolOptions{Workers: 2, AgentShare: 1})
			if agent == "" {
				pool.fresh = time.Hour
			}
			unblock := make(chan struct{})
			done := startSlow(t, pool, agent+"/routines/r", unblock)
			w := waitLoad(t, pool, agent, 1)
			for w.headStart.Load() == 0 || time.Since(time.Unix(0, w.headStart.Load())) <= pipelineFresh {
				time.Sleep(time.Millisecond)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
			defer cancel()
			if _, err := pool.acquire(ctx, agent, time.Now().Add(time.Minute), time.Minute); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("acquire behind a slow call = %v, want to wait (the caller's deadline)", err)
			}
			close(unblock)
			if err := <-done; err != nil {
				t.Fatalf("the slow call = %v", err)
			}
			waitIdle(t, pool)
		})
	}
}

// startSlow starts a call of a routine named name that waits in a tool
// until unblock is closed, and returns its outcome's channel.
func startSlow(t *testing.T, pool *Pool, name string, unblock chan struct{}) chan error {
	t.Helper()
	wait := FuncTool(func(context.Context, json.RawMessage) (json.RawMessage, error) {
		<-unblock
		return json.RawMessage(`1`), nil
	})
	slow, err := Compile(t.Context(), name, "def reply(q, m):\n    return wait(q)\n", map[string]Tool{"wait": wait}, testLimits(Limits{Pool: pool, Timeout: 30 * time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	return callAsync(t, slow)
}

// callAsync calls p's reply with 1 in the background and returns its
// outcome's channel.
func callAsync(t *testing.T, p *Program) chan error {
	done := make(chan error, 1)
	go func() {
		_, _, err := p.Call(t.Context(), "reply", []json.RawMessage{json.RawMessage(`1`)}, json.RawMessage(`{}`))
		done <- err
	}()
	return done
}

// waitLoad waits until agent holds one worker with load calls on it, and
// returns it.
func waitLoad(t *testing.T, p *Pool, agent string, load int) *worker {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		p.mu.Lock()
		var w *worker
		if sh := p.agents[agent]; sh != nil && len(sh.held) == 1 && sh.held[0].load == load {
			w = sh.held[0]
		}
		p.mu.Unlock()
		if w != nil {
			return w
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent %s holds no worker with %d calls", agent, load)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestSlowWorkerStart: the time a call spends starting its own worker is
// not waiting behind other calls, so it does not use up the call's wait
// budget: a call whose worker takes longer to start than its budget still
// runs (under -race on a loaded machine a worker takes about a second to
// start, and first calls failed busy).
func TestSlowWorkerStart(t *testing.T) {
	pool := newTestPool(t, PoolOptions{Workers: 2, Executable: rogueWorker(t, "slowstart")})
	const budget = slowStart / 5
	p, err := Compile(t.Context(), "clients/c/agents/a/routines/r", "def reply(q, m):\n    return q\n", nil, testLimits(Limits{Pool: pool, Timeout: budget}))
	if err != nil {
		t.Fatal(err)
	}
	// The compile started one worker and gave it back; the call takes the
	// other slot, whose worker is not started yet.
	out, _, err := p.Call(t.Context(), "reply", []json.RawMessage{json.RawMessage(`7`)}, json.RawMessage(`{}`))
	if err != nil || string(out) != "7" {
		t.Fatalf("Call on a worker that took %v to start (budget %v) = %s, %v; want 7", slowStart, budget, out, err)
	}
	if s := pool.Stats(); s.Started != 2 {
		t.Errorf("%d workers started, want 2 (the call started its own)", s.Started)
	}
}

// TestReplacementStartsOnDemand: the slot of a dead worker is free again
// once the worker is reaped; the next call to take it starts the worker,
// and the start does not count against that call's wait. Another agent
// that needs the slot is not made to wait, past its budget, for a
// replacement started in the background.
func TestReplacementStartsOnDemand(t *testing.T) {
	pool := newTestPool(t, PoolOptions{Workers: 1, Executable: rogueWorker(t, "slowstart")})
	w, err := pool.acquire(t.Context(), "a", time.Now().Add(time.Minute), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	pool.fail(w, nil) // it died during a run
	pool.release(w)
	const budget = slowStart / 5
	got, err := pool.acquire(t.Context(), "b", time.Now().Add(budget), budget)
	if err != nil {
		t.Fatalf("acquire within %v after a worker died (a start takes %v) = %v, want the freed slot", budget, slowStart, err)
	}
	if got == w || got.dead.Load() {
		t.Errorf("acquire returned the dead worker")
	}
	pool.release(got)
}
