package app_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/services/tasks/config"
)

func unknownAgent(context.Context, *dispatcherv1.ExecuteStepRequest) (*dispatcherv1.ExecuteStepResponse, error) {
	return nil, grpcerr.New(codes.NotFound, "agent is not registered", "AGENT_NOT_FOUND", "dispatcher.parley.dev", nil)
}

// lastStep ends the task with every step it runs.
func lastStep(_ context.Context, req *dispatcherv1.ExecuteStepRequest) (*dispatcherv1.ExecuteStepResponse, error) {
	return &dispatcherv1.ExecuteStepResponse{Output: "done: " + req.GetInput(), IsLast: true}, nil
}

// stepStatus returns a step as the Agent Protocol shows it.
func (e *env) step(t testing.TB, task, step string) map[string]any {
	t.Helper()
	return mustOK(t, get(t, e.url+ap+"/"+task+"/steps/"+step))
}

// metricLine returns the value of an unlabelled metric in /metrics, or
// fails: a missing metric is an error, not zero.
func (e *env) metric(t testing.TB, name string) string {
	t.Helper()
	body := string(get(t, e.url+"/metrics").body)
	for line := range strings.SplitSeq(body, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return v
		}
	}
	t.Fatalf("/metrics has no %s", name)
	return ""
}

// Steps parked before their agent existed all end after a restart: the
// first runs and finishes the task (is_last), the others end completed with
// an output saying the task is finished, none stays created.
func TestParked_stepsOfAFinishedTaskEndAfterRestart(t *testing.T) {
	fake, conn := startFakeDispatcher(t, unknownAgent)
	dir := t.TempDir()
	e := startTasks(t, dir, conn)
	task := e.createTask(t, `{}`)
	var ids []string
	for i := range 3 {
		st := mustOK(t, postJSON(t, e.url+ap+"/"+task+"/steps?wait=0", fmt.Sprintf(`{"input":"s%d"}`, i)))
		ids = append(ids, st["step_id"].(string))
	}
	eventually(t, "the metric counts the three parked steps", func() (bool, string) {
		v := e.metric(t, "parley_tasks_waiting_steps")
		return v == "3", v
	})
	e.stop()

	fake.set(lastStep)
	e = startTasks(t, dir, conn)
	ran := 0
	for _, id := range ids {
		var st map[string]any
		eventually(t, "parked step "+id+" ends", func() (bool, string) {
			st = e.step(t, task, id)
			return st["status"] == "completed", fmt.Sprint(st)
		})
		out := fmt.Sprint(st["output"])
		switch {
		case strings.HasPrefix(out, "done: "):
			ran++
		case !strings.Contains(out, "finished"):
			t.Errorf("step %s output = %q; want the agent's output or one saying the task is finished", id, out)
		}
	}
	if ran != 1 {
		t.Errorf("%d steps ran on the agent; want 1 (the first ends the task)", ran)
	}
	// The store shows a step completed just before the scheduler lets it go.
	eventually(t, "the metric drops to 0 once every step ended", func() (bool, string) {
		v := e.metric(t, "parley_tasks_waiting_steps")
		return v == "0", v
	})
}

// Cancelling a task ends its waiting steps with an output that says so.
func TestCancel_endsWaitingSteps(t *testing.T) {
	_, conn := startFakeDispatcher(t, noExecutor)
	e := startTasks(t, t.TempDir(), conn)
	task := e.createTask(t, `{}`)
	var ids []string
	for range 2 {
		ids = append(ids, mustOK(t, postJSON(t, e.url+ap+"/"+task+"/steps?wait=0", `{"input":"x"}`))["step_id"].(string))
	}
	mustOK(t, postJSON(t, e.url+ap+"/"+task+":cancel", ``))
	for _, id := range ids {
		eventually(t, "waiting step of the cancelled task ends", func() (bool, string) {
			st := e.step(t, task, id)
			return st["status"] == "completed" && strings.Contains(fmt.Sprint(st["output"]), "cancelled"), fmt.Sprint(st)
		})
	}
}

