// Command network measures durable direct messages between network agents
// through a real `parley serve`, against NATS JetStream embedded in this
// process, in the same run, at several sender counts, and prints msg/s, the
// send-to-receipt p50 and p99, and the ratio. It also measures the memory
// of idle connected receive streams (-idle).
//
// Usage (from the repository root):
//
//	go run ./bench/network [-parley PATH] [-duration 5s] [-senders 1,16,64] [-idle 2000]
//	go run ./bench/network -senders "" -idle 2000   # only the idle streams
//
// Parley: senders s0…sN-1 and receivers r0…rN-1 of client bench, in its
// client group; sender i sends new messages (SendMessage, one at a time,
// each acknowledged only once r_i's mailbox holds it durably) to r_i, which
// receives them with sdk.NetworkAgent (ReceiveMessages, acknowledged per
// batch). JetStream: one stream on file storage with sync_interval always
// (every acknowledged message fsynced, as Parley's are), publisher i
// publishing synchronously (waiting for the PubAck) to bench.i, and an
// explicit-ack durable push consumer per subject. Latency is from the send
// call to the receiver's handler, both in this process.
//
// At one sender the run also measures, on the same disk, what one writer
// that waits for durability can reach at all: a loop of bare bbolt commits
// (one put each, through platform/boltdb as the stores commit; a commit is
// two ordered fdatasyncs) and a loop of appends each followed by one fsync
// (a one-sync log's floor). Their ratios to
// JetStream bound what any store built on bbolt's commit can show here.
//
// -idle N creates N fresh agents, lets parley serve settle, then opens a
// receive stream for each on one gRPC connection and reports parley
// serve's growth per stream: resident memory (/proc/PID/status VmRSS), Go
// heap and stacks in use and goroutines (/metrics). Then the same for N
// more agents with server-sent-events streams (GET …/messages:stream, one
// HTTP/1.1 connection each, as a browser or curl opens them). The agents
// are created before the first reading, so they do not count.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/parleyhq/parley/bench/internal/cputime"
	"github.com/parleyhq/parley/bench/internal/parleyproc"
	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/sdk"
)

func main() {
	if err := run(os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench/network:", err)
		os.Exit(1)
	}
}

type result struct {
	msgs     int
	elapsed  time.Duration
	p50, p99 time.Duration
	errors   int64
	firstErr error // the first send that failed, if any
}

func (r result) rate() float64 { return float64(r.msgs) / r.elapsed.Seconds() }

