// Command dispatcher measures an Agora envelope answered by a Starlark
// routine through a real `parley serve` over HTTP, against a bare net/http
// JSON echo (in its own process) in the same run, at several concurrencies,
// and prints req/s, p50, p99 and the ratio.
//
// Usage (from the repository root):
//
//	go run ./bench/dispatcher [-parley PATH] [-duration 5s] [-concurrency 16,64] [-rounds 3]
//
// Each round runs the echo and then the routine for -duration; the summary
// gives, per target, the median req/s over the rounds and p50/p99 over every
// request of every round, and the median of the per-round ratios (a busy
// shared machine swings single runs widely; pairs measured back to back
// swing less).
//
// Without -parley it builds ./cmd/parley into a temporary directory. It
// registers the weather PD and an agent through the registry's gRPC API, and
// the weather tool and routine through the dispatcher's; if the registry does
// not implement those calls yet it stops with a clear message.
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
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/parleyhq/parley/bench/internal/cputime"
	"github.com/parleyhq/parley/bench/internal/parleyproc"
	"github.com/parleyhq/parley/bench/internal/weather"
	"github.com/parleyhq/parley/sdk"
)

func main() {
	if err := run(os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench/dispatcher:", err)
		os.Exit(1)
	}
}

// run runs the benchmark, or with -echo the echo server, writing to stdout.
func run(stdout io.Writer) error {
	parley := flag.String("parley", "", "path to a parley binary; built from ./cmd/parley when empty")
	duration := flag.Duration("duration", 5*time.Second, "how long each measurement runs")
	concList := flag.String("concurrency", "16,64", "comma-separated concurrencies")
	rounds := flag.Int("rounds", 3, "echo/routine pairs per concurrency")
	echoOnly := flag.Bool("echo", false, "internal: serve the bare echo on a free loopback port, print it, and run until killed")
	flag.Parse()
	if *echoOnly {
		return serveEcho(stdout)
	}

	tmp, err := os.MkdirTemp("", "bench-dispatcher-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if *parley, err = parleyproc.Binary(*parley, tmp); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	grpcAddr, httpAddr, parleyPid, stop, err := startParley(ctx, *parley, filepath.Join(tmp, "data"))
	if err != nil {
		return err
	}
	defer stop()
	// The setup calls need the operator token, which serve writes on first
	// start (binaries from before authentication write none); envelopes
	// from peers need no credential.
	setupCtx := ctx
	if token, err := os.ReadFile(filepath.Join(tmp, "data", "operator.token")); err == nil {
		setupCtx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+strings.TrimSpace(string(token)))
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("operator token: %w", err)
	}
	if err := setup(setupCtx, grpcAddr); err != nil {
		return err
	}
	agoraURL := "http://" + httpAddr + weather.Path
	body := []byte(weather.Envelope)
	if err := post(http.DefaultClient, agoraURL, body); err != nil {
		return fmt.Errorf("warm-up envelope: %w", err)
	}

	// The echo runs in its own process, like parley serve, so neither shares
	// a Go runtime with the load generator.
	echoAddr, echoPid, stopEcho, err := startEcho(ctx)
	if err != nil {
		return err
	}
	defer stopEcho()
	echoURL := "http://" + echoAddr + "/"

	fmt.Fprintf(stdout, "duration %s per run, %d rounds\n", *duration, *rounds)
	fmt.Fprintf(stdout, "%-8s %-6s %10s %10s %10s\n", "target", "conc", "req/s", "p50", "p99")
	for _, cs := range strings.Split(*concList, ",") {
		c, err := strconv.Atoi(strings.TrimSpace(cs))
		if err != nil || c <= 0 {
			return fmt.Errorf("-concurrency: %q is not a positive number", cs)
		}
		var echoes, routines []result
		var ratios, echoCPU, routineCPU []float64
		for range max(*rounds, 1) {
			e := loadCPU(echoURL, body, c, *duration, echoPid)
			r := loadCPU(agoraURL, body, c, *duration, parleyPid)
			echoes, routines = append(echoes, e), append(routines, r)
			ratios = append(ratios, r.rps/e.rps)
			echoCPU, routineCPU = append(echoCPU, e.cpuPerReq), append(routineCPU, r.cpuPerReq)
			fmt.Fprintf(stdout, "  round: echo %.0f req/s, routine %.0f req/s, ratio %.2f; server CPU per request: echo %.0f µs, routine %.0f µs\n",
				e.rps, r.rps, r.rps/e.rps, e.cpuPerReq, r.cpuPerReq)
		}
		for _, x := range []struct {
			name string
			res  result
		}{{"echo", summarize(echoes)}, {"routine", summarize(routines)}} {
			fmt.Fprintf(stdout, "%-8s %-6d %10.0f %10s %10s  errors=%d\n", x.name, c, x.res.rps, x.res.p50, x.res.p99, x.res.errors)
		}
		fmt.Fprintf(stdout, "ratio routine/echo at %d: median %.2f of %.2f\n", c, median(ratios), ratios)
		// CPU per request swings less than req/s on a shared machine: it
		// does not depend on how much of the CPU the other load leaves.
		fmt.Fprintf(stdout, "server CPU per request at %d: echo %.0f µs, routine %.0f µs (medians); echo/routine %.2f\n",
			c, median(echoCPU), median(routineCPU), median(echoCPU)/median(routineCPU))
	}
	return nil
}

