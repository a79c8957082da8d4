package app_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
)

// slack is the generous margin allowed on top of a run's bound (budget +
// the pool's 250 ms kill margin): a loaded 2-core CI machine, -race, can
// delay the kill's delivery by seconds. A run that is never stopped fails
// the bound by far more: it runs forever.
const slack = 5 * time.Second

const runaway = "def reply(q, m):\n    return all(range(1, 1 << 62))\n"

// The headline: one builtin that ignored the wall-time budget.
// Through POST /v1/routines:test it now fails as a time-budget failure
// within the budget plus the margin, and the workers are idle afterwards.
func TestApp_runawayDryRunIsKilled(t *testing.T) {
	_, base := startDispatcher(t)
	bound := time.Second + 250*time.Millisecond + slack
	ctx, cancel := context.WithTimeout(t.Context(), bound)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "POST", base+"/v1/routines:test", strings.NewReader(mustMarshal(t, map[string]any{
		"source": runaway,
		"cases":  []map[string]any{{"function": "reply", "argsJson": []string{`1`, `{}`}}},
	})))
	if err != nil {
		t.Fatal(err)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST /v1/routines:test: %v (the bound, margin included, is %v)", err, bound)
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	if code, body := res.StatusCode, string(raw); code != 200 {
		t.Fatalf("POST /v1/routines:test = %d %s", code, body)
	}
	body := string(raw)
	var resp struct {
		Results []struct {
			Error          string `json:"error"`
			BudgetExceeded bool   `json:"budgetExceeded"`
			FailureKind    string `json:"failureKind"`
		} `json:"results"`
	}
	if err := json.Unmarshal([]byte(body), &resp); err != nil || len(resp.Results) != 1 {
		t.Fatalf("reply %s: %v", body, err)
	}
	if r := resp.Results[0]; r.FailureKind != "ROUTINE_FAILURE_KIND_TIME" || !r.BudgetExceeded || !strings.Contains(r.Error, "wall time budget exceeded") {
		t.Errorf("result = %+v, want a time-budget failure", r)
	}
	waitWorkersAsleep(t)
}

// An installed routine killed at its budget is a failure of the routine:
// the resource shows the count and the kind, the metric counts the kill,
// and quarantine follows.
func TestApp_killedRoutineIsAccounted(t *testing.T) {
	client, base := startDispatcher(t)
	name := "clients/acme/agents/echo/routines/" + pdHex
	if code, body := httpDo(t, "PUT", base+"/v1/"+name, mustMarshal(t, map[string]string{"source": runaway})); code != 200 {
		t.Fatalf("PUT routine = %d %s", code, body)
	}
	// Envelopes until the routine is quarantined. On a loaded machine a
	// run may be answered busy instead (its fresh worker took its whole
	// wait budget to get to it): that is the pool's fault, not the
	// routine's, and counts neither as a failure nor as a kill, so the
	// checks below hold however many envelopes it took.
	var r *dispatcherv1.Routine
	for i := 1; r.GetState() != dispatcherv1.Routine_STATE_QUARANTINED; i++ {
		if i > 10 {
			t.Fatalf("routine after %d envelopes = %v, want quarantined", i-1, r)
		}
		if code, body := httpDo(t, "POST", base+"/agora/acme/echo", `{"protocolHash":"`+pdHex+`","body":"x"}`); code != 200 || !strings.Contains(body, `"status":"failure"`) {
			t.Fatalf("envelope %d = %d %s, want a failure", i, code, body)
		}
		var err error
		if r, err = client.GetRoutine(t.Context(), &dispatcherv1.GetRoutineRequest{Name: name}); err != nil {
			t.Fatal(err)
		}
	}
	if r.GetConsecutiveFailures() != 3 || r.GetState() != dispatcherv1.Routine_STATE_QUARANTINED ||
		r.GetLastFailureKind() != dispatcherv1.RoutineFailureKind_ROUTINE_FAILURE_KIND_TIME || !strings.Contains(r.GetLastError(), "killed") {
		t.Errorf("routine after 3 kills = %v, want quarantined, 3 failures, last failure a time kill", r)
	}
	_, metrics := httpDo(t, "GET", base+"/metrics", "")
	if !strings.Contains(metrics, `parley_dispatcher_routine_kills_total{kind="time"} 3`) {
		t.Errorf("metrics lack 3 time kills:\n%s", grepLines(metrics, "routine_kills"))
	}
}

