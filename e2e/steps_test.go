package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/parleyhq/parley/e2e/parleytest"
	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/sdk"
)

type apStep struct {
	StepID     string `json:"step_id"`
	Status     string `json:"status"`
	Output     string `json:"output"`
	IsLast     bool   `json:"is_last"`
	StatusText string `json:"status_message"`
}

// apPost posts JSON to the Agent Protocol surface of agent and decodes the
// reply into out.
func apPost(t *testing.T, srv *parleytest.Server, agentPath, path string, body any, out any) {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(srv.URL(agentPath+path), "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s = %d, want 200", path, resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		t.Fatal(err)
	}
}

// waitStep polls a step until it is completed, failing with the last value.
func waitStep(t *testing.T, srv *parleytest.Server, agentPath, taskID, stepID string) apStep {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	var last apStep
	for time.Now().Before(deadline) {
		resp, err := http.Get(srv.URL(fmt.Sprintf("%s/ap/v1/agent/tasks/%s/steps/%s", agentPath, taskID, stepID)))
		if err != nil {
			t.Fatal(err)
		}
		err = json.NewDecoder(resp.Body).Decode(&last)
		resp.Body.Close()
		if err == nil && last.Status == "completed" {
			return last
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("step %s never completed; last %+v", stepID, last)
	return last
}

// TestSteps_sdkHandlerAndRoutineBothComplete drives Agent Protocol steps
// through `parley serve`: one agent executes steps with a connected SDK
// handler, another with a Starlark step routine. A step created before the
// SDK agent connects stays `created` and completes once it connects.
func TestSteps_sdkHandlerAndRoutineBothComplete(t *testing.T) {
	srv := parleytest.Start(t, "")
	conn, err := grpc.NewClient(srv.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(parleytest.Bearer(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	reg := registryv1.NewRegistryServiceClient(conn)
	disp := dispatcherv1.NewDispatcherServiceClient(conn)
	for _, id := range []string{"sdkagent", "routineagent"} {
		if _, err := reg.CreateAgent(t.Context(), &registryv1.CreateAgentRequest{Parent: "clients/acme", AgentId: id, Agent: &registryv1.Agent{}}); err != nil {
			t.Fatalf("CreateAgent(%s): %v", id, err)
		}
	}

	// Routine agent: a `steps` routine.
	_, err = disp.SetRoutine(t.Context(), &dispatcherv1.SetRoutineRequest{Routine: &dispatcherv1.Routine{
		Name:   "clients/acme/agents/routineagent/routines/steps",
		Source: "def step(task_input, step_input, additional_input):\n    return {\"output\": \"routine: \" + task_input + \"/\" + step_input, \"is_last\": True}\n",
	}})
	if err != nil {
		t.Fatalf("SetRoutine: %v", err)
	}
	var task struct {
		TaskID string `json:"task_id"`
	}
	apPost(t, srv, "/agents/acme/routineagent", "/ap/v1/agent/tasks", map[string]any{"input": "plan"}, &task)
	var step apStep
	apPost(t, srv, "/agents/acme/routineagent", "/ap/v1/agent/tasks/"+task.TaskID+"/steps", map[string]any{"input": "go"}, &step)
	if step.Status != "completed" {
		step = waitStep(t, srv, "/agents/acme/routineagent", task.TaskID, step.StepID)
	}
	if step.Output != "routine: plan/go" || !step.IsLast {
		t.Errorf("routine step = %+v, want output \"routine: plan/go\" and is_last", step)
	}

	// SDK agent: the step is created before any executor is connected.
	apPost(t, srv, "/agents/acme/sdkagent", "/ap/v1/agent/tasks", map[string]any{"input": "write"}, &task)
	b, _ := json.Marshal(map[string]any{"input": "draft"})
	resp, err := http.Post(srv.URL("/agents/acme/sdkagent/ap/v1/agent/tasks/"+task.TaskID+"/steps?wait=0"), "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	err = json.NewDecoder(resp.Body).Decode(&step)
	resp.Body.Close()
	if err != nil || step.Status != "created" {
		t.Fatalf("step with no executor = %+v, %v; want status created", step, err)
	}

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- sdk.Connect(ctx, conn, "clients/acme/agents/sdkagent", sdk.Steps(func(_ context.Context, s sdk.Step) (sdk.StepResult, error) {
			return sdk.StepResult{Output: "sdk: " + s.TaskInput + "/" + s.Input}, nil
		}))
	}()
	got := waitStep(t, srv, "/agents/acme/sdkagent", task.TaskID, step.StepID)
	if got.Output != "sdk: write/draft" {
		t.Errorf("SDK step = %+v, want output \"sdk: write/draft\"", got)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("sdk.Connect after cancel = %v, want nil", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("sdk.Connect still running 30s after cancel")
	}
}
