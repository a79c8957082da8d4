package app_test

import (
	"context"
	"encoding/json"
	"fmt"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	tasksv1 "github.com/parleyhq/parley/gen/parley/tasks/v1"
	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/services/tasks/config"
)

const ap = "/ap/v1/agent/tasks"

func TestAgentProtocol_unknownIDsAre404WithMessage(t *testing.T) {
	_, conn := startFakeDispatcher(t, echoStep)
	e := startTasks(t, t.TempDir(), conn)
	task := e.createTask(t, `{"input":"x"}`)
	other := mustOK(t, postJSON(t, e.url+"/agents/acme/other"+ap, `{}`))["task_id"].(string)
	tests := []struct {
		name, method, path string
	}{
		{"get task", "GET", ap + "/2d4c1f3e-0000-4000-8000-000000000000"},
		{"get task with odd id", "GET", ap + "/bad%20id"},
		{"task of another agent", "GET", ap + "/" + other},
		{"list steps", "GET", ap + "/nope/steps"},
		{"create step", "POST", ap + "/nope/steps"},
		{"get step", "GET", ap + "/" + task + "/steps/nope"},
		{"get step of unknown task", "GET", ap + "/nope/steps/nope"},
		{"list artifacts", "GET", ap + "/nope/artifacts"},
		{"upload artifact", "POST", ap + "/nope/artifacts"},
		{"download artifact", "GET", ap + "/" + task + "/artifacts/nope"},
		{"events", "GET", ap + "/nope/events"},
		{"cancel", "POST", ap + "/nope:cancel"},
		{"bad agent path", "GET", "/agents/Bad_Client/x" + ap},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := do(t, tc.method, e.url+tc.path, "application/json", strings.NewReader(`{}`))
			if r.code != http.StatusNotFound {
				t.Fatalf("%s %s = %d %s, want 404", tc.method, tc.path, r.code, r.body)
			}
			if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
				t.Errorf("Content-Type = %q, want application/json", ct)
			}
			if msg, _ := r.json(t)["message"].(string); msg == "" {
				t.Errorf("body %s has no message", r.body)
			}
		})
	}
}

// TestAgentProtocol_unknownRoutesAndWrongMethods proves the Agent Protocol
// routes answer an unknown path 404 and a wrong method 405 (with Allow) in
// the spec's {"message"} shape, while other paths keep the gateway's body.
func TestAgentProtocol_unknownRoutesAndWrongMethods(t *testing.T) {
	_, conn := startFakeDispatcher(t, echoStep)
	e := startTasks(t, t.TempDir(), conn)
	tests := []struct {
		name, method, path string
		wantCode           int
		wantAllow          string
		wantKey            string
	}{
		{"delete tasks", "DELETE", ap, 405, "GET, HEAD, POST", "message"},
		{"put a step", "PUT", ap + "/x/steps/y", 405, "GET, HEAD", "message"},
		{"hosted agent wrong method", "PATCH", "/agents/acme/bot" + ap, 405, "GET, HEAD, POST", "message"},
		{"unknown agent protocol path", "GET", "/ap/v1/agent/nothing", 404, "", "message"},
		{"unknown gateway path", "GET", "/v1/nothing", 404, "", "code"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := do(t, tc.method, e.url+tc.path, "application/json", strings.NewReader(`{}`))
			if r.code != tc.wantCode {
				t.Fatalf("%s %s = %d %s, want %d", tc.method, tc.path, r.code, r.body, tc.wantCode)
			}
			if got := r.header.Get("Allow"); got != tc.wantAllow {
				t.Errorf("%s %s Allow = %q, want %q", tc.method, tc.path, got, tc.wantAllow)
			}
			body := r.json(t)
			if _, ok := body[tc.wantKey]; !ok {
				t.Errorf("%s %s body %s has no %q", tc.method, tc.path, r.body, tc.wantKey)
			}
			if _, hasCode := body["code"]; tc.wantKey == "message" && hasCode {
				t.Errorf("%s %s body %s is the gateway's, want the Agent Protocol's {\"message\"}", tc.method, tc.path, r.body)
			}
		})
	}
}

