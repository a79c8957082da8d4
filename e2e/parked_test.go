package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/parleyhq/parley/e2e/parleytest"
	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
)

// metricValue reads an unlabelled metric from /metrics; a missing metric
// fails the test instead of reading as zero.
func metricValue(t *testing.T, srv *parleytest.Server, name string) string {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, srv.URL("/metrics"), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+parleytest.OperatorToken(t))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return v
		}
	}
	t.Fatalf("/metrics has no %s", name)
	return ""
}

// within polls cond for up to 20 s, failing with the last value.
func within(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ok, last := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: gave up after 20s; last: %s", what, last)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Steps posted before their agent exists wait, are counted, survive a
// restart, and all end once the agent gets a steps routine: the first runs
// and finishes the task, the others say the task is finished.
func TestSteps_parkedBeforeTheAgentExistsAllEndAfterRestart(t *testing.T) {
	srv := parleytest.Start(t, "", "--ap-retry-max", "200ms")
	const agentPath = "/agents/acme/late"
	var task struct {
		TaskID string `json:"task_id"`
	}
	apPost(t, srv, agentPath, "/ap/v1/agent/tasks", map[string]any{"input": "plan"}, &task)
	var ids []string
	for i := range 3 {
		var st apStep
		apPost(t, srv, agentPath, "/ap/v1/agent/tasks/"+task.TaskID+"/steps?wait=0", map[string]any{"input": fmt.Sprint("s", i)}, &st)
		ids = append(ids, st.StepID)
	}
	within(t, "the three parked steps are counted", func() (bool, string) {
		v := metricValue(t, srv, "parley_tasks_waiting_steps")
		return v == "3", v
	})
	if err := srv.Stop(10 * time.Second); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}

	srv = parleytest.Start(t, srv.DataDir, "--ap-retry-max", "200ms")
	conn, err := grpc.NewClient(srv.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(parleytest.Bearer(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := registryv1.NewRegistryServiceClient(conn).CreateAgent(t.Context(), &registryv1.CreateAgentRequest{Parent: "clients/acme", AgentId: "late", Agent: &registryv1.Agent{}}); err != nil {
		t.Fatalf("CreateAgent: %v", err)
	}
	if _, err := dispatcherv1.NewDispatcherServiceClient(conn).SetRoutine(t.Context(), &dispatcherv1.SetRoutineRequest{Routine: &dispatcherv1.Routine{
		Name:   "clients/acme/agents/late/routines/steps",
		Source: "def step(task_input, step_input, additional_input):\n    return {\"output\": \"ran \" + step_input, \"is_last\": True}\n",
	}}); err != nil {
		t.Fatalf("SetRoutine: %v", err)
	}
	ran := 0
	for _, id := range ids {
		var st apStep
		within(t, "parked step "+id+" ends", func() (bool, string) {
			resp, err := http.Get(srv.URL(agentPath + "/ap/v1/agent/tasks/" + task.TaskID + "/steps/" + id))
			if err != nil {
				return false, err.Error()
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			_ = json.NewDecoder(bytes.NewReader(b)).Decode(&st)
			return st.Status == "completed", string(b)
		})
		switch {
		case strings.HasPrefix(st.Output, "ran "):
			ran++
		case !strings.Contains(st.Output, "finished"):
			t.Errorf("step %s output = %q; want the routine's or one saying the task is finished", id, st.Output)
		}
	}
	if ran != 1 {
		t.Errorf("the routine ran %d steps; want 1 (its first answer ends the task)", ran)
	}
	within(t, "nothing waits any more", func() (bool, string) {
		v := metricValue(t, srv, "parley_tasks_waiting_steps")
		return v == "0", v
	})
}