func run(stdout io.Writer) error {
	parley := flag.String("parley", "", "path to a parley binary; built from ./cmd/parley when empty")
	duration := flag.Duration("duration", 5*time.Second, "how long each measurement sends")
	sendersList := flag.String("senders", "1,16,64", "comma-separated sender counts; empty for none (only -idle)")
	idle := flag.Int("idle", 0, "also open this many idle receive streams and report memory per stream")
	flag.Parse()

	tmp, err := os.MkdirTemp("", "bench-network-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if *parley, err = parleyproc.Binary(*parley, tmp); err != nil {
		return err
	}
	var counts []int
	for _, s := range strings.Split(*sendersList, ",") {
		if *sendersList == "" {
			break // -senders "": only the idle streams (-idle)
		}
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 {
			return fmt.Errorf("-senders: %q is not a positive number", s)
		}
		counts = append(counts, n)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p, err := startParley(ctx, *parley, filepath.Join(tmp, "data"))
	if err != nil {
		return err
	}
	defer p.stop()
	js, stopNATS, err := startJetStream(filepath.Join(tmp, "nats"))
	if err != nil {
		return err
	}
	defer stopNATS()

	maxN := 1
	if len(counts) > 0 {
		maxN = slices.Max(counts)
	}
	if err := p.setup(ctx, maxN); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "duration %s per run\n", *duration)
	fmt.Fprintf(stdout, "%-10s %-8s %10s %10s %10s\n", "target", "senders", "msg/s", "p50", "p99")
	for _, n := range counts {
		fmt.Fprintf(os.Stderr, "jetstream, %d senders\n", n)
		jsCPU := cputime.Self()
		jr, err := loadJetStream(js, n, *duration)
		if err != nil {
			return err
		}
		jsCPU = cputime.Self() - jsCPU
		fmt.Fprintf(os.Stderr, "parley, %d senders\n", n)
		before, err := p.metrics(ctx, commitsMetric)
		if err != nil {
			return err
		}
		pagesBefore, pagesErr := p.metrics(ctx, pagesMetric) // absent from older builds
		syncsBefore, syncsErr := p.metrics(ctx, syncsMetric) // so is this
		serverCPU, harnessCPU := cputime.Tree(p.proc.PID), cputime.Self()
		pr, err := p.load(ctx, n, *duration)
		if err != nil {
			return err
		}
		serverCPU, harnessCPU = cputime.Tree(p.proc.PID)-serverCPU, cputime.Self()-harnessCPU
		after, err := p.metrics(ctx, commitsMetric)
		if err != nil {
			return err
		}
		pagesAfter, _ := p.metrics(ctx, pagesMetric)
		syncsAfter, _ := p.metrics(ctx, syncsMetric)
		for _, x := range []struct {
			name string
			r    result
		}{{"jetstream", jr}, {"parley", pr}} {
			fmt.Fprintf(stdout, "%-10s %-8d %10.0f %10s %10s  errors=%d\n", x.name, n, x.r.rate(), x.r.p50.Round(time.Microsecond), x.r.p99.Round(time.Microsecond), x.r.errors)
			if x.r.firstErr != nil {
				fmt.Fprintf(stdout, "  first error: %v\n", x.r.firstErr)
			}
		}
		fmt.Fprintf(stdout, "ratio parley/jetstream at %d senders: %.2f\n", n, pr.rate()/jr.rate())
		if n == 1 {
			c, err := measureCeiling(filepath.Join(tmp, "ceiling"), *duration)
			if err != nil {
				return err
			}
			fmt.Fprintf(stdout, "one-writer ceilings on this disk: bare bbolt commits %.0f/s (%.2f of jetstream), bare append+fsync %.0f/s (%.2f of jetstream); parley/bare-bbolt %.2f\n",
				c.boltCommits, c.boltCommits/jr.rate(), c.appendSyncs, c.appendSyncs/jr.rate(), pr.rate()/c.boltCommits)
		}
		if pr.msgs > 0 && jr.msgs > 0 {
			// CPU is steadier than throughput on a shared machine: it
			// shows what a change saves even when the rate is noise.
			perMsg := func(d time.Duration, msgs int) time.Duration {
				return (d / time.Duration(msgs)).Round(time.Microsecond)
			}
			fmt.Fprintf(stdout, "CPU per message at %d senders: parley serve %s, harness (SDK agents) %s; jetstream (server and clients, in the harness) %s\n",
				n, perMsg(serverCPU, pr.msgs), perMsg(harnessCPU, pr.msgs), perMsg(jsCPU, jr.msgs))
		}
		if pr.msgs > 0 {
			per := (after[0] - before[0]) / float64(pr.msgs)
			syncs, how := 2*per, ", 2 per commit assumed: this build has no "+syncsMetric
			if syncsErr == nil && syncsAfter != nil {
				syncs, how = (syncsAfter[0]-syncsBefore[0])/float64(pr.msgs), ""
			}
			fmt.Fprintf(stdout, "parley dispatcher.db commits per message received at %d senders: %.2f (fdatasyncs: %.2f%s)\n", n, per, syncs, how)
			if pagesErr == nil && pagesAfter != nil {
				fmt.Fprintf(stdout, "parley dispatcher.db pages written per message at %d senders: %.1f\n", n, (pagesAfter[0]-pagesBefore[0])/float64(pr.msgs))
			}
		}
	}
	if *idle > 0 {
		for _, m := range []struct {
			name string
			open func(context.Context, int) (func() error, func(), error)
		}{{"gRPC receive", p.idleStreams}, {"SSE", p.idleSSE}} {
			g, err := p.perStream(ctx, *idle, m.open)
			if err != nil {
				return fmt.Errorf("idle %s streams: %w", m.name, err)
			}
			fmt.Fprintf(stdout, "idle %s streams: %d, parley serve growth per stream: RSS %.1f KB, Go heap+stacks in use %.1f KB (heap %.1f, stacks %.1f), goroutines %.2f\n",
				m.name, *idle, g.rss/1024, (g.heap+g.stacks)/1024, g.heap/1024, g.stacks/1024, g.goroutines)
		}
	}
	return nil
}