func TestAgentProtocol_badBodiesAre422AndWriteNothing(t *testing.T) {
	_, conn := startFakeDispatcher(t, echoStep)
	e := startTasks(t, t.TempDir(), conn)
	task := e.createTask(t, `{}`)
	bodies := []struct{ name, body string }{
		{"not JSON", `input=x`},
		{"truncated", `{"input":`},
		{"array", `[]`},
		{"string", `"x"`},
		{"number", `1`},
		{"input number", `{"input":1}`},
		{"input object", `{"input":{}}`},
		{"input bool", `{"input":true}`},
		{"additional_input string", `{"additional_input":"x"}`},
		{"additional_input array", `{"additional_input":[1]}`},
		{"additional_input number", `{"additional_input":3}`},
		{"trailing data", `{"input":"x"} {}`},
		{"extra brace", `{"input":"x"}}`},
		// Nesting is refused before any parser recurses into it.
		{"additional_input nested 65 levels", `{"additional_input":` + strings.Repeat(`{"a":`, 64) + `1` + strings.Repeat(`}`, 64) + `}`},
		{"an unknown field nested 65 levels", `{"input":"x","x":` + strings.Repeat(`[`, 64) + strings.Repeat(`]`, 64) + `}`},
	}
	for _, path := range []string{ap, ap + "/" + task + "/steps"} {
		big := `{"input":"` + strings.Repeat("x", 2<<20) + `"}`
		if r := postJSON(t, e.url+path, big); r.code != http.StatusRequestEntityTooLarge || !strings.Contains(string(r.body), "message") {
			t.Errorf("POST %s with a 2 MiB body = %d %.100s, want 413 with a message", path, r.code, r.body)
		}
	}
	for _, path := range []string{ap, ap + "/" + task + "/steps"} {
		for _, tc := range bodies {
			t.Run(path+"/"+tc.name, func(t *testing.T) {
				r := postJSON(t, e.url+path, tc.body)
				if r.code != http.StatusUnprocessableEntity {
					t.Fatalf("POST %s %s = %d %s, want 422", path, tc.body, r.code, r.body)
				}
				if msg, _ := r.json(t)["message"].(string); msg == "" {
					t.Errorf("body %s has no message", r.body)
				}
			})
		}
	}
	tasks := mustOK(t, get(t, e.url+ap))
	if n := tasks["pagination"].(map[string]any)["total_items"]; n != json.Number("1") {
		t.Errorf("total tasks after bad creates = %v, want 1", n)
	}
	steps := mustOK(t, get(t, e.url+ap+"/"+task+"/steps"))
	if n := steps["pagination"].(map[string]any)["total_items"]; n != json.Number("0") {
		t.Errorf("total steps after bad creates = %v, want 0", n)
	}
}

func TestAgentProtocol_shapes(t *testing.T) {
	_, conn := startFakeDispatcher(t, echoStep)
	e := startTasks(t, t.TempDir(), conn)
	r := do(t, "POST", e.url+ap, "", nil) // no body at all: an empty task
	task := mustOK(t, r)
	if task["input"] != nil || string(mustMarshal(task["additional_input"])) != "{}" || string(mustMarshal(task["artifacts"])) != "[]" {
		t.Errorf("empty task = %s; want input null, additional_input {}, artifacts []", r.body)
	}
	for _, k := range []string{"task_id", "created_at", "modified_at"} {
		if _, ok := task[k]; !ok {
			t.Errorf("task %s lacks %s", r.body, k)
		}
	}
	id := task["task_id"].(string)
	r = postJSON(t, e.url+ap+"/"+id+"/steps", `{"input":"hi","additional_input":null}`)
	step := mustOK(t, r)
	want := map[string]string{"status": `"completed"`, "output": `"echo: hi"`, "additional_input": `{}`, "additional_output": `{"tokens":1}`, "artifacts": `[]`, "is_last": `false`, "name": `"echo"`, "task_id": `"` + id + `"`}
	for k, v := range want {
		if got := string(mustMarshal(step[k])); got != v {
			t.Errorf("step[%q] = %s, want %s (step %s)", k, got, v, r.body)
		}
	}
	if g := mustOK(t, get(t, e.url+ap+"/"+id+"/steps/"+step["step_id"].(string))); g["output"] != "echo: hi" {
		t.Errorf("GET step = %v, want the completed step", g)
	}
}

