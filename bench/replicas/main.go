// Command replicas benchmarks Parley's main paths on bbolt and on
// PostgreSQL in one run, on the same machine at the same time (issue 15):
//
//   - bbolt: one `parley serve` with its data directory (the reference);
//   - pg×1: one `parley serve --database-url`;
//   - pg×2: two `parley serve --database-url` on the same database, the
//     harness spreading requests round-robin.
//
// Phases: Agora envelopes answered by a routine (POST /agora/acme/weather),
// Agent Protocol task creates (POST /ap/v1/agent/tasks), Agent Protocol
// steps (POST …/steps, run by the default agent's echo routine), durable
// direct messages (SendMessage from sender i to receiver i, acknowledged
// once the receiver's mailbox holds it) and fan-out (SendMessage from
// sender i to the same -fanout receivers). Each phase runs -concurrency
// workers for -duration. A round runs every phase on every configuration,
// each on fresh storage; the table gives the median req/s over -rounds,
// p50 and p99 over every request of every round, and the median of the
// per-round ratios to bbolt and to pg×1.
//
// Usage (from the repository root; needs psql and a PostgreSQL server
// whose user may CREATE DATABASE, such as the one .ci/run starts):
//
//	go run ./bench/replicas -database-url postgres://postgres@127.0.0.1:5432/postgres [-duration 5s] [-concurrency 16] [-rounds 3] [-fanout 100]
//
// Each PostgreSQL configuration gets a fresh database, dropped at the end.
// The server's fsync setting is printed: with fsync off, PostgreSQL's
// commits skip the disk flush that every bbolt commit pays.
//
// -pin runs replica i of every configuration on CPU i modulo the CPU count
// (taskset), PostgreSQL and the load generator staying free: on a machine
// whose cores are all busy, a second replica then brings a core of its own,
// as it would on its own host, instead of sharing the first's.
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/parleyhq/parley/bench/internal/cputime"
	"github.com/parleyhq/parley/bench/internal/parleyproc"
	"github.com/parleyhq/parley/bench/internal/weather"
	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/sdk"
)

func main() {
	if err := run(os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench/replicas:", err)
		os.Exit(1)
	}
}

var (
	databaseURL = flag.String("database-url", os.Getenv("PARLEY_TEST_DATABASE_URL"), "PostgreSQL server (a database is created per configuration)")
	duration    = flag.Duration("duration", 5*time.Second, "how long each phase runs")
	concurrency = flag.Int("concurrency", 16, "workers per phase")
	rounds      = flag.Int("rounds", 3, "rounds; each runs every phase on every configuration")
	fanout      = flag.Int("fanout", 100, "recipients of each fan-out message")
	only        = flag.String("only", "", "run only the phases whose name contains this (the table then lacks the others)")
	parleyBin   = flag.String("parley", "", "parley binary (built from ./cmd/parley when empty)")
	pin         = flag.Bool("pin", false, "run replica i on CPU i modulo the CPU count (taskset); PostgreSQL and the load run anywhere")
)

// result is one phase of one configuration in one round.
type result struct {
	errors  int64
	elapsed time.Duration
	lat     []time.Duration // of every call that succeeded
	// cpuParley and cpuPG are the CPU time the parley processes (with their
	// routine workers) and the PostgreSQL server used during the phase.
	cpuParley, cpuPG time.Duration
}

// cpuPerCall is the CPU per call of the parley processes and of
// PostgreSQL, in ms.
func (r result) cpuPerCall() (parley, pg float64) {
	n := float64(int64(len(r.lat)) + r.errors)
	return ms(r.cpuParley) / n, ms(r.cpuPG) / n
}

func (r result) rate() float64 { return float64(len(r.lat)) / r.elapsed.Seconds() }

