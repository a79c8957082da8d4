// Command tasks benchmarks Parley's Agent Protocol endpoints against the
// Agent Protocol JavaScript SDK (npm agent-protocol@1.0.5) in the same run,
// on the same machine, both with a trivial step handler that echoes the
// step's input.
//
// Parley runs as the one-service tasks binary (built from
// ./services/tasks/cmd/tasks) with a bbolt data directory on disk (every
// write fsynced before the response) and --dispatcher-addr pointing at a
// trivial DispatcherService served by this process over loopback gRPC. The
// SDK runs as `node bench/tasks/server.js` (run `npm ci` in bench/tasks
// first).
//
// Usage (from the repository root):
//
//	(cd bench/tasks && npm ci)
//	go run ./bench/tasks [-duration 5s] [-concurrency 16]
//
// For each target and phase (create tasks, execute steps, list tasks) it
// runs -concurrency workers for -duration and prints requests/s, p50 and
// p99 latency, and Parley's ratio over the SDK.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
)

func main() {
	if err := run(os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench/tasks:", err)
		os.Exit(1)
	}
}

// trivialExecutor is the step handler behind Parley's dispatcher port: it
// echoes the input, like the SDK's handler in server.js.
type trivialExecutor struct {
	dispatcherv1.UnimplementedDispatcherServiceServer
}

func (trivialExecutor) ExecuteStep(_ context.Context, req *dispatcherv1.ExecuteStepRequest) (*dispatcherv1.ExecuteStepResponse, error) {
	return &dispatcherv1.ExecuteStepResponse{Output: "echo: " + req.GetInput()}, nil
}

type target struct {
	name string
	url  string // base URL, no trailing slash
}

// run runs the benchmark and writes its table to stdout.
func run(stdout io.Writer) error {
	duration := flag.Duration("duration", 5*time.Second, "length of each phase")
	concurrency := flag.Int("concurrency", 16, "concurrent clients")
	node := flag.String("node", "node", "node binary")
	keepAlive := flag.Bool("keepalive", true, "reuse connections (false: a new TCP connection per request)")
	flag.Parse()

	tmp, err := os.MkdirTemp("", "bench-tasks-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)

	bin := filepath.Join(tmp, "tasks")
	build := exec.Command("go", "build", "-o", bin, "github.com/parleyhq/parley/services/tasks/cmd/tasks")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		return fmt.Errorf("build the tasks binary: %w", err)
	}

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	gs := grpc.NewServer()
	dispatcherv1.RegisterDispatcherServiceServer(gs, trivialExecutor{})
	go func() {
		if err := gs.Serve(lis); err != nil {
			fmt.Fprintln(os.Stderr, "bench/tasks: dispatcher stub:", err)
		}
	}()
	defer gs.Stop()

	parley, stopParley, err := startServer(exec.Command(bin,
		"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
		"--data", filepath.Join(tmp, "data"), "--dispatcher-addr", lis.Addr().String(),
		// The JS SDK it is compared with checks no credential either.
		"--auth=false"), parleyURL)
	if err != nil {
		return fmt.Errorf("start parley: %w", err)
	}
	defer stopParley()
	js := exec.Command(*node, "server.js")
	js.Dir = sourceDir()
	js.Env = append(os.Environ(), "WORKSPACE="+filepath.Join(tmp, "workspace"))
	sdk, stopSDK, err := startServer(js, sdkURL)
	if err != nil {
		return fmt.Errorf("start the JS SDK (did you run npm ci in bench/tasks?): %w", err)
	}
	defer stopSDK()

	targets := []target{{"parley", parley}, {"js-sdk", sdk}}
	phases := []struct {
		name string
		op   func(c *http.Client, base string, state *workerState) error
	}{
		{"create task", createTask},
		{"execute step", executeStep},
		{"list tasks", listTasks},
	}
	fmt.Fprintf(stdout, "duration %s per phase, %d concurrent clients, keep-alive %t, %d cores\n\n", *duration, *concurrency, *keepAlive, numCPU())
	fmt.Fprintln(stdout, "| phase | target | requests/s | p50 | p99 | errors |")
	fmt.Fprintln(stdout, "|---|---|---:|---:|---:|---:|")
	ratios := map[string]float64{}
	for _, ph := range phases {
		rates := map[string]float64{}
		for _, tg := range targets {
			res := measure(tg.url, *concurrency, *duration, *keepAlive, ph.op)
			rates[tg.name] = res.rate
			fmt.Fprintf(stdout, "| %s | %s | %.0f | %s | %s | %d |\n", ph.name, tg.name, res.rate, res.p50.Round(time.Microsecond), res.p99.Round(time.Microsecond), res.errors)
		}
		ratios[ph.name] = rates["parley"] / rates["js-sdk"]
	}
	fmt.Fprintln(stdout)
	for _, ph := range phases {
		fmt.Fprintf(stdout, "ratio parley/js-sdk, %s: %.1fx\n", ph.name, ratios[ph.name])
	}
	return nil
}