func mustMarshal(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

func TestAgentProtocol_paginationIsNumbers(t *testing.T) {
	_, conn := startFakeDispatcher(t, echoStep)
	e := startTasks(t, t.TempDir(), conn)
	var task string
	for range 3 {
		task = e.createTask(t, `{}`)
	}
	for range 3 {
		mustOK(t, postJSON(t, e.url+ap+"/"+task+"/steps", `{"input":"x"}`))
		mustOK(t, upload(t, e.url+ap+"/"+task+"/artifacts", filePart(fmt.Sprint("f", time.Now().UnixNano()), "x")))
	}
	for _, tc := range []struct{ path, items string }{
		{ap, "tasks"},
		{ap + "/" + task + "/steps", "steps"},
		{ap + "/" + task + "/artifacts", "artifacts"},
	} {
		t.Run(tc.items, func(t *testing.T) {
			r := get(t, e.url+tc.path+"?page_size=2&current_page=2")
			body := mustOK(t, r)
			want := map[string]json.Number{"total_items": "3", "total_pages": "2", "current_page": "2", "page_size": "2"}
			p := body["pagination"].(map[string]any)
			for k, v := range want {
				if p[k] != v { // a string "2" would not compare equal to json.Number
					t.Errorf("pagination.%s = %#v, want the JSON number %s (%s)", k, p[k], v, r.body)
				}
			}
			if n := len(body[tc.items].([]any)); n != 1 {
				t.Errorf("%s on page 2 = %d, want 1", tc.items, n)
			}
			past := mustOK(t, get(t, e.url+tc.path+"?page_size=2&current_page=9"))
			if n := len(past[tc.items].([]any)); n != 0 {
				t.Errorf("%s past the end = %d, want 0", tc.items, n)
			}
		})
	}
}

func TestAgentProtocol_pageBoundsAre400(t *testing.T) {
	_, conn := startFakeDispatcher(t, echoStep)
	e := startTasks(t, t.TempDir(), conn, func(c *config.Config) { c.MaxPageSize = 50 })
	task := e.createTask(t, `{}`)
	for _, q := range []string{
		"current_page=0", "current_page=-1", "current_page=abc", "current_page=1.5", "current_page=99999999999",
		"page_size=0", "page_size=-3", "page_size=51", "page_size=x",
		"page_size=50&current_page=2147483647",
	} {
		for _, path := range []string{ap, ap + "/" + task + "/steps", ap + "/" + task + "/artifacts"} {
			r := get(t, e.url+path+"?"+q)
			if r.code != http.StatusBadRequest {
				t.Errorf("GET %s?%s = %d %s, want 400", path, q, r.code, r.body)
				continue
			}
			if msg, _ := r.json(t)["message"].(string); msg == "" {
				t.Errorf("GET %s?%s body %s has no message", path, q, r.body)
			}
		}
	}
	if r := get(t, e.url+ap+"?page_size=50&current_page=1"); r.code != http.StatusOK {
		t.Errorf("GET page_size=max = %d, want 200", r.code)
	}
}

// artifactFiles lists the files under the task's artifact folder.
func artifactFiles(t *testing.T, dir, task string) []string {
	t.Helper()
	var files []string
	_ = filepath.WalkDir(filepath.Join(dir, "artifacts", task), func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			files = append(files, p)
		}
		return nil
	})
	return files
}

func TestUpload_refusesTraversalAndWritesNothing(t *testing.T) {
	_, conn := startFakeDispatcher(t, echoStep)
	dir := t.TempDir()
	e := startTasks(t, dir, conn)
	task := e.createTask(t, `{}`)
	url := e.url + ap + "/" + task + "/artifacts"
	// An empty relPath omits the relative_path part, unless emptyPart.
	tests := []struct {
		name, relPath, fileName string
		emptyPart               bool
	}{
		{"dotdot", "../", "f.txt", false},
		{"deep dotdot", "a/../../../etc", "f.txt", false},
		{"absolute", "/etc", "passwd", false},
		{"backslashes", `..\..\x`, "f.txt", false},
		{"NUL", "a\x00", "f.txt", false},
		{"dotdot file name", "", "..", false},
		{"file name with directories", "", "../../../evil", false},
		{"absolute file name", "", "/etc/passwd", false},
		{"backslash file name", "", `..\evil`, false},
		{"drive", "C:/Windows", "f.txt", false},
		// The README: "." and an empty relative_path are refused (omit the
		// field for the task's root), as are bidirectional controls.
		{"dot path", ".", "f.txt", false},
		{"empty path", "", "f.txt", true},
		{"right-to-left override", "", "gpj.\u202eexe", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := upload(t, url, func(mw *multipart.Writer) {
				if tc.relPath != "" || tc.emptyPart {
					fieldPart("relative_path", tc.relPath)(mw)
				}
				filePart(tc.fileName, "evil")(mw)
			})
			if r.code != http.StatusBadRequest {
				t.Fatalf("upload(%q, %q) = %d %s, want 400", tc.relPath, tc.fileName, r.code, r.body)
			}
			if msg, _ := r.json(t)["message"].(string); msg == "" {
				t.Errorf("body %s has no message", r.body)
			}
		})
	}
	if files := artifactFiles(t, dir, task); len(files) != 0 {
		t.Errorf("refused uploads left files %v", files)
	}
	if n := mustOK(t, get(t, url))["pagination"].(map[string]any)["total_items"]; n != json.Number("0") {
		t.Errorf("artifacts after refused uploads = %v, want 0", n)
	}
	if _, err := os.Stat(filepath.Join(dir, "evil")); err == nil {
		t.Errorf("a file escaped the data directory")
	}
}