// latencies collects send-to-receipt times.
type latencies struct {
	mu sync.Mutex
	ds []time.Duration
}

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	l.ds = append(l.ds, d)
	l.mu.Unlock()
}

func (l *latencies) summary(elapsed time.Duration, errs int64) result {
	l.mu.Lock()
	defer l.mu.Unlock()
	slices.Sort(l.ds)
	r := result{msgs: len(l.ds), elapsed: elapsed, errors: errs}
	if len(l.ds) > 0 {
		r.p50 = l.ds[len(l.ds)/2]
		r.p99 = l.ds[len(l.ds)*99/100]
	}
	return r
}

// payload carries its send time. Split in seconds and nanoseconds: a
// 19-digit Unix-nanosecond number can pass the dispatcher's card-number
// check, which refuses the message.
type payload struct {
	Sec  int64 `json:"sec"`
	Nsec int64 `json:"nsec"`
}

func newPayload() []byte {
	now := time.Now()
	b, _ := json.Marshal(payload{Sec: now.Unix(), Nsec: int64(now.Nanosecond())})
	return b
}

// since is the time since the payload was made; ok is false when it is
// not a payload.
func since(body []byte) (time.Duration, bool) {
	var p payload
	if json.Unmarshal(body, &p) != nil || p.Sec == 0 {
		return 0, false
	}
	return time.Since(time.Unix(p.Sec, p.Nsec)), true
}

// ---- JetStream ----

func startJetStream(dir string) (nats.JetStreamContext, func(), error) {
	ns, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir,
		// Every acknowledged message fsynced, like Parley's mailboxes;
		// JetStream's default syncs every 2 minutes.
		SyncAlways: true, NoLog: true, NoSigs: true,
	})
	if err != nil {
		return nil, nil, err
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		return nil, nil, errors.New("nats server not ready")
	}
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		ns.Shutdown()
		return nil, nil, err
	}
	js, err := nc.JetStream()
	if err != nil {
		return nil, nil, err
	}
	if _, err := js.AddStream(&nats.StreamConfig{Name: "BENCH", Subjects: []string{"bench.>"}, Storage: nats.FileStorage}); err != nil {
		return nil, nil, err
	}
	return js, func() { nc.Close(); ns.Shutdown(); ns.WaitForShutdown() }, nil
}

var jsRun atomic.Int64

func loadJetStream(js nats.JetStreamContext, n int, d time.Duration) (result, error) {
	round := jsRun.Add(1)
	var lat latencies
	var subs []*nats.Subscription
	for i := range n {
		subj := fmt.Sprintf("bench.%d.%d", round, i)
		sub, err := js.Subscribe(subj, func(m *nats.Msg) {
			if d, ok := since(m.Data); ok {
				lat.add(d)
			}
			_ = m.Ack()
		}, nats.Durable(fmt.Sprintf("r%d_%d", round, i)), nats.ManualAck(), nats.DeliverNew())
		if err != nil {
			return result{}, err
		}
		subs = append(subs, sub)
	}
	defer func() {
		for _, s := range subs {
			_ = s.Unsubscribe()
		}
	}()
	var errs atomic.Int64
	elapsed := drive(n, d, func(i int) {
		if _, err := js.Publish(fmt.Sprintf("bench.%d.%d", round, i), newPayload()); err != nil {
			errs.Add(1)
		}
	})
	settle(func() int { lat.mu.Lock(); defer lat.mu.Unlock(); return len(lat.ds) })
	return lat.summary(elapsed, errs.Load()), nil
}