func numCPU() int { return runtime.NumCPU() }

// sourceDir is where server.js lives: this package's directory, found from
// the working directory (the repository root or bench/tasks).
func sourceDir() string {
	for _, d := range []string{"bench/tasks", "."} {
		if _, err := os.Stat(filepath.Join(d, "server.js")); err == nil {
			return d
		}
	}
	return "bench/tasks"
}

func parleyURL(line string) string {
	var l struct {
		Msg  string `json:"msg"`
		HTTP string `json:"http"`
	}
	if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "listening" && l.HTTP != "" {
		return "http://" + l.HTTP
	}
	return ""
}

func sdkURL(line string) string {
	if u, ok := strings.CutPrefix(line, "URL "); ok {
		return u
	}
	return ""
}

// startServer starts cmd and waits for a line (on stdout or stderr) from
// which find extracts the base URL.
func startServer(cmd *exec.Cmd, find func(string) string) (string, func(), error) {
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop := func() {
		_ = cmd.Process.Kill() // it may have exited already
		_ = cmd.Wait()         // killed by a signal: an error by design
		pw.Close()
	}
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		sent := false
		for sc.Scan() {
			if u := find(sc.Text()); u != "" && !sent {
				found <- u
				sent = true
			}
		}
	}()
	select {
	case u := <-found:
		return u, stop, nil
	case <-time.After(30 * time.Second):
		stop()
		return "", nil, errors.New("no URL within 30s")
	}
}

// workerState is one client's state across requests (its own task, for
// steps).
type workerState struct {
	taskID string
	n      int
}

var jsonCT = "application/json"

func post(c *http.Client, url, body string) ([]byte, error) {
	resp, err := c.Post(url, jsonCT, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("POST %s: %d %s", url, resp.StatusCode, b)
	}
	return b, nil
}

func createTask(c *http.Client, base string, s *workerState) error {
	s.n++
	_, err := post(c, base+"/ap/v1/agent/tasks", fmt.Sprintf(`{"input":"task %d","additional_input":{"n":%d}}`, s.n, s.n))
	return err
}

func executeStep(c *http.Client, base string, s *workerState) error {
	if s.taskID == "" {
		b, err := post(c, base+"/ap/v1/agent/tasks", `{"input":"steps"}`)
		if err != nil {
			return err
		}
		var t struct {
			TaskID string `json:"task_id"`
		}
		if err := json.Unmarshal(b, &t); err != nil {
			return err
		}
		s.taskID = t.TaskID
	}
	s.n++
	b, err := post(c, base+"/ap/v1/agent/tasks/"+s.taskID+"/steps", fmt.Sprintf(`{"input":"step %d"}`, s.n))
	if err != nil {
		return err
	}
	if !bytes.Contains(b, []byte(`"status":"completed"`)) {
		return fmt.Errorf("step not completed: %s", b)
	}
	return nil
}

func listTasks(c *http.Client, base string, _ *workerState) error {
	resp, err := c.Get(base + "/ap/v1/agent/tasks?current_page=1&page_size=10")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("list: %d", resp.StatusCode)
	}
	return nil
}

type result struct {
	rate     float64
	p50, p99 time.Duration
	errors   int
}

// measure runs op from n workers for d and reports the throughput of
// successful requests and their latency percentiles.
func measure(base string, n int, d time.Duration, keepAlive bool, op func(*http.Client, string, *workerState) error) result {
	tr := &http.Transport{MaxIdleConnsPerHost: n, MaxConnsPerHost: n, DisableKeepAlives: !keepAlive}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	var (
		mu   sync.Mutex
		lats []time.Duration
		errs int
		wg   sync.WaitGroup
	)
	start := time.Now()
	deadline := start.Add(d)
	for range n {
		wg.Go(func() {
			var s workerState
			var mine []time.Duration
			bad := 0
			for time.Now().Before(deadline) {
				t0 := time.Now()
				if err := op(c, base, &s); err != nil {
					bad++
					if bad == 1 {
						fmt.Fprintln(os.Stderr, "error:", err)
					}
					continue
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			lats = append(lats, mine...)
			errs += bad
			mu.Unlock()
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	slices.Sort(lats)
	pct := func(p float64) time.Duration {
		if len(lats) == 0 {
			return 0
		}
		return lats[min(len(lats)-1, int(p*float64(len(lats))))]
	}
	return result{rate: float64(len(lats)) / elapsed.Seconds(), p50: pct(0.50), p99: pct(0.99), errors: errs}
}