func TestUpload_missingFileAndOversize(t *testing.T) {
	_, conn := startFakeDispatcher(t, echoStep)
	dir := t.TempDir()
	e := startTasks(t, dir, conn, func(c *config.Config) { c.MaxUploadBytes = 16 })
	task := e.createTask(t, `{}`)
	url := e.url + ap + "/" + task + "/artifacts"
	tests := []struct {
		name string
		do   func() response
		want int
	}{
		{"no file part", func() response {
			return upload(t, url, fieldPart("relative_path", "a"))
		}, http.StatusBadRequest},
		{"not multipart", func() response { return postJSON(t, url, `{"file":"x"}`) }, http.StatusBadRequest},
		{"file without a name", func() response { return upload(t, url, filePart("", "x")) }, http.StatusBadRequest},
		{"oversized", func() response { return upload(t, url, filePart("big.bin", strings.Repeat("x", 17))) }, http.StatusRequestEntityTooLarge},
		{"far oversized", func() response { return upload(t, url, filePart("big.bin", strings.Repeat("x", 1<<20))) }, http.StatusRequestEntityTooLarge},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.do()
			if r.code != tc.want {
				t.Fatalf("status %d %s, want %d", r.code, r.body, tc.want)
			}
			if msg, _ := r.json(t)["message"].(string); msg == "" {
				t.Errorf("body %s has no message", r.body)
			}
		})
	}
	if files := artifactFiles(t, dir, task); len(files) != 0 {
		t.Errorf("refused uploads left files %v", files)
	}
	if r := upload(t, url, filePart("ok.txt", strings.Repeat("x", 16))); r.code != http.StatusOK {
		t.Errorf("upload at the limit = %d %s, want 200", r.code, r.body)
	}
}

func TestUpload_download(t *testing.T) {
	_, conn := startFakeDispatcher(t, echoStep)
	e := startTasks(t, t.TempDir(), conn)
	task := e.createTask(t, `{}`)
	url := e.url + ap + "/" + task + "/artifacts"
	// relative_path after the file part still applies.
	r := upload(t, url, func(mw *multipart.Writer) {
		filePart("main.py", "print('Washington')")(mw)
		fieldPart("relative_path", "python/code/")(mw)
	})
	a := mustOK(t, r)
	if a["file_name"] != "main.py" || a["relative_path"] != "python/code" || a["agent_created"] != false {
		t.Errorf("upload = %s; want main.py in python/code, not agent-created", r.body)
	}
	d := get(t, url+"/"+a["artifact_id"].(string))
	if d.code != http.StatusOK || string(d.body) != "print('Washington')" {
		t.Fatalf("download = %d %q", d.code, d.body)
	}
	if ct := d.header.Get("Content-Type"); ct != "application/octet-stream" {
		t.Errorf("Content-Type = %q, want application/octet-stream", ct)
	}
	if cd := d.header.Get("Content-Disposition"); !strings.Contains(cd, `filename=main.py`) {
		t.Errorf("Content-Disposition = %q, want filename=main.py", cd)
	}
	tk := mustOK(t, get(t, e.url+ap+"/"+task))
	if arts := tk["artifacts"].([]any); len(arts) != 1 {
		t.Errorf("task artifacts = %v, want the upload", arts)
	}
}

