package app_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"mime/multipart"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	tasksv1 "github.com/parleyhq/parley/gen/parley/tasks/v1"
	"github.com/parleyhq/parley/platform/serve"
	"github.com/parleyhq/parley/services/tasks/app"
	"github.com/parleyhq/parley/services/tasks/config"
)

// env is a running tasks service: REST base URL and gRPC client.
type env struct {
	url    string
	client tasksv1.TasksServiceClient
	conn   *grpc.ClientConn
	stop   func() // stops the server and closes the app; idempotent
}

// testConfig is the configuration tests run with: fast retries.
func testConfig(dir string, opts ...func(*config.Config)) (config.Config, error) {
	cfg, err := config.Load([]string{"--data", dir}, func(string) string { return "" })
	cfg.RetryMax = 20 * time.Millisecond
	cfg.StepWait = 5 * time.Second
	for _, o := range opts {
		o(&cfg)
	}
	return cfg, err
}

// startTasks runs the tasks app on two 127.0.0.1:0 listeners over dir,
// executing steps through dispatcher.
func startTasks(t testing.TB, dir string, dispatcher grpc.ClientConnInterface, opts ...func(*config.Config)) *env {
	t.Helper()
	cfg, err := testConfig(dir, opts...)
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.DiscardHandler)
	a, err := app.New(cfg, logger, app.Peers{Dispatcher: dispatcher})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := serve.New(serve.Options{Logger: logger, ShutdownTimeout: 2 * time.Second})
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
	conn, err := grpc.NewClient(grpcLis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	e := &env{url: "http://" + httpLis.Addr().String(), client: tasksv1.NewTasksServiceClient(conn), conn: conn}
	e.stop = func() {
		if stopped {
			return
		}
		stopped = true
		conn.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		if err := a.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}
	t.Cleanup(e.stop)
	return e
}

func listen(t testing.TB) net.Listener {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return lis
}

// response is an HTTP response read in full.
type response struct {
	code   int
	header http.Header
	body   []byte
}

func (r response) json(t testing.TB) map[string]any {
	t.Helper()
	var m map[string]any
	dec := json.NewDecoder(bytes.NewReader(r.body))
	dec.UseNumber()
	if err := dec.Decode(&m); err != nil {
		t.Fatalf("response %d %q is not a JSON object: %v", r.code, r.body, err)
	}
	return m
}

func do(t testing.TB, method, url, contentType string, body io.Reader, header ...string) response {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return response{code: resp.StatusCode, header: resp.Header, body: b}
}

func get(t testing.TB, url string) response { return do(t, http.MethodGet, url, "", nil) }

func postJSON(t testing.TB, url, body string, header ...string) response {
	return do(t, http.MethodPost, url, "application/json", strings.NewReader(body), header...)
}

// mustOK fails unless r is 200 and returns its JSON.
func mustOK(t testing.TB, r response) map[string]any {
	t.Helper()
	if r.code != http.StatusOK {
		t.Fatalf("status %d, body %s; want 200", r.code, r.body)
	}
	return r.json(t)
}

func (e *env) createTask(t testing.TB, body string) string {
	t.Helper()
	return mustOK(t, postJSON(t, e.url+"/ap/v1/agent/tasks", body))["task_id"].(string)
}

// upload posts a multipart body whose parts are written by write.
func upload(t testing.TB, url string, write func(*multipart.Writer)) response {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	write(mw)
	mw.Close()
	return do(t, http.MethodPost, url, mw.FormDataContentType(), &buf)
}

// filePart and fieldPart write one part of a multipart body. The body is a
// bytes.Buffer, which cannot fail, so their errors are ignored.
func filePart(name, content string) func(*multipart.Writer) {
	return func(mw *multipart.Writer) {
		w, _ := mw.CreateFormFile("file", name)
		_, _ = io.WriteString(w, content)
	}
}

func fieldPart(name, value string) func(*multipart.Writer) {
	return func(mw *multipart.Writer) { _ = mw.WriteField(name, value) }
}

// eventually polls cond until it holds or 10s pass.
func eventually(t testing.TB, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, last := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: gave up after 10s; last: %s", what, last)
		}
		<-tick.C
	}
}

// sseReader reads server-sent events.
type sseReader struct {
	resp *http.Response
	sc   *bufio.Scanner
}

func openEvents(t testing.TB, url string) *sseReader {
	t.Helper()
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return &sseReader{resp: resp, sc: bufio.NewScanner(resp.Body)}
}

// next returns the data of the next event.
func (r *sseReader) next(t testing.TB) map[string]any {
	t.Helper()
	var data string
	for r.sc.Scan() {
		line := r.sc.Text()
		switch {
		case strings.HasPrefix(line, "data: "):
			data = strings.TrimPrefix(line, "data: ")
		case line == "" && data != "":
			return response{code: 200, body: []byte(data)}.json(t)
		}
	}
	t.Fatalf("event stream ended: %v", r.sc.Err())
	return nil
}

func jsonNumber(n int) json.Number { return json.Number(fmt.Sprint(n)) }

// postDecode posts body and decodes a 200 JSON answer into v; false on any
// failure (the server may be dead).
func postDecode(client *http.Client, url, contentType string, body io.Reader, v any) bool {
	resp, err := client.Post(url, contentType, body)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	return resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(v) == nil
}

func multipartBody(name, content string) (io.Reader, string) {
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	filePart(name, content)(mw)
	mw.Close()
	return &buf, mw.FormDataContentType()
}

// goroutinesIn counts the goroutines with fn on their stack.
func goroutinesIn(fn string) int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Count(string(buf[:n]), fn)
		}
		buf = make([]byte, 2*len(buf))
	}
}
