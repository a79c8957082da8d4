package e2e

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/parleyhq/parley/e2e/parleytest"
)

// A fresh `parley serve` answers Agent Protocol steps on /ap/v1/agent out
// of the box: the default agent exists with an echo steps routine that
// says how to replace it.
func TestServe_defaultAgentAnswersStepsOutOfTheBox(t *testing.T) {
	srv := parleytest.Start(t, "")
	// Generous: a step answered by a routine takes milliseconds; 10 s is
	// the budget the first-hour walkthrough allows on a loaded machine.
	client := &http.Client{Timeout: 10 * time.Second}
	post := func(path, body string, out any) {
		t.Helper()
		resp, err := client.Post(srv.URL(path), "application/json", bytes.NewReader([]byte(body)))
		if err != nil {
			t.Fatalf("POST %s: %v", path, err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("POST %s = %d, want 200", path, resp.StatusCode)
		}
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			t.Fatalf("POST %s: %v", path, err)
		}
	}
	var task struct {
		TaskID string `json:"task_id"`
	}
	post("/ap/v1/agent/tasks", `{"input":"hello"}`, &task)
	var step apStep
	post("/ap/v1/agent/tasks/"+task.TaskID+"/steps", `{"input":"hi"}`, &step)
	if step.Status != "completed" {
		t.Fatalf("first step on a fresh server = %+v; want completed", step)
	}
	if !strings.Contains(step.Output, "hi") || !strings.Contains(step.Output, "routine set") {
		t.Errorf("default agent's output = %q; want the input echoed and how to replace the routine", step.Output)
	}
}