func TestSteps_completeThroughDispatcher(t *testing.T) {
	fake, conn := startFakeDispatcher(t, echoStep)
	e := startTasks(t, t.TempDir(), conn)
	task := mustOK(t, postJSON(t, e.url+"/agents/acme/writer"+ap, `{"input":"task input"}`))["task_id"].(string)
	base := e.url + "/agents/acme/writer" + ap + "/" + task

	step := mustOK(t, postJSON(t, base+"/steps", `{"input":"file","additional_input":{"k":"v"}}`))
	if step["status"] != "completed" || step["output"] != "echo: file" {
		t.Fatalf("step = %v; want completed with echo output", step)
	}
	arts := step["artifacts"].([]any)
	if len(arts) != 1 || arts[0].(map[string]any)["agent_created"] != true || arts[0].(map[string]any)["file_name"] != "out.txt" {
		t.Fatalf("step artifacts = %v; want one agent-created out.txt", arts)
	}
	d := get(t, base+"/artifacts/"+arts[0].(map[string]any)["artifact_id"].(string))
	if string(d.body) != "Washington" {
		t.Errorf("agent artifact bytes = %q, want Washington", d.body)
	}
	reqs := fake.requests()
	want := &dispatcherv1.ExecuteStepRequest{Agent: "clients/acme/agents/writer", TaskId: task, StepId: step["step_id"].(string), TaskInput: "task input", Input: "file", AdditionalInputJson: []byte(`{"k":"v"}`)}
	if len(reqs) != 1 || !proto.Equal(reqs[0], want) {
		t.Errorf("ExecuteStep requests = %v, want [%v]", reqs, want)
	}

	last := mustOK(t, postJSON(t, base+"/steps", `{"input":"last"}`))
	if last["is_last"] != true || last["status"] != "completed" {
		t.Fatalf("last step = %v; want completed, is_last", last)
	}
	after := postJSON(t, base+"/steps", `{"input":"more"}`)
	m := mustOK(t, after)
	if m["status"] != "completed" || m["is_last"] != true || !strings.Contains(m["output"].(string), "finished") {
		t.Errorf("step after is_last = %s; want 200, completed, output saying the task is finished", after.body)
	}
	if n := len(fake.requests()); n != 2 {
		t.Errorf("ExecuteStep calls = %d, want 2 (none after is_last)", n)
	}
	if st := mustOK(t, get(t, base))["state"]; st != "finished" {
		t.Errorf("task state = %v, want finished", st)
	}
}

func TestSteps_noExecutorStaysCreatedThenRuns(t *testing.T) {
	fake, conn := startFakeDispatcher(t, noExecutor)
	e := startTasks(t, t.TempDir(), conn, func(c *config.Config) { c.StepWait = time.Minute })
	task := e.createTask(t, `{}`)
	start := time.Now()
	step := mustOK(t, postJSON(t, e.url+ap+"/"+task+"/steps", `{"input":"x"}`))
	if step["status"] != "created" || !strings.Contains(fmt.Sprint(step["status_message"]), "no executor") {
		t.Fatalf("step without executor = %v; want created with a status_message about no executor", step)
	}
	// A stated margin, not a timing: the POST waits either for the park
	// (milliseconds) or for --ap-step-wait (a minute here); half of that
	// tells them apart however loaded the machine is.
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("POST took %v; a parked step should return without waiting out --ap-step-wait", d)
	}
	fake.set(echoStep)
	url := e.url + ap + "/" + task + "/steps/" + step["step_id"].(string)
	eventually(t, "parked step completes once an executor answers", func() (bool, string) {
		r := get(t, url)
		m := r.json(t)
		return m["status"] == "completed" && m["status_message"] == nil, string(r.body)
	})
}

func TestSteps_tooManyWaitingIs429AndWritesNothing(t *testing.T) {
	_, conn := startFakeDispatcher(t, noExecutor)
	e := startTasks(t, t.TempDir(), conn, func(c *config.Config) { c.MaxWaitingSteps = 2 })
	task := e.createTask(t, `{}`)
	steps := e.url + ap + "/" + task + "/steps"
	for range 2 {
		mustOK(t, postJSON(t, steps, `{"input":"x"}`)) // returns once the step waits
	}
	r := postJSON(t, steps, `{"input":"one too many"}`)
	if r.code != http.StatusTooManyRequests {
		t.Fatalf("third waiting step = %d %s, want 429", r.code, r.body)
	}
	if msg, _ := r.json(t)["message"].(string); !strings.Contains(msg, "waiting") {
		t.Errorf("429 body %s; want a message about waiting steps", r.body)
	}
	if n := mustOK(t, get(t, steps))["pagination"].(map[string]any)["total_items"]; n != json.Number("2") {
		t.Errorf("steps after the 429 = %v, want 2", n)
	}
}