func run(stdout io.Writer) error {
	flag.Parse()
	if *databaseURL == "" {
		return errors.New("-database-url (or PARLEY_TEST_DATABASE_URL) is required")
	}
	work, err := os.MkdirTemp("", "bench-replicas")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	bin, err := parleyproc.Binary(*parleyBin, work)
	if err != nil {
		return err
	}
	bins := []string{bin, bin} // replica i runs bins[i]
	if *pin {
		for i := range bins {
			if bins[i], err = pinned(work, bin, i%runtime.NumCPU()); err != nil {
				return err
			}
		}
	}
	var fsync string
	if out, err := exec.Command("psql", *databaseURL, "-qAtc", "SHOW fsync").Output(); err == nil {
		fsync = strings.TrimSpace(string(out))
	}
	// The server's CPU is read from /proc when it runs on this machine: the
	// parent of its checkpointer is the postmaster.
	if out, err := exec.Command("psql", *databaseURL, "-qAtc", "SELECT pid FROM pg_stat_activity WHERE backend_type = 'checkpointer'").Output(); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(out))); err == nil && cputime.Parent(pid) > 1 {
			postmaster = cputime.Parent(pid)
		}
	}
	phases := []string{"envelope", "AP task create", "AP step", "direct message", fmt.Sprintf("fan-out to %d", *fanout)}
	phases = slices.DeleteFunc(phases, func(ph string) bool { return !strings.Contains(ph, *only) })
	// results[config][phase] has one result a round.
	results := map[string]map[string][]result{}
	for r := range *rounds {
		for _, c := range configs {
			rs, err := round(bins, filepath.Join(work, fmt.Sprintf("%d-%s", r, c.name)), c, phases)
			if err != nil {
				return fmt.Errorf("round %d, %s: %w", r+1, c.name, err)
			}
			if results[c.name] == nil {
				results[c.name] = map[string][]result{}
			}
			for ph, res := range rs {
				results[c.name][ph] = append(results[c.name][ph], res)
			}
		}
	}
	pinning := ""
	if *pin {
		pinning = fmt.Sprintf(", replica i pinned to CPU i mod %d", runtime.NumCPU())
	}
	fmt.Fprintf(stdout, "concurrency %d, %s per phase, %d rounds, PostgreSQL fsync=%s%s\n\n", *concurrency, *duration, *rounds, fsync, pinning)
	fmt.Fprintln(stdout, "| phase | bbolt req/s (p50 / p99) | pg×1 req/s (p50 / p99) | pg×2 req/s (p50 / p99) | pg×1 / bbolt | pg×2 / bbolt | pg×2 / pg×1 |")
	fmt.Fprintln(stdout, "|---|---|---|---|---|---|---|")
	for _, ph := range phases {
		b, p1, p2 := results["bbolt"][ph], results["pg×1"][ph], results["pg×2"][ph]
		fmt.Fprintf(stdout, "| %s | %s | %s | %s | %.2f× | %.2f× | %.2f× |\n", ph, cell(b), cell(p1), cell(p2),
			ratio(p1, b), ratio(p2, b), ratio(p2, p1))
	}
	fmt.Fprintln(stdout, "\nCPU per call, ms (median over rounds): parley processes + PostgreSQL server")
	fmt.Fprintln(stdout, "\n| phase | bbolt | pg×1 | pg×2 |")
	fmt.Fprintln(stdout, "|---|---|---|---|")
	for _, ph := range phases {
		fmt.Fprintf(stdout, "| %s | %s | %s | %s |\n", ph, cpuCell(results["bbolt"][ph], false), cpuCell(results["pg×1"][ph], true), cpuCell(results["pg×2"][ph], true))
	}
	return nil
}

// postmaster is the PostgreSQL server's process id when it runs on this
// machine, else 0.
var postmaster int

// cpuCell gives the median CPU per call of rs: parley's, plus PostgreSQL's
// when pg.
func cpuCell(rs []result, pg bool) string {
	var ps, gs []float64
	for _, r := range rs {
		p, g := r.cpuPerCall()
		ps, gs = append(ps, p), append(gs, g)
	}
	if !pg {
		return fmt.Sprintf("%.2f", median(ps))
	}
	if postmaster == 0 {
		return fmt.Sprintf("%.2f + n/a", median(ps))
	}
	return fmt.Sprintf("%.2f + %.2f", median(ps), median(gs))
}

// configs are the set-ups compared; bbolt is the reference.
var configs = []config{{"bbolt", 1, false}, {"pg×1", 1, true}, {"pg×2", 2, true}}

type config struct {
	name     string
	replicas int
	pg       bool
}

// pinned writes a script under work that runs bin on CPU cpu and returns
// its path. The script and taskset exec, so the process id stays the
// server's (its CPU is read by process id).
func pinned(work, bin string, cpu int) (string, error) {
	path := filepath.Join(work, fmt.Sprintf("parley-cpu%d", cpu))
	script := fmt.Sprintf("#!/bin/sh\nexec taskset -c %d '%s' \"$@\"\n", cpu, strings.ReplaceAll(bin, "'", `'\''`))
	if err := os.WriteFile(path, []byte(script), 0o700); err != nil { //nolint:gosec // an executable script, the harness's own
		return "", err
	}
	return path, nil
}

