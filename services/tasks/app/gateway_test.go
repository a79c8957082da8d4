package app_test

import (
	"context"
	"flag"
	"log/slog"
	"mime/multipart"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/parleyhq/parley/platform/serve"
	"github.com/parleyhq/parley/services/tasks/app"
	"github.com/parleyhq/parley/services/tasks/config"
)

// startGateway runs `parley gateway`'s tasks routes against e over gRPC,
// with the gateway's command-line flags args.
func startGateway(t *testing.T, conn *grpc.ClientConn, args ...string) string {
	t.Helper()
	var cfg config.Config
	fs := flag.NewFlagSet("parley gateway", flag.ContinueOnError)
	cfg.RegisterGatewayFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	srv, err := serve.New(serve.Options{Logger: slog.New(slog.DiscardHandler), ShutdownTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := app.RegisterGateway(ctx, srv, app.GatewayPeers{Tasks: conn}, cfg); err != nil {
		t.Fatal(err)
	}
	grpcLis, httpLis := listen(t), listen(t)
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, grpcLis, httpLis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run() error = %v", err)
		}
	})
	return "http://" + httpLis.Addr().String()
}

// TestGateway_servesTheConfiguredAgent proves a standalone gateway serves
// the --ap-agent it is given at /ap/v1/agent, not only default:agent.
func TestGateway_servesTheConfiguredAgent(t *testing.T) {
	_, dconn := startFakeDispatcher(t, echoStep)
	e := startTasks(t, t.TempDir(), dconn)
	gw := startGateway(t, e.conn, "--ap-agent", "acme:bot")
	task := mustOK(t, postJSON(t, gw+ap, `{"input":"for bot"}`))["task_id"].(string)
	if m := mustOK(t, get(t, e.url+"/agents/acme/bot"+ap+"/"+task)); m["input"] != "for bot" {
		t.Errorf("task created at the gateway's /ap/v1/agent = %v, want it on acme:bot", m)
	}
	if r := get(t, e.url+ap+"/"+task); r.code != http.StatusNotFound {
		t.Errorf("GET the task on default:agent = %d %s, want 404", r.code, r.body)
	}
}

func TestGateway_servesAgentProtocolOverGRPC(t *testing.T) {
	_, dconn := startFakeDispatcher(t, echoStep)
	e := startTasks(t, t.TempDir(), dconn)
	gw := startGateway(t, e.conn)

	task := mustOK(t, postJSON(t, gw+ap, `{"input":"via gateway"}`))["task_id"].(string)
	if m := mustOK(t, get(t, e.url+ap+"/"+task)); m["input"] != "via gateway" {
		t.Errorf("task created through the gateway = %v", m)
	}
	ev := openEvents(t, gw+ap+"/"+task+"/events")
	step := mustOK(t, postJSON(t, gw+ap+"/"+task+"/steps", `{"input":"file"}`))
	if step["status"] != "completed" {
		t.Fatalf("step through the gateway = %v", step)
	}
	if m := ev.next(t); m["step_id"] != step["step_id"] {
		t.Errorf("gateway event = %v, want step %v", m, step["step_id"])
	}
	art := mustOK(t, upload(t, gw+ap+"/"+task+"/artifacts", filePart("a.txt", "gateway bytes")))
	if d := get(t, gw+ap+"/"+task+"/artifacts/"+art["artifact_id"].(string)); string(d.body) != "gateway bytes" || d.header.Get("Content-Type") != "application/octet-stream" {
		t.Errorf("download through the gateway = %d %q %v", d.code, d.body, d.header)
	}
	list := mustOK(t, get(t, gw+ap+"/"+task+"/artifacts?page_size=1"))
	if p := list["pagination"].(map[string]any); p["total_items"] != jsonNumber(2) {
		t.Errorf("artifact pagination through the gateway = %v, want 2 items", p)
	}
	tests := []struct {
		name, method, path, body string
		want                     int
	}{
		{"unknown task", "GET", ap + "/nope", "", http.StatusNotFound},
		{"bad body", "POST", ap, `{"input":1}`, http.StatusUnprocessableEntity},
		{"bad page", "GET", ap + "?current_page=0", "", http.StatusBadRequest},
		{"traversal", "POST", ap + "/" + task + "/artifacts?relative_path=../x", "", http.StatusBadRequest},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var r response
			if tc.name == "traversal" {
				r = upload(t, gw+ap+"/"+task+"/artifacts", func(mw *multipart.Writer) {
					fieldPart("relative_path", "../x")(mw)
					filePart("x", "x")(mw)
				})
			} else {
				r = do(t, tc.method, gw+tc.path, "application/json", strings.NewReader(tc.body))
			}
			if r.code != tc.want {
				t.Errorf("%s %s = %d %s, want %d", tc.method, tc.path, r.code, r.body, tc.want)
			}
		})
	}
}