// blockingStep returns a step handler that waits for release.
func blockingStep(release <-chan struct{}) func(context.Context, *dispatcherv1.ExecuteStepRequest) (*dispatcherv1.ExecuteStepResponse, error) {
	return func(ctx context.Context, req *dispatcherv1.ExecuteStepRequest) (*dispatcherv1.ExecuteStepResponse, error) {
		select {
		case <-release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return echoStep(ctx, req)
	}
}

func TestSteps_returnAtOnceAndWaitLimit(t *testing.T) {
	release := make(chan struct{})
	_, conn := startFakeDispatcher(t, blockingStep(release))
	e := startTasks(t, t.TempDir(), conn, func(c *config.Config) { c.StepWait = 50 * time.Millisecond })
	task := e.createTask(t, `{}`)
	url := e.url + ap + "/" + task + "/steps"
	tests := []struct {
		name   string
		query  string
		header []string
		want   []string
	}{
		{"Prefer respond-async", "", []string{"Prefer", "respond-async"}, []string{"created"}},
		{"wait=0", "?wait=0", nil, []string{"created"}},
		{"wait limit", "", nil, []string{"running", "created"}},
		{"shorter wait", "?wait=10ms", nil, []string{"running", "created"}},
	}
	var ids []string
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := mustOK(t, postJSON(t, url+tc.query, `{"input":"x"}`, tc.header...))
			ok := false
			for _, w := range tc.want {
				ok = ok || m["status"] == w
			}
			if !ok {
				t.Errorf("status = %v, want one of %v", m["status"], tc.want)
			}
			ids = append(ids, m["step_id"].(string))
		})
	}
	if r := postJSON(t, url+"?wait=soon", `{}`); r.code != http.StatusBadRequest {
		t.Errorf("wait=soon = %d, want 400", r.code)
	}
	eventually(t, "steps run", func() (bool, string) {
		r := get(t, url+"/"+ids[0])
		return r.json(t)["status"] == "running", string(r.body)
	})
	close(release)
	for _, id := range ids {
		eventually(t, "released steps complete", func() (bool, string) {
			r := get(t, url+"/"+id)
			return r.json(t)["status"] == "completed", string(r.body)
		})
	}
}

func TestEvents_streamStepUpdates(t *testing.T) {
	release := make(chan struct{})
	_, conn := startFakeDispatcher(t, blockingStep(release))
	e := startTasks(t, t.TempDir(), conn, func(c *config.Config) { c.MaxWatchers = 1 })
	task := e.createTask(t, `{}`)
	ev := openEvents(t, e.url+ap+"/"+task+"/events")
	if ct := ev.resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("Content-Type = %q, want text/event-stream", ct)
	}
	if r := get(t, e.url+ap+"/"+task+"/events"); r.code != http.StatusTooManyRequests {
		t.Errorf("second stream with --ap-max-watchers=1 = %d %s, want 429", r.code, r.body)
	}
	step := mustOK(t, postJSON(t, e.url+ap+"/"+task+"/steps?wait=0", `{"input":"x"}`))
	var statuses []string
	for _, want := range []string{"created", "running"} {
		m := ev.next(t)
		statuses = append(statuses, m["status"].(string))
		if m["status"] != want || m["step_id"] != step["step_id"] {
			t.Fatalf("events so far %v; want %s for step %v", statuses, want, step["step_id"])
		}
	}
	close(release)
	if m := ev.next(t); m["status"] != "completed" || m["output"] != "echo: x" {
		t.Errorf("third event = %v, want the completed step", m)
	}
}

func TestCancel(t *testing.T) {
	fake, conn := startFakeDispatcher(t, noExecutor)
	e := startTasks(t, t.TempDir(), conn)
	task := e.createTask(t, `{}`)
	parked := mustOK(t, postJSON(t, e.url+ap+"/"+task+"/steps", `{"input":"x"}`))
	r := postJSON(t, e.url+ap+"/"+task+":cancel", ``)
	if m := mustOK(t, r); m["state"] != "cancelled" {
		t.Errorf("cancel = %s, want state cancelled", r.body)
	}
	if m := mustOK(t, postJSON(t, e.url+ap+"/"+task+":cancel", ``)); m["state"] != "cancelled" {
		t.Errorf("second cancel = %v, want cancelled again", m)
	}
	after := mustOK(t, postJSON(t, e.url+ap+"/"+task+"/steps", `{"input":"y"}`))
	if after["status"] != "completed" || !strings.Contains(after["output"].(string), "cancelled") {
		t.Errorf("step after cancel = %v, want completed with an output saying the task was cancelled", after)
	}
	fake.set(echoStep)
	calls := len(fake.requests())
	// A fresh task proves the executor still runs; the cancelled task's
	// parked step ends with an output saying so, without running.
	other := e.createTask(t, `{}`)
	mustOK(t, postJSON(t, e.url+ap+"/"+other+"/steps", `{"input":"x"}`))
	eventually(t, "the parked step of the cancelled task ends", func() (bool, string) {
		g := mustOK(t, get(t, e.url+ap+"/"+task+"/steps/"+parked["step_id"].(string)))
		return g["status"] == "completed" && strings.Contains(fmt.Sprint(g["output"]), "cancelled"), fmt.Sprint(g)
	})
	for _, req := range fake.requests()[calls:] {
		if req.GetTaskId() == task {
			t.Errorf("ExecuteStep ran a step of the cancelled task: %v", req)
		}
	}

	finished := e.createTask(t, `{}`)
	mustOK(t, postJSON(t, e.url+ap+"/"+finished+"/steps", `{"input":"last"}`))
	if r := postJSON(t, e.url+ap+"/"+finished+":cancel", ``); r.code != http.StatusBadRequest {
		t.Errorf("cancel finished task = %d %s, want 400", r.code, r.body)
	}
	if r := postJSON(t, e.url+ap+"/"+finished+":stop", ``); r.code != http.StatusNotFound {
		t.Errorf("unknown verb = %d, want 404", r.code)
	}
}