// round starts c on fresh storage under work, replica i running bins[i],
// runs every phase and stops it.
func round(bins []string, work string, c config, phases []string) (map[string]result, error) {
	ctx := context.Background()
	var flags []string
	if c.pg {
		db, drop, err := createDatabase(*databaseURL)
		if err != nil {
			return nil, err
		}
		defer drop()
		flags = append(flags, "--database-url", db)
	}
	var procs []*proc
	defer func() {
		for _, p := range procs {
			p.stop()
		}
	}()
	// The first replica writes the operator token; the others read it, so
	// that one token works on every replica.
	token := filepath.Join(work, "0", "operator.token")
	for i := range c.replicas {
		extra := flags
		if i > 0 {
			extra = append(slices.Clone(flags), "--operator-token-file", token)
		}
		p, err := start(ctx, bins[i], filepath.Join(work, strconv.Itoa(i)), token, extra)
		if err != nil {
			return nil, err
		}
		procs = append(procs, p)
	}
	if err := setup(ctx, procs[0], *concurrency, *fanout); err != nil {
		return nil, err
	}
	out := map[string]result{}
	for _, ph := range phases {
		r, err := phase(ctx, ph, procs, *concurrency, *duration)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", ph, err)
		}
		out[ph] = r
	}
	return out, nil
}

// ratio is the median over rounds of a's rate over b's.
func ratio(a, b []result) float64 {
	var rs []float64
	for i := range min(len(a), len(b)) {
		rs = append(rs, a[i].rate()/b[i].rate())
	}
	return median(rs)
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	xs = slices.Clone(xs)
	slices.Sort(xs)
	if n := len(xs); n%2 == 0 {
		return (xs[n/2-1] + xs[n/2]) / 2
	}
	return xs[len(xs)/2]
}

