package app_test

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/platform/serve"
	"github.com/parleyhq/parley/services/tasks/app"
)

// crashChildEnv names the data directory when the test binary runs as the
// server subprocess of TestKill9_losesNothingAcknowledged.
const crashChildEnv = "PARLEY_TASKS_CRASH_CHILD_DATA"

func TestMain(m *testing.M) {
	if dir := os.Getenv(crashChildEnv); dir != "" {
		if err := runCrashChild(dir); err != nil {
			fmt.Fprintln(os.Stderr, "crash child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// runCrashChild serves the tasks app over dir, with a fakeDispatcher
// running echoStep, until it is killed. It prints "URL <base>" on stdout.
func runCrashChild(dir string) error {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	gs := grpc.NewServer()
	dispatcherv1.RegisterDispatcherServiceServer(gs, &fakeDispatcher{execute: echoStep})
	go func() { _ = gs.Serve(lis) }() // serves until the process is killed
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	cfg, err := testConfig(dir)
	if err != nil {
		return err
	}
	logger := slog.New(slog.DiscardHandler)
	a, err := app.New(cfg, logger, app.Peers{Dispatcher: conn})
	if err != nil {
		return err
	}
	srv, err := serve.New(serve.Options{Logger: logger})
	if err != nil {
		return err
	}
	if err := a.Register(context.Background(), srv); err != nil {
		return err
	}
	grpcLis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	httpLis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	fmt.Printf("URL http://%s\n", httpLis.Addr())
	return srv.Run(context.Background(), grpcLis, httpLis)
}

// acked records what the killed server acknowledged.
type acked struct {
	mu        sync.Mutex
	tasks     map[string]string    // task id -> input
	steps     map[[2]string]string // task, step -> output ("" when acknowledged as created)
	artifacts map[[2]string]string // task, artifact -> content
}

func TestKill9_losesNothingAcknowledged(t *testing.T) {
	if testing.Short() {
		t.Skip("kills a server subprocess under load")
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), crashChildEnv+"="+dir)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	t.Cleanup(func() {
		if !killed {
			_ = cmd.Process.Kill() // the test failed before killing it; it may be gone already
		}
		_ = cmd.Wait() // killed by a signal: an error by design
	})
	sc := bufio.NewScanner(out)
	if !sc.Scan() || !strings.HasPrefix(sc.Text(), "URL ") {
		t.Fatalf("child did not print its URL: %q %v", sc.Text(), sc.Err())
	}
	base := strings.TrimPrefix(sc.Text(), "URL ") + ap

	got := &acked{tasks: map[string]string{}, steps: map[[2]string]string{}, artifacts: map[[2]string]string{}}
	var ops atomic.Int64
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 10 * time.Second}
	for w := range 16 {
		wg.Go(func() { crashWorker(client, base, w, got, &ops) })
	}
	// 300 acknowledged writes are plenty to lose some on a bad commit path,
	// and a loaded CI machine under -race reaches them well within 10s.
	eventually(t, "load builds up", func() (bool, string) {
		return ops.Load() >= 300, fmt.Sprint(ops.Load(), " operations acknowledged")
	})
	if err := cmd.Process.Kill(); err != nil { // SIGKILL: no shutdown code runs
		t.Fatal(err)
	}
	killed = true
	wg.Wait()
	t.Logf("killed after %d acknowledged operations: %d tasks, %d steps, %d artifacts", ops.Load(), len(got.tasks), len(got.steps), len(got.artifacts))

	_, conn := startFakeDispatcher(t, echoStep)
	e := startTasks(t, dir, conn)
	for id, input := range got.tasks {
		if m := mustOK(t, get(t, e.url+ap+"/"+id)); m["input"] != input {
			t.Errorf("task %s after kill -9 = %v, want input %q", id, m, input)
		}
	}
	for k, output := range got.steps {
		r := get(t, e.url+ap+"/"+k[0]+"/steps/"+k[1])
		if r.code != http.StatusOK {
			t.Errorf("step %s after kill -9 = %d %s", k[1], r.code, r.body)
			continue
		}
		if m := r.json(t); output != "" && m["output"] != output {
			t.Errorf("completed step %s after kill -9 = %v, want output %q", k[1], m, output)
		}
	}
	for k, content := range got.artifacts {
		if d := get(t, e.url+ap+"/"+k[0]+"/artifacts/"+k[1]); d.code != http.StatusOK || string(d.body) != content {
			t.Errorf("artifact %s after kill -9 = %d %q, want %q", k[1], d.code, d.body, content)
		}
	}
}

// crashWorker creates tasks, steps (waited for, and returned at once) and
// uploads until the server dies, recording every acknowledgement.
func crashWorker(client *http.Client, base string, w int, got *acked, ops *atomic.Int64) {
	for i := 0; ; i++ {
		input := fmt.Sprintf("w%d-%d", w, i)
		var task struct {
			TaskID string `json:"task_id"`
		}
		if !postDecode(client, base, "application/json", strings.NewReader(`{"input":"`+input+`"}`), &task) {
			return
		}
		got.mu.Lock()
		got.tasks[task.TaskID] = input
		got.mu.Unlock()
		ops.Add(1)

		for _, q := range []string{"", "?wait=0"} {
			var step struct {
				StepID    string  `json:"step_id"`
				Output    *string `json:"output"`
				Artifacts []struct {
					ArtifactID string `json:"artifact_id"`
				} `json:"artifacts"`
			}
			if !postDecode(client, base+"/"+task.TaskID+"/steps"+q, "application/json", strings.NewReader(`{"input":"file"}`), &step) {
				return
			}
			got.mu.Lock()
			got.steps[[2]string{task.TaskID, step.StepID}] = ""
			if step.Output != nil {
				got.steps[[2]string{task.TaskID, step.StepID}] = *step.Output
			}
			for _, a := range step.Artifacts {
				got.artifacts[[2]string{task.TaskID, a.ArtifactID}] = "Washington"
			}
			got.mu.Unlock()
			ops.Add(1)
		}

		content := "content of " + input
		body, ctype := multipartBody("up.txt", content)
		var art struct {
			ArtifactID string `json:"artifact_id"`
		}
		if !postDecode(client, base+"/"+task.TaskID+"/artifacts", ctype, body, &art) {
			return
		}
		got.mu.Lock()
		got.artifacts[[2]string{task.TaskID, art.ArtifactID}] = content
		got.mu.Unlock()
		ops.Add(1)
	}
}