func TestRestart_keepsEverythingAndResumesPendingSteps(t *testing.T) {
	fake, conn := startFakeDispatcher(t, echoStep)
	dir := t.TempDir()
	e := startTasks(t, dir, conn)
	task := e.createTask(t, `{"input":"durable","additional_input":{"a":[1,2]}}`)
	done := mustOK(t, postJSON(t, e.url+ap+"/"+task+"/steps", `{"input":"file"}`))
	art := mustOK(t, upload(t, e.url+ap+"/"+task+"/artifacts", filePart("notes.txt", "keep me")))
	fake.set(noExecutor)
	parked := mustOK(t, postJSON(t, e.url+ap+"/"+task+"/steps", `{"input":"later"}`))
	e.stop()

	fake.set(echoStep)
	e = startTasks(t, dir, conn)
	tk := mustOK(t, get(t, e.url+ap+"/"+task))
	if tk["input"] != "durable" || string(mustMarshal(tk["additional_input"])) != `{"a":[1,2]}` || len(tk["artifacts"].([]any)) != 2 {
		t.Errorf("task after restart = %v", tk)
	}
	if s := mustOK(t, get(t, e.url+ap+"/"+task+"/steps/"+done["step_id"].(string))); s["output"] != "echo: file" {
		t.Errorf("completed step after restart = %v", s)
	}
	if d := get(t, e.url+ap+"/"+task+"/artifacts/"+art["artifact_id"].(string)); string(d.body) != "keep me" {
		t.Errorf("artifact after restart = %d %q", d.code, d.body)
	}
	eventually(t, "the pending step resumes after restart", func() (bool, string) {
		r := get(t, e.url+ap+"/"+task+"/steps/"+parked["step_id"].(string))
		return r.json(t)["status"] == "completed", string(r.body)
	})
}

