package app_test

import (
	"context"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/parleyhq/parley/platform/serve"
	"github.com/parleyhq/parley/services/tasks/app"
)

// startTasksWithLimits runs the tasks app behind a server with the given
// connection limits and returns the REST base URL.
func startTasksWithLimits(t *testing.T, l serve.Limits) string {
	t.Helper()
	_, conn := startFakeDispatcher(t, echoStep)
	cfg, err := testConfig(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.DiscardHandler)
	a, err := app.New(cfg, logger, app.Peers{Dispatcher: conn})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := serve.New(serve.Options{Logger: logger, ShutdownTimeout: 2 * time.Second, Limits: l})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := a.Register(ctx, srv); err != nil {
		t.Fatal(err)
	}
	grpcLis, httpLis := listen(t), listen(t)
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, grpcLis, httpLis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		if err := a.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return "http://" + httpLis.Addr().String()
}

func TestEvents_streamOutlivesTheWriteTimeout(t *testing.T) {
	// The write timeout also bounds the plain POSTs below, so it is long
	// enough for them on a loaded CI machine; the stream must outlive it.
	const write = time.Second
	url := startTasksWithLimits(t, serve.Limits{WriteTimeout: write})
	r := postJSON(t, url+ap, `{}`)
	task := mustOK(t, r)["task_id"].(string)
	ev := openEvents(t, url+ap+"/"+task+"/events")
	if ev.resp.StatusCode != http.StatusOK {
		t.Fatalf("GET events = %d, want 200", ev.resp.StatusCode)
	}
	time.Sleep(2 * write) // let the server's write timeout pass on the open stream
	mustOK(t, postJSON(t, url+ap+"/"+task+"/steps", `{"input":"x"}`))
	if m := ev.next(t); m["status"] == nil {
		t.Errorf("event after the write timeout = %v, want a step", m)
	}
}