// 64 concurrent envelopes to one agent's runaway routine take only that
// agent's share of the workers: a second agent's envelopes, sent during
// the attack, are all answered by its routine.
func TestApp_oneAgentCannotStarveAnother(t *testing.T) {
	// A 3 s budget for everyone: the attack lasts as long, and the other
	// agent's millisecond of work stays in budget on a machine that the
	// attacker's two runaways and a parallel test run keep busy.
	_, base := startDispatcher(t, "--routine-quarantine-after", "1000", "--routine-workers", "4", "--routine-timeout", "3s")
	put := func(agent, src string) {
		name := "clients/acme/agents/" + agent + "/routines/" + pdHex
		if code, body := httpDo(t, "PUT", base+"/v1/"+name, mustMarshal(t, map[string]string{"source": src})); code != 200 {
			t.Fatalf("PUT routine = %d %s", code, body)
		}
	}
	put("echo", runaway)
	put("other", "def reply(q, m):\n    return {\"echo\": q}\n")
	var wg sync.WaitGroup
	attackDone := make(chan struct{})
	for range 64 {
		wg.Go(func() { httpDo(t, "POST", base+"/agora/acme/echo", `{"protocolHash":"`+pdHex+`","body":"x"}`) })
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
		code, body := httpDo(t, "POST", base+"/agora/acme/other", `{"protocolHash":"`+pdHex+`","body":`+q+`}`)
		if want := `{"status":"success","body":{"echo":` + q + `}}`; code != 200 || body != want {
			t.Fatalf("the other agent's envelope %d during the attack = %d %s, want %s", calls, code, body, want)
		}
	}
	_, metrics := httpDo(t, "GET", base+"/metrics", "")
	if strings.Contains(metrics, `parley_dispatcher_routine_kills_total{kind="time"} 0`) {
		t.Errorf("no time kills during the attack:\n%s", grepLines(metrics, "routine_kills"))
	}
	waitWorkersAsleep(t)
}

// An envelope nested past the limit is refused at once, with the reason.
func TestApp_deepEnvelopeIsRefused(t *testing.T) {
	_, base := startDispatcher(t)
	deep := strings.Repeat("[", 500000) + strings.Repeat("]", 500000)
	code, body := httpDo(t, "POST", base+"/agora/acme/echo", `{"protocolHash":"`+pdHex+`","body":`+deep+`}`)
	if code != 400 || !strings.Contains(body, "nested too deeply") {
		t.Errorf("deep envelope = %d %.300s, want 400 nested too deeply", code, body)
	}
}

func mustMarshal(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func grepLines(s, sub string) string {
	var out []string
	for line := range strings.Lines(s) {
		if strings.Contains(line, sub) {
			out = append(out, strings.TrimSpace(line))
		}
	}
	return strings.Join(out, "\n")
}

// waitWorkersAsleep waits until every child process of this test (the
// routine workers) is asleep: the killed runs left nothing burning CPU. A
// replacement worker starting up runs for a moment, so the wait allows a
// generous 5 s.
func waitWorkersAsleep(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		busy := runningChildren(t)
		if len(busy) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("workers still running: %v", busy)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func runningChildren(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	self := strconv.Itoa(os.Getpid())
	var busy []string
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(f) > 1 && f[1] == self && f[0] != "S" && f[0] != "Z" {
			busy = append(busy, fmt.Sprintf("%s (%s)", e.Name(), f[0]))
		}
	}
	return busy
}