func TestGRPC_createThenReadOverREST(t *testing.T) {
	_, conn := startFakeDispatcher(t, echoStep)
	e := startTasks(t, t.TempDir(), conn)
	ctx := t.Context()
	var names []string
	for i := range 5 {
		tk, err := e.client.CreateTask(ctx, &tasksv1.CreateTaskRequest{Task: &tasksv1.Task{Agent: "clients/default/agents/agent", Input: fmt.Sprint("in", i)}})
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, tk.GetName())
	}
	if m := mustOK(t, get(t, e.url+ap+"/"+strings.TrimPrefix(names[0], "tasks/"))); m["input"] != "in0" {
		t.Errorf("REST read of a gRPC-created task = %v", m)
	}
	var got []string
	token := ""
	for {
		resp, err := e.client.ListTasks(ctx, &tasksv1.ListTasksRequest{Agent: "clients/default/agents/agent", PageSize: 2, PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		for _, tk := range resp.GetTasks() {
			got = append(got, tk.GetName())
		}
		if resp.GetTotalSize() != 5 {
			t.Errorf("total_size = %d, want 5", resp.GetTotalSize())
		}
		if token = resp.GetNextPageToken(); token == "" {
			break
		}
	}
	if strings.Join(got, ",") != strings.Join(names, ",") {
		t.Errorf("paged names = %v, want %v", got, names)
	}
	st, err := e.client.CreateStep(ctx, &tasksv1.CreateStepRequest{Parent: names[0], Step: &tasksv1.Step{Input: proto.String("hi")}})
	if err != nil || st.GetStatus() != tasksv1.Step_STATUS_COMPLETED || st.GetOutput() != "echo: hi" {
		t.Errorf("CreateStep = %v, %v; want completed", st, err)
	}
	if _, err := e.client.GetTask(ctx, &tasksv1.GetTaskRequest{Name: "tasks/../x"}); err == nil {
		t.Errorf("GetTask(bad name) = nil error, want INVALID_ARGUMENT")
	}
}

// additional_input over gRPC gets the nesting limit too; 64 levels pass.
func TestGRPC_additionalInputNestedTooDeepIsRefused(t *testing.T) {
	_, conn := startFakeDispatcher(t, echoStep)
	e := startTasks(t, t.TempDir(), conn)
	nest := func(n int) []byte {
		return []byte(strings.Repeat(`{"a":`, n-1) + `{}` + strings.Repeat(`}`, n-1))
	}
	deep, ok := nest(65), nest(64)
	_, err := e.client.CreateTask(t.Context(), &tasksv1.CreateTaskRequest{Task: &tasksv1.Task{Agent: "clients/default/agents/agent", AdditionalInputJson: deep}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "64 levels") {
		t.Errorf("CreateTask(additional_input 65 deep) = %v, want INVALID_ARGUMENT naming the limit", err)
	}
	tk, err := e.client.CreateTask(t.Context(), &tasksv1.CreateTaskRequest{Task: &tasksv1.Task{Agent: "clients/default/agents/agent", AdditionalInputJson: ok}})
	if err != nil {
		t.Fatalf("CreateTask(additional_input 64 deep) = %v", err)
	}
	_, err = e.client.CreateStep(t.Context(), &tasksv1.CreateStepRequest{Parent: tk.GetName(), Step: &tasksv1.Step{Input: proto.String("hi"), AdditionalInputJson: deep}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "64 levels") {
		t.Errorf("CreateStep(additional_input 65 deep) = %v, want INVALID_ARGUMENT naming the limit", err)
	}
}

func TestMetrics_countStepAttempts(t *testing.T) {
	_, conn := startFakeDispatcher(t, echoStep)
	e := startTasks(t, t.TempDir(), conn)
	task := e.createTask(t, `{}`)
	mustOK(t, postJSON(t, e.url+ap+"/"+task+"/steps", `{"input":"x"}`))
	r := get(t, e.url+"/metrics")
	for _, want := range []string{`parley_tasks_step_attempts_total{result="completed"} 1`, "parley_tasks_waiting_steps 0", "parley_tasks_event_streams 0"} {
		if !strings.Contains(string(r.body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// A graceful stop ends open WatchTask streams with UNAVAILABLE instead of
// waiting the whole ShutdownTimeout (2 s) for them.
func TestWatchTask_endsOnShutdown(t *testing.T) {
	_, conn := startFakeDispatcher(t, echoStep)
	e := startTasks(t, t.TempDir(), conn)
	tk, err := e.client.CreateTask(t.Context(), &tasksv1.CreateTaskRequest{Task: &tasksv1.Task{Agent: "clients/default/agents/agent"}})
	if err != nil {
		t.Fatal(err)
	}
	c2, err := grpc.NewClient(e.conn.Target(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	st, err := tasksv1.NewTasksServiceClient(c2).WatchTask(t.Context(), &tasksv1.WatchTaskRequest{Name: tk.GetName()})
	if err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	go func() {
		for {
			if _, err := st.Recv(); err != nil {
				ended <- err
				return
			}
		}
	}()
	eventually(t, "the stream is open on the server", func() (bool, string) {
		v := e.metric(t, "parley_tasks_event_streams")
		return v == "1", v
	})
	e.stop()
	// SHUTTING_DOWN comes from the server ending the stream on Stopping; a
	// stop that waited out ShutdownTimeout would cut the transport instead.
	if err := <-ended; status.Code(err) != codes.Unavailable || grpcerr.Reason(err) != "SHUTTING_DOWN" {
		t.Errorf("WatchTask ended with %v; want UNAVAILABLE SHUTTING_DOWN", err)
	}
}

// TestGRPC_notFoundReasonNamesTheResource proves the NOT_FOUND reason comes
// from the store's error, which names the missing resource.
func TestGRPC_notFoundReasonNamesTheResource(t *testing.T) {
	_, conn := startFakeDispatcher(t, echoStep)
	e := startTasks(t, t.TempDir(), conn)
	ctx := t.Context()
	tk, err := e.client.CreateTask(ctx, &tasksv1.CreateTaskRequest{Task: &tasksv1.Task{Agent: "clients/default/agents/agent"}})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		call func() error
		want string
	}{
		{"task", func() error {
			_, err := e.client.GetTask(ctx, &tasksv1.GetTaskRequest{Name: "tasks/nope"})
			return err
		}, "TASK_NOT_FOUND"},
		{"step", func() error {
			_, err := e.client.GetStep(ctx, &tasksv1.GetStepRequest{Name: tk.GetName() + "/steps/nope"})
			return err
		}, "STEP_NOT_FOUND"},
		{"artifact", func() error {
			_, err := e.client.GetArtifact(ctx, &tasksv1.GetArtifactRequest{Name: tk.GetName() + "/artifacts/nope"})
			return err
		}, "ARTIFACT_NOT_FOUND"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			if status.Code(err) != codes.NotFound || grpcerr.Reason(err) != tt.want {
				t.Errorf("error = %v (reason %q), want NOT_FOUND %s", err, grpcerr.Reason(err), tt.want)
			}
		})
	}
}