// drive runs send(i) in a loop on n goroutines for d and returns the time
// taken until every in-flight send returned.
func drive(n int, d time.Duration, send func(i int)) time.Duration {
	start := time.Now()
	deadline := start.Add(d)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				send(i)
			}
		})
	}
	wg.Wait()
	return time.Since(start)
}

// settle waits until count stops growing for 500 ms: the receivers have
// what was sent.
func settle(count func() int) {
	last, stable := -1, time.Now()
	for time.Since(stable) < 500*time.Millisecond {
		if c := count(); c != last {
			last, stable = c, time.Now()
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ---- Parley ----

type parleyProc struct {
	proc     *parleyproc.Proc
	grpcAddr string
	httpAddr string
	token    string
	conn     *grpc.ClientConn
	stop     func()
}

func startParley(ctx context.Context, bin, data string) (*parleyProc, error) {
	// -idle opens an HTTP connection per SSE stream: lift the cap of 400
	// connections per listener.
	proc, err := parleyproc.Start(ctx, bin, data, "--max-connections", "8000")
	if err != nil {
		return nil, err
	}
	p := &parleyProc{proc: proc, grpcAddr: proc.GRPCAddr, httpAddr: proc.HTTPAddr}
	p.stop = func() {
		if p.conn != nil {
			p.conn.Close()
		}
		proc.Stop()
	}
	if p.token, err = parleyproc.ReadToken(filepath.Join(data, "operator.token")); err != nil {
		p.stop()
		return nil, err
	}
	// The SDK agents' and senders' connection, as the SDK recommends.
	p.conn, err = grpc.NewClient(p.grpcAddr, append(sdk.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		p.stop()
		return nil, err
	}
	return p, nil
}

func (p *parleyProc) ctx(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+p.token)
}

func agent(kind string, i int) string { return fmt.Sprintf("clients/bench/agents/%s%d", kind, i) }

// setup creates n sender and n receiver agents in client bench's group.
func (p *parleyProc) setup(ctx context.Context, n int) error {
	reg := registryv1.NewRegistryServiceClient(p.conn)
	ctx = p.ctx(ctx)
	if _, err := reg.CreateClient(ctx, &registryv1.CreateClientRequest{ClientId: "bench"}); err != nil {
		return fmt.Errorf("create client: %w", err)
	}
	for i := range n {
		for _, kind := range []string{"s", "r"} {
			if err := p.createAgent(ctx, reg, fmt.Sprintf("%s%d", kind, i)); err != nil {
				return err
			}
		}
	}
	return nil
}

func (p *parleyProc) createAgent(ctx context.Context, reg registryv1.RegistryServiceClient, id string) error {
	if _, err := reg.CreateAgent(ctx, &registryv1.CreateAgentRequest{Parent: "clients/bench", AgentId: id, Agent: &registryv1.Agent{DisplayName: id}}); err != nil {
		return fmt.Errorf("create agent %s: %w", id, err)
	}
	if _, err := reg.JoinClientGroup(ctx, &registryv1.JoinClientGroupRequest{Name: "clients/bench/agents/" + id}); err != nil {
		return fmt.Errorf("join client group %s: %w", id, err)
	}
	return nil
}

var parleyRun atomic.Int64

func (p *parleyProc) load(ctx context.Context, n int, d time.Duration) (result, error) {
	parleyRun.Add(1)
	var lat latencies
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	ready := make(chan struct{}, n)
	for i := range n {
		a, err := sdk.NewNetworkAgent(p.conn, agent("r", i), sdk.NetworkOptions{Key: p.token, ClearBacklog: true})
		if err != nil {
			return result{}, err
		}
		once := sync.Once{}
		err = a.Handle(sdk.RouteKey{Type: "new_message", Category: sdk.CategoryMessage, RecipientType: "recipient"}, "bench", func(_ context.Context, m sdk.Message) (any, error) {
			if d, ok := since(m.Body); ok {
				lat.add(d)
			}
			return nil, nil
		})
		if err != nil {
			return result{}, err
		}
		// A warm-up message marks the stream connected.
		if err := a.Handle(sdk.RouteKey{Type: "warmup", Category: sdk.CategoryMessage, RecipientType: "recipient"}, "warmup", func(context.Context, sdk.Message) (any, error) {
			once.Do(func() { ready <- struct{}{} })
			return nil, nil
		}); err != nil {
			return result{}, err
		}
		wg.Go(func() { _ = a.Run(rctx) })
	}
	disp := dispatcherv1.NewDispatcherServiceClient(p.conn)
	send := func(i int, typ string, body string) error {
		_, err := disp.SendMessage(p.ctx(ctx), &dispatcherv1.SendMessageRequest{
			Sender: agent("s", i), To: &dispatcherv1.DistributionList{Direct: []string{agent("r", i)}}, MessageType: typ, BodyJson: body,
		})
		return err
	}
	for i := range n {
		// Until the receiver's stream has cleared its backlog and runs,
		// a warm-up may be cleared: send until one arrives.
		for {
			if err := send(i, "warmup", "{}"); err != nil {
				return result{}, fmt.Errorf("warm-up send: %w", err)
			}
			select {
			case <-ready:
			case <-time.After(200 * time.Millisecond):
				continue
			}
			break
		}
	}
	var (
		errs     atomic.Int64
		firstErr atomic.Pointer[error]
	)
	elapsed := drive(n, d, func(i int) {
		if err := send(i, "new_message", string(newPayload())); err != nil {
			errs.Add(1)
			firstErr.CompareAndSwap(nil, &err)
		}
	})
	settle(func() int { lat.mu.Lock(); defer lat.mu.Unlock(); return len(lat.ds) })
	r := lat.summary(elapsed, errs.Load())
	if e := firstErr.Load(); e != nil {
		r.firstErr = *e
	}
	return r, nil
}

// commitsMetric counts parley serve's commits to dispatcher.db: two
// fdatasyncs each, or one of its journal's with --dispatcher-journal (the
// default since the journal came).
const commitsMetric = "parley_dispatcher_bbolt_commits_total"

// syncsMetric counts the fdatasyncs of dispatcher.db and its journal,
// checkpoints' included.
const syncsMetric = "parley_dispatcher_bbolt_fdatasyncs_total"

// pagesMetric counts the pages those commits wrote (4 KiB each, the meta
// page included).
const pagesMetric = "parley_dispatcher_bbolt_pages_written_total"

// growth is parley serve's growth per stream: bytes of its resident set
// (/proc/PID/status VmRSS), of its Go heap and stacks in use, and
// goroutines (/metrics).
type growth struct{ rss, heap, stacks, goroutines float64 }

// perStream opens n idle streams with open (which first creates the
// agents they belong to) and returns parley serve's growth per stream.
// The agents are created before the first reading, so that they do not
// count.
// The streams close when it returns.
func (p *parleyProc) perStream(ctx context.Context, n int, open func(context.Context, int) (func() error, func(), error)) (growth, error) {
	connect, closeAll, err := open(ctx, n)
	if err != nil {
		return growth{}, err
	}
	defer closeAll()
	time.Sleep(2 * time.Second) // let the server settle before reading
	before, err := p.memory(ctx)
	if err != nil {
		return growth{}, err
	}
	if err := connect(); err != nil {
		return growth{}, err
	}
	time.Sleep(2 * time.Second)
	after, err := p.memory(ctx)
	if err != nil {
		return growth{}, err
	}
	per := func(a, b float64) float64 { return (a - b) / float64(n) }
	return growth{per(after.rss, before.rss), per(after.heap, before.heap), per(after.stacks, before.stacks), per(after.goroutines, before.goroutines)}, nil
}

// memory reads parley serve's resident set, and its Go heap and stacks in
// use and goroutines from /metrics.
func (p *parleyProc) memory(ctx context.Context) (growth, error) {
	r, err := rss(p.proc.PID)
	if err != nil {
		return growth{}, err
	}
	m, err := p.metrics(ctx, "go_memstats_heap_inuse_bytes", "go_memstats_stack_inuse_bytes", "go_goroutines")
	if err != nil {
		return growth{}, err
	}
	return growth{rss: float64(r), heap: m[0], stacks: m[1], goroutines: m[2]}, nil
}

// metrics reads samples without labels from parley serve's /metrics, in
// the order of names; each must be there.
func (p *parleyProc) metrics(ctx context.Context, names ...string) ([]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.httpAddr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+p.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := make([]float64, len(names))
	found := make([]bool, len(names))
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		for i, name := range names {
			if text, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
				f, err := strconv.ParseFloat(text, 64)
				if err != nil {
					return nil, err
				}
				out[i], found[i] = f, true
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	for i, ok := range found {
		if !ok {
			return nil, fmt.Errorf("/metrics (status %d) lacks %s", resp.StatusCode, names[i])
		}
	}
	return out, nil
}

// createAgents creates agents kind0…kind(n-1) in client bench's group.
func (p *parleyProc) createAgents(ctx context.Context, kind string, n int) error {
	reg := registryv1.NewRegistryServiceClient(p.conn)
	for i := range n {
		if err := p.createAgent(p.ctx(ctx), reg, fmt.Sprintf("%s%d", kind, i)); err != nil {
			return err
		}
	}
	return nil
}

// idleStreams creates n fresh agents, and returns connect, which opens
// a receive stream for each on one gRPC connection, each connected (its
// first, empty batch received), and closeAll.
func (p *parleyProc) idleStreams(ctx context.Context, n int) (connect func() error, closeAll func(), err error) {
	if err := p.createAgents(ctx, "idle", n); err != nil {
		return nil, nil, err
	}
	disp := dispatcherv1.NewDispatcherServiceClient(p.conn)
	sctx, cancel := context.WithCancel(p.ctx(ctx))
	connect = func() error {
		for i := range n {
			st, err := disp.ReceiveMessages(sctx, &dispatcherv1.ReceiveMessagesRequest{Agent: agent("idle", i)})
			if err != nil {
				return err
			}
			if _, err := st.Recv(); err != nil { // the first, empty batch: connected
				return err
			}
		}
		return nil
	}
	return connect, cancel, nil
}

// idleSSE creates n fresh agents, and returns connect, which opens a
// server-sent-events stream for each, one HTTP connection each (as
// browsers and curl open them), each connected (its ": connected"
// comment read), and closeAll.
func (p *parleyProc) idleSSE(ctx context.Context, n int) (connect func() error, closeAll func(), err error) {
	if err := p.createAgents(ctx, "sse", n); err != nil {
		return nil, nil, err
	}
	sctx, cancel := context.WithCancel(ctx)
	var bodies []io.Closer
	closeAll = func() {
		cancel()
		for _, b := range bodies {
			b.Close()
		}
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: -1}}
	connect = func() error {
		for i := range n {
			req, err := http.NewRequestWithContext(sctx, http.MethodGet, fmt.Sprintf("http://%s/v1/clients/bench/agents/sse%d/messages:stream", p.httpAddr, i), nil)
			if err != nil {
				return err
			}
			req.Header.Set("Authorization", "Bearer "+p.token)
			resp, err := client.Do(req) //nolint:bodyclose // closed by closeAll: the stream stays open until then
			if err != nil {
				return err
			}
			bodies = append(bodies, resp.Body)
			line, err := bufio.NewReader(resp.Body).ReadString('\n')
			if err != nil || resp.StatusCode != http.StatusOK || line != ": connected\n" {
				return fmt.Errorf("SSE stream %d: status %d, first line %q: %w", i, resp.StatusCode, line, err)
			}
		}
		return nil
	}
	return connect, closeAll, nil
}

// rss reads a process's resident set size, in bytes.
func rss(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb * 1024, err
		}
	}
	return 0, errors.New("no VmRSS")
}
