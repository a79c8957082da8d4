package app_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"log/slog"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	tasksv1 "github.com/parleyhq/parley/gen/parley/tasks/v1"
	"github.com/parleyhq/parley/platform/pgdb/pgdbtest"
	"github.com/parleyhq/parley/platform/serve"
	"github.com/parleyhq/parley/services/tasks/app"
	"github.com/parleyhq/parley/services/tasks/config"
	"github.com/parleyhq/parley/services/tasks/internal/store/pgstore"
)

// TestPostgreSQL_twoReplicasShareTasksAndArtifacts runs two tasks services
// on one PostgreSQL database (--database-url), each with its own empty data
// directory: what one writes, the other serves, artifact bytes included,
// with the same size cap and name rules, and neither writes a file.
func TestPostgreSQL_twoReplicasShareTasksAndArtifacts(t *testing.T) {
	url := pgdbtest.Database(t)
	_, conn := startFakeDispatcher(t, echoStep)
	onPG := func(c *config.Config) {
		c.DatabaseURL = url
		c.MaxUploadBytes = 1 << 20
	}
	dirA, dirB := t.TempDir(), t.TempDir()
	a := startTasks(t, dirA, conn, onPG)
	b := startTasks(t, dirB, conn, onPG)

	const agentAP = "/agents/acme/writer" + ap
	task := mustOK(t, postJSON(t, a.url+agentAP, `{"input":"task input"}`))["task_id"].(string)
	step := mustOK(t, postJSON(t, a.url+agentAP+"/"+task+"/steps", `{"input":"file"}`))
	if step["status"] != "completed" {
		t.Fatalf("step on A = %v; want completed", step)
	}
	agentArt := step["artifacts"].([]any)[0].(map[string]any)["artifact_id"].(string)
	big := strings.Repeat("0123456789", 70_000) // 700 kB: several chunks
	up := mustOK(t, upload(t, a.url+agentAP+"/"+task+"/artifacts", func(mw *multipart.Writer) {
		filePart("big.txt", big)(mw)
		fieldPart("relative_path", "out/")(mw)
	}))

	base := b.url + agentAP + "/" + task
	if st := mustOK(t, get(t, base+"/steps"))["pagination"].(map[string]any)["total_items"]; st != json.Number("1") {
		t.Errorf("steps seen on B = %v, want 1", st)
	}
	if d := get(t, base+"/artifacts/"+agentArt); string(d.body) != "Washington" {
		t.Errorf("agent artifact read on B = %d %q, want Washington", d.code, d.body)
	}
	d := get(t, base+"/artifacts/"+up["artifact_id"].(string))
	if d.code != http.StatusOK || string(d.body) != big {
		t.Errorf("uploaded artifact read on B = %d, %d bytes; want 200, %d bytes", d.code, len(d.body), len(big))
	}
	// The cap and the name rules hold on B, and a refusal stores nothing.
	if r := upload(t, base+"/artifacts", filePart("huge.bin", strings.Repeat("x", 1<<20+1))); r.code != http.StatusRequestEntityTooLarge {
		t.Errorf("oversized upload on B = %d %s, want 413", r.code, r.body)
	}
	if r := upload(t, base+"/artifacts", filePart("../../evil", "x")); r.code != http.StatusBadRequest {
		t.Errorf("traversing upload on B = %d %s, want 400", r.code, r.body)
	}
	if n := mustOK(t, get(t, a.url+agentAP+"/"+task+"/artifacts"))["pagination"].(map[string]any)["total_items"]; n != json.Number("2") {
		t.Errorf("artifacts seen on A = %v, want the agent's and the upload", n)
	}
	for _, dir := range []string{dirA, dirB} {
		_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				t.Errorf("the PostgreSQL deployment wrote %s", p)
			}
			return nil
		})
	}
	if _, err := os.Stat(filepath.Join(dirA, "artifacts")); err == nil {
		t.Errorf("an artifact folder was made in the data directory")
	}
}

// Close stops the orphan scan Register starts on PostgreSQL and waits for
// it, even while Register's context lives: the store is closed next, and
// nothing may touch it after that.
func TestPostgreSQL_closeStopsAndWaitsForTheOrphanScan(t *testing.T) {
	url := pgdbtest.Database(t)
	a, _, scans := startScanning(t, url)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if n := scans(); n != 0 {
		t.Errorf("%d orphan scans still run after Close returned; want 0", n)
	}
}

// The orphan scan ends as soon as shutdown starts, while Register's
// context lives and before Close: a draining replica claims none of a dead
// replica's steps, which stay for a replica that keeps serving.
func TestPostgreSQL_orphanScanEndsWhenShutdownStarts(t *testing.T) {
	url := pgdbtest.Database(t)
	a, srv, scans := startScanning(t, url)
	defer a.Close()
	// Shutdown starts (Stopping closes) as Run's context ends; Register's
	// context lives on.
	runCtx, shutdown := context.WithCancel(t.Context())
	ran := make(chan error, 1)
	go func() { ran <- srv.Run(runCtx, listen(t), listen(t)) }()
	shutdown()
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	eventually(t, "the orphan scan ends before Close", func() (bool, string) {
		n := scans()
		return n == 0, fmt.Sprintf("%d scans", n)
	})

	// A replica that died leaves a pending step; the draining replica
	// does not take it: the next live replica claims it.
	dead, err := pgstore.Open(t.Context(), url, pgstore.Schema, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	task := &tasksv1.Task{Name: "tasks/t1", Agent: "clients/c/agents/a", Input: "x"}
	if err := dead.CreateTask(t.Context(), task); err != nil {
		t.Fatal(err)
	}
	step := &tasksv1.Step{Name: "tasks/t1/steps/s1", Status: tasksv1.Step_STATUS_CREATED}
	if _, err := dead.CreateStep(t.Context(), "t1", step, func(*tasksv1.Task, *tasksv1.Step) error { return nil }); err != nil {
		t.Fatal(err)
	}
	dead.Close()
	live, err := pgstore.Open(t.Context(), url, pgstore.Schema, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	eventually(t, "a live replica claims the dead one's step", func() (bool, string) {
		got, err := live.ClaimOrphans(t.Context())
		return err == nil && len(got) == 1, fmt.Sprintf("%v, %v", got, err)
	})
}

// orphanScan is on the stack of every running orphan scan.
const orphanScan = "pgdb.Tick("

// startScanning registers a tasks app on the PostgreSQL database url, so
// that it runs its orphan scan, and waits for the scan to run. scans
// counts the orphan scans started since.
func startScanning(t *testing.T, url string) (a *app.App, srv *serve.Server, scans func() int) {
	t.Helper()
	_, conn := startFakeDispatcher(t, echoStep)
	cfg, err := testConfig(t.TempDir(), func(c *config.Config) { c.DatabaseURL = url })
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.DiscardHandler)
	a, err = app.New(cfg, logger, app.Peers{Dispatcher: conn})
	if err != nil {
		t.Fatal(err)
	}
	srv, err = serve.New(serve.Options{Logger: logger, ShutdownTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	before := goroutinesIn(orphanScan)
	scans = func() int { return goroutinesIn(orphanScan) - before }
	if err := a.Register(t.Context(), srv); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the orphan scan runs", func() (bool, string) {
		n := scans()
		return n == 1, fmt.Sprintf("%d scans", n)
	})
	return a, srv, scans
}