// cell gives the median req/s of rs, p50 and p99 over all their calls,
// and their errors.
func cell(rs []result) string {
	var rates []float64
	var lat []time.Duration
	var errs int64
	for _, r := range rs {
		rates = append(rates, r.rate())
		lat = append(lat, r.lat...)
		errs += r.errors
	}
	if len(lat) == 0 {
		return "none"
	}
	slices.Sort(lat)
	s := fmt.Sprintf("%.0f (%.1f / %.1f ms)", median(rates), ms(lat[len(lat)/2]), ms(lat[len(lat)*99/100]))
	if errs > 0 {
		s += fmt.Sprintf(", %d errors", errs)
	}
	return s
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// createDatabase creates a fresh database on the server at base with psql
// and returns its URL and a function that drops it.
func createDatabase(base string) (string, func(), error) {
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "bench_" + hex.EncodeToString(b[:])
	if out, err := exec.Command("psql", base, "-qc", "CREATE DATABASE "+name).CombinedOutput(); err != nil {
		return "", nil, fmt.Errorf("psql: CREATE DATABASE: %w\n%s", err, out)
	}
	u, err := url.Parse(base)
	if err != nil {
		return "", nil, err
	}
	u.Path = "/" + name
	return u.String(), func() { _ = exec.Command("psql", base, "-qc", "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)").Run() }, nil
}

// proc is one `parley serve`.
type proc struct {
	*parleyproc.Proc
	token string
	conn  *grpc.ClientConn
}

func start(ctx context.Context, bin, data, tokenFile string, flags []string) (*proc, error) {
	pp, err := parleyproc.Start(ctx, bin, data, flags...)
	if err != nil {
		return nil, err
	}
	p := &proc{Proc: pp}
	if p.token, err = parleyproc.ReadToken(tokenFile); err != nil {
		p.stop()
		return nil, err
	}
	if p.conn, err = grpc.NewClient(p.GRPCAddr, append(sdk.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...); err != nil {
		p.stop()
		return nil, err
	}
	return p, nil
}

func (p *proc) stop() {
	if p.conn != nil {
		p.conn.Close()
	}
	p.Stop()
}

func (p *proc) ctx(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+p.token)
}

// setup installs the weather agent, and creates n sender and n receiver
// agents and fanout fan-out receivers in client bench's group.
func setup(ctx context.Context, p *proc, n, fanout int) error {
	ctx = p.ctx(ctx)
	if err := weather.Setup(ctx, p.conn); err != nil {
		return err
	}
	reg := registryv1.NewRegistryServiceClient(p.conn)
	if _, err := reg.CreateClient(ctx, &registryv1.CreateClientRequest{ClientId: "bench"}); err != nil {
		return fmt.Errorf("create client: %w", err)
	}
	var ids []string
	for i := range n {
		ids = append(ids, fmt.Sprintf("s%d", i), fmt.Sprintf("r%d", i))
	}
	for i := range fanout {
		ids = append(ids, fmt.Sprintf("f%d", i))
	}
	for _, id := range ids {
		if _, err := reg.CreateAgent(ctx, &registryv1.CreateAgentRequest{Parent: "clients/bench", AgentId: id, Agent: &registryv1.Agent{DisplayName: id}}); err != nil {
			return fmt.Errorf("create agent %s: %w", id, err)
		}
		if _, err := reg.JoinClientGroup(ctx, &registryv1.JoinClientGroupRequest{Name: "clients/bench/agents/" + id}); err != nil {
			return fmt.Errorf("join client group %s: %w", id, err)
		}
	}
	return nil
}

var client = &http.Client{Timeout: 30 * time.Second}

// post sends body to p's HTTP port and decodes a 200 answer into out.
func post(p *proc, path, body string, out any) error {
	req, err := http.NewRequest(http.MethodPost, "http://"+p.HTTPAddr+path, strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+p.token)
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %d %s", path, resp.StatusCode, bytes.TrimSpace(raw))
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(raw, out)
}

// phase runs n workers for d; worker i's k-th call goes to replica
// (i+k) mod len(procs), so every worker spreads its calls evenly.
func phase(ctx context.Context, name string, procs []*proc, n int, d time.Duration) (result, error) {
	var call func(p *proc, worker, k int) error
	send := func(p *proc, w, k int, to []string) error {
		_, err := dispatcherv1.NewDispatcherServiceClient(p.conn).SendMessage(p.ctx(ctx), &dispatcherv1.SendMessageRequest{
			Sender: fmt.Sprintf("clients/bench/agents/s%d", w),
			To:     &dispatcherv1.DistributionList{Direct: to},
			// The body names its worker and sequence: ids stay distinct.
			MessageType: "new_message", BodyJson: fmt.Sprintf(`{"w":%d,"k":%d}`, w, k),
		})
		return err
	}
	switch {
	case name == "envelope":
		call = func(p *proc, _, _ int) error { return post(p, weather.Path, weather.Envelope, nil) }
	case name == "AP task create":
		call = func(p *proc, _, _ int) error { return post(p, "/ap/v1/agent/tasks", `{"input":"bench"}`, nil) }
	case name == "AP step":
		tasks := make([]string, n)
		for i := range tasks {
			var t struct {
				TaskID string `json:"task_id"`
			}
			if err := post(procs[0], "/ap/v1/agent/tasks", `{"input":"steps"}`, &t); err != nil {
				return result{}, err
			}
			tasks[i] = t.TaskID
		}
		call = func(p *proc, w, _ int) error {
			return post(p, "/ap/v1/agent/tasks/"+tasks[w]+"/steps", `{"input":"step"}`, nil)
		}
	case name == "direct message":
		call = func(p *proc, w, k int) error {
			return send(p, w, k, []string{fmt.Sprintf("clients/bench/agents/r%d", w)})
		}
	case strings.HasPrefix(name, "fan-out"):
		var to []string
		for i := range *fanout {
			to = append(to, fmt.Sprintf("clients/bench/agents/f%d", i))
		}
		call = func(p *proc, w, k int) error { return send(p, w, k, to) }
	default:
		return result{}, fmt.Errorf("unknown phase %q", name)
	}
	parleyCPU := func() time.Duration {
		var t time.Duration
		for _, p := range procs {
			t += cputime.Tree(p.PID)
		}
		return t
	}
	pgCPU := func() time.Duration {
		if postmaster == 0 {
			return 0
		}
		return cputime.Tree(postmaster)
	}
	cpu0, pg0 := parleyCPU(), pgCPU()
	var (
		mu     sync.Mutex
		lat    []time.Duration
		errs   atomic.Int64
		first  atomic.Value
		wg     sync.WaitGroup
		start  = time.Now()
		finish = start.Add(d)
	)
	for w := range n {
		wg.Go(func() {
			var mine []time.Duration
			for k := 0; time.Now().Before(finish); k++ {
				t0 := time.Now()
				if err := call(procs[(w+k)%len(procs)], w, k); err != nil {
					errs.Add(1)
					first.CompareAndSwap(nil, err.Error())
					continue
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	r := result{errors: errs.Load(), elapsed: time.Since(start), lat: lat, cpuParley: parleyCPU() - cpu0, cpuPG: pgCPU() - pg0}
	if len(lat) == 0 {
		return r, fmt.Errorf("no call succeeded: %v", first.Load())
	}
	if e := first.Load(); e != nil {
		fmt.Fprintf(os.Stderr, "bench/replicas: %s: %d errors, first: %v\n", name, r.errors, e)
	}
	return r, nil
}
