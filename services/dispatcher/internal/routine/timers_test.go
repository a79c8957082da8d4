package routine

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"go.starlark.net/starlark"
	"go.starlark.net/syntax"
)

// A worker's runs share one wall-time timer. One that timed out must not
// leave the timer armed against the next run on the same worker.
func TestWorker_runAfterATimedOutRun(t *testing.T) {
	pool := newTestPool(t, PoolOptions{Workers: 1})
	p, err := Compile(t.Context(), "r", `
def loop(q):
    while True:
        pass

def quick(q):
    return {"q": q}
`, nil, testLimits(Limits{Pool: pool, Timeout: 300 * time.Millisecond, MaxSteps: 1 << 40}))
	if err != nil {
		t.Fatal(err)
	}
	arg := []json.RawMessage{json.RawMessage(`1`)}
	if _, _, err := p.Call(t.Context(), "loop", arg, nil); !errors.Is(err, ErrTimeBudget) {
		t.Fatalf("loop: %v, want the time budget", err)
	}
	for i := range 3 {
		out, _, err := p.Call(t.Context(), "quick", arg, nil)
		if err != nil || string(out) != `{"q":1}` {
			t.Fatalf("quick call %d after the timed-out one = %s, %v", i, out, err)
		}
	}
}

// The timer may fire late, for a run that has ended, after the next run
// armed it: that firing must spare the next run.
func TestWallTimer_lateFiringSparesTheNextRun(t *testing.T) {
	var w wallTimer
	first, next := &callState{}, &callState{}
	w.arm(time.Hour, &starlark.Thread{}, first, "wall time budget exceeded")
	w.stop()
	w.arm(time.Hour, &starlark.Thread{}, next, "wall time budget exceeded")
	w.fire() // the first run's, late
	if next.expired.Load() {
		t.Fatal("a late firing for the previous run cancelled the next one")
	}
	w.stop()

	thread := &starlark.Thread{}
	w.arm(0, thread, next, "wall time budget exceeded")
	deadline := time.Now().Add(10 * time.Second) // bounds a broken run only
	for !next.expired.Load() {
		if time.Now().After(deadline) {
			t.Fatal("a timer armed for 0 has not fired after 10 s")
		}
		time.Sleep(time.Millisecond)
	}
	w.stop()
	_, err := starlark.ExecFileOptions(&syntax.FileOptions{}, thread, "x", "x = [i for i in range(10)]\n", nil)
	if err == nil || !strings.Contains(err.Error(), "wall time budget exceeded") {
		t.Fatalf("a due timer did not cancel its run: %v", err)
	}
}

// The same for the pool's kill timer: a firing for an exchange that was
// answered must not kill the worker under the next one.
func TestKillHead_lateFiringSparesTheNextExchange(t *testing.T) {
	next := &exchange{}
	w := &worker{pending: []*exchange{next}, killEx: next, killAt: time.Now().Add(time.Hour)}
	w.killHead() // would panic on the nil command if it killed
	if w.killed.Load() {
		t.Fatal("a late firing killed the worker before the next exchange's time")
	}
}