// serveEcho is the -echo mode: the bare net/http JSON echo. It writes its
// address to stdout, where startEcho reads it.
func serveEcho(stdout io.Writer) error {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, lis.Addr().String())
	srv := &http.Server{Handler: http.HandlerFunc(echoHandler), ReadHeaderTimeout: 5 * time.Second}
	return srv.Serve(lis)
}

// startEcho runs this program with -echo and returns the address it prints.
func startEcho(ctx context.Context) (addr string, pid int, stop func(), err error) {
	self, err := os.Executable()
	if err != nil {
		return "", 0, nil, err
	}
	cmd := exec.CommandContext(ctx, self, "-echo")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", 0, nil, err
	}
	if err := cmd.Start(); err != nil {
		return "", 0, nil, err
	}
	stop = func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		stop()
		return "", 0, nil, fmt.Errorf("echo process: %w", err)
	}
	return strings.TrimSpace(line), cmd.Process.Pid, stop, nil
}

func echoHandler(w http.ResponseWriter, r *http.Request) {
	var v map[string]any
	if err := json.NewDecoder(r.Body).Decode(&v); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"status": "success", "body": v["body"]})
}

// startParley runs `parley serve` on free loopback ports and returns the
// addresses it logged.
func startParley(ctx context.Context, bin, data string) (grpcAddr, httpAddr string, pid int, stop func(), err error) {
	p, err := parleyproc.Start(ctx, bin, data, "--log-level", "info")
	if err != nil {
		return "", "", 0, nil, err
	}
	return p.GRPCAddr, p.HTTPAddr, p.PID, p.Stop, nil
}

// setup installs the weather agent on the server at addr.
func setup(ctx context.Context, addr string) error {
	conn, err := grpc.NewClient(addr, append(sdk.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		return err
	}
	defer conn.Close()
	return weather.Setup(ctx, conn)
}

type result struct {
	rps float64
	// cpuPerReq is the CPU the server (its process and its children, the
	// routine workers) used per request, in µs.
	cpuPerReq float64
	p50, p99  time.Duration
	errors    int
	lat       []time.Duration // sorted
}

// summarize gives the median req/s of rs and the percentiles of all their
// requests together.
func summarize(rs []result) result {
	var out result
	var rps []float64
	for _, r := range rs {
		rps = append(rps, r.rps)
		out.lat = append(out.lat, r.lat...)
		out.errors += r.errors
	}
	out.rps = median(rps)
	if len(out.lat) > 0 {
		slices.Sort(out.lat)
		out.p50 = out.lat[len(out.lat)/2].Round(time.Microsecond)
		out.p99 = out.lat[len(out.lat)*99/100].Round(time.Microsecond)
	}
	return out
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// loadCPU is load, with the CPU that the server pid and its children used
// per request.
func loadCPU(url string, body []byte, c int, d time.Duration, pid int) result {
	before := cputime.Tree(pid)
	r := load(url, body, c, d)
	if n := len(r.lat) + r.errors; n > 0 {
		r.cpuPerReq = float64((cputime.Tree(pid) - before).Microseconds()) / float64(n)
	}
	return r
}

// load posts body to url from c workers for d and measures it.
func load(url string, body []byte, c int, d time.Duration) result {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: c, MaxConnsPerHost: c}, Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	var (
		mu   sync.Mutex
		lat  []time.Duration
		errs int
		wg   sync.WaitGroup
	)
	deadline := time.Now().Add(d)
	start := time.Now()
	for range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := make([]time.Duration, 0, 4096)
			bad := 0
			for time.Now().Before(deadline) {
				t0 := time.Now()
				if err := post(client, url, body); err != nil {
					bad++
					continue
				}
				local = append(local, time.Since(t0))
			}
			mu.Lock()
			lat = append(lat, local...)
			errs += bad
			mu.Unlock()
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if len(lat) == 0 {
		return result{errors: errs}
	}
	slices.Sort(lat)
	return result{
		rps:    float64(len(lat)) / elapsed.Seconds(),
		p50:    lat[len(lat)/2].Round(time.Microsecond),
		p99:    lat[len(lat)*99/100].Round(time.Microsecond),
		errors: errs,
		lat:    lat,
	}
}

// post posts body to url and fails unless the answer is 200 with
// "status":"success".
func post(client *http.Client, url string, body []byte) error {
	resp, err := client.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK || !bytes.Contains(out, []byte(`"status":"success"`)) {
		return fmt.Errorf("HTTP %d %s", resp.StatusCode, out)
	}
	return nil
}