// A step retried after its own failure waits too: the metric counts it.
func TestMetrics_waitingCountsRetryingSteps(t *testing.T) {
	_, conn := startFakeDispatcher(t, func(context.Context, *dispatcherv1.ExecuteStepRequest) (*dispatcherv1.ExecuteStepResponse, error) {
		return nil, grpcerr.New(codes.Aborted, "handler failed", "HANDLER_FAILED", "dispatcher.parley.dev", nil)
	})
	e := startTasks(t, t.TempDir(), conn, func(c *config.Config) { c.RetryMax = time.Hour })
	task := e.createTask(t, `{}`)
	st := mustOK(t, postJSON(t, e.url+ap+"/"+task+"/steps", `{"input":"x"}`))
	if !strings.HasPrefix(fmt.Sprint(st["status_message"]), "retrying") {
		t.Fatalf("failing step = %v; want created and retrying", st)
	}
	if v := e.metric(t, "parley_tasks_waiting_steps"); v != "1" {
		t.Errorf("parley_tasks_waiting_steps = %s with one step backing off; want 1", v)
	}
}

// Steps posted while an unknown agent's first attempt runs wait for its
// outcome instead of returning created at once: when it completes, they
// run and complete within their POST.
func TestSteps_postedDuringTheFirstAttemptComplete(t *testing.T) {
	fake, conn := startFakeDispatcher(t, echoStep)
	release := make(chan struct{})
	var once sync.Once
	fake.set(func(ctx context.Context, req *dispatcherv1.ExecuteStepRequest) (*dispatcherv1.ExecuteStepResponse, error) {
		if req.GetInput() == "first" {
			select {
			case <-release:
			case <-ctx.Done():
				return nil, status.FromContextError(ctx.Err()).Err()
			}
		}
		return echoStep(ctx, req)
	})
	e := startTasks(t, t.TempDir(), conn)
	const followers = 8
	results := make(chan map[string]any, followers+1)
	post := func(task, input string) {
		var st map[string]any
		if !postDecode(http.DefaultClient, e.url+ap+"/"+task+"/steps", "application/json", strings.NewReader(`{"input":"`+input+`"}`), &st) {
			st = map[string]any{"status": "POST failed"}
		}
		results <- st
	}
	go post(e.createTask(t, `{}`), "first")
	eventually(t, "the first attempt reaches the dispatcher", func() (bool, string) {
		return len(fake.requests()) == 1, fmt.Sprint(len(fake.requests()))
	})
	for range followers {
		go post(e.createTask(t, `{}`), "next")
	}
	eventually(t, "the followers wait behind the first attempt", func() (bool, string) {
		v := e.metric(t, "parley_tasks_waiting_steps")
		return v == fmt.Sprint(followers), v
	})
	once.Do(func() { close(release) })
	for range followers + 1 {
		if st := <-results; st["status"] != "completed" {
			t.Errorf("step = %v; want completed within its POST", st)
		}
	}
}

// Each outage on the step path names what is down.
func TestParked_messageNamesWhatIsDown(t *testing.T) {
	tests := []struct {
		name      string
		err       error
		want, not string
	}{
		{"LLM provider", grpcerr.New(codes.Unavailable, "the language model could not execute the step: dial tcp: refused", "LLM_FAILED", "dispatcher.parley.dev", nil), "language model", "dispatcher is unavailable"},
		{"dispatcher", status.Error(codes.Unavailable, "connection refused"), "dispatcher is unavailable", "language model"},
		{"agent", grpcerr.New(codes.NotFound, "agent is not registered", "AGENT_NOT_FOUND", "dispatcher.parley.dev", nil), "does not know agent", "dispatcher is unavailable"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, conn := startFakeDispatcher(t, func(context.Context, *dispatcherv1.ExecuteStepRequest) (*dispatcherv1.ExecuteStepResponse, error) {
				return nil, tc.err
			})
			e := startTasks(t, t.TempDir(), conn)
			st := mustOK(t, postJSON(t, e.url+ap+"/"+e.createTask(t, `{}`)+"/steps", `{"input":"x"}`))
			msg := fmt.Sprint(st["status_message"])
			if !strings.Contains(msg, tc.want) || strings.Contains(msg, tc.not) {
				t.Errorf("status_message = %q; want it to name %q, not %q", msg, tc.want, tc.not)
			}
		})
	}
}
