// Command allocate measures complete allocate rounds through a real
// `parley serve`: one consumer and ten suppliers, each round from the
// consumer's new_task_request through the ten offers, one accept_offer and
// nine reject_offers, the supplier's order_complete and the consumer's
// confirm_success, to the dialogue's close. It prints rounds per second
// and the p50 and p99 round time, against a reference measured in the same
// run on the same server and agents: the same 23 messages in the same
// shape as plain network messages (category message, no protocol), so the
// ratio is what the service protocol costs on top of the network
// (protocol control, deadlines armed and cleared, the order and its
// trail, the offer terms).
//
// Usage (from the repository root):
//
//	go run ./bench/allocate [-parley PATH] [-duration 5s] [-inflight 1,8,32] [-rounds 3] [-concurrency 32]
//
// -inflight is how many rounds the consumer runs at once (each on its own
// dialogue); -rounds repeats every measurement, alternating allocate and
// reference, and the median round is reported with the per-round ratios.
// Both sides use the Go SDK (sdk.ServiceAgent for allocate,
// sdk.NetworkAgent routes for the reference), in this process, every agent
// handling up to -concurrency dialogues at once
// (sdk.NetworkOptions.Concurrency; 1 handles each agent's messages one at
// a time, as the SDK's default does).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
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
	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/sdk"
)

const suppliers = 10

func main() {
	if err := run(os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench/allocate:", err)
		os.Exit(1)
	}
}

type result struct {
	rounds  int
	elapsed time.Duration
	// cpu is the CPU time parley serve (with its workers) and this
	// harness (the eleven SDK agents) used during the measurement.
	serverCPU, harnessCPU time.Duration
	p50, p99              time.Duration
	errors                int64
	firstErr              error
}

func (r result) rate() float64 { return float64(r.rounds) / r.elapsed.Seconds() }

func run(stdout io.Writer) error {
	parley := flag.String("parley", "", "path to a parley binary; built from ./cmd/parley when empty")
	duration := flag.Duration("duration", 5*time.Second, "how long each measurement runs rounds")
	inflightList := flag.String("inflight", "1,8,32", "comma-separated counts of rounds in flight")
	rounds := flag.Int("rounds", 3, "measurements of each kind per in-flight count; the median is reported")
	concurrency := flag.Int("concurrency", 32, "dialogues each agent handles at once (sdk.NetworkOptions.Concurrency)")
	flag.Parse()

	var counts []int
	for _, s := range strings.Split(*inflightList, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 {
			return fmt.Errorf("-inflight: %q is not a positive number", s)
		}
		counts = append(counts, n)
	}
	tmp, err := os.MkdirTemp("", "bench-allocate-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if *parley, err = parleyproc.Binary(*parley, tmp); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p, err := startParley(ctx, *parley, filepath.Join(tmp, "data"))
	if err != nil {
		return err
	}
	defer p.stop()
	m, err := newMarket(ctx, p, *concurrency)
	if err != nil {
		return err
	}
	defer m.stop()
	// The agents connect and the built-in PDs register in the background:
	// a round sent before then is cleared from a backlog or refused.
	for _, round := range []func(context.Context) error{m.allocateRound, m.referenceRound} {
		if err := warmUp(ctx, round); err != nil {
			return err
		}
	}

	fmt.Fprintf(stdout, "one consumer, %d suppliers, each handling up to %d dialogues at once; %s per measurement, %d rounds each, median reported\n", suppliers, *concurrency, *duration, *rounds)
	fmt.Fprintf(stdout, "%-10s %-9s %10s %10s %10s\n", "kind", "inflight", "rounds/s", "p50", "p99")
	for _, n := range counts {
		var alloc, ref []result
		var ratios []float64
		for range *rounds {
			r, err := measure(p.pid, func() (result, error) { return m.load(ctx, n, *duration, m.referenceRound) })
			if err != nil {
				return err
			}
			a, err := measure(p.pid, func() (result, error) { return m.load(ctx, n, *duration, m.allocateRound) })
			if err != nil {
				return err
			}
			ref, alloc = append(ref, r), append(alloc, a)
			ratios = append(ratios, a.rate()/r.rate())
		}
		for _, x := range []struct {
			name string
			rs   []result
		}{{"reference", ref}, {"allocate", alloc}} {
			r := median(x.rs)
			fmt.Fprintf(stdout, "%-10s %-9d %10.1f %10s %10s  errors=%d\n", x.name, n, r.rate(), r.p50.Round(time.Microsecond), r.p99.Round(time.Microsecond), r.errors)
			if r.rounds > 0 {
				server, harness := r.serverCPU/time.Duration(r.rounds), r.harnessCPU/time.Duration(r.rounds)
				fmt.Fprintf(stdout, "  CPU per round: parley serve %s, harness %s; all %d cores on these alone would cap it at %.0f rounds/s\n",
					server.Round(10*time.Microsecond), harness.Round(10*time.Microsecond), runtime.NumCPU(), float64(runtime.NumCPU())/(server+harness).Seconds())
			}
			if r.firstErr != nil {
				fmt.Fprintf(stdout, "  first error: %v\n", r.firstErr)
			}
		}
		var rs []string
		for _, x := range ratios {
			rs = append(rs, fmt.Sprintf("%.2f", x))
		}
		slices.Sort(ratios)
		fmt.Fprintf(stdout, "ratio allocate/reference at %d in flight: median %.2f (rounds: %s)\n", n, ratios[len(ratios)/2], strings.Join(rs, " "))
	}
	return nil
}

// measure runs load and adds the CPU time parley serve (pid and its
// children) and this process used meanwhile.
func measure(pid int, load func() (result, error)) (result, error) {
	server, harness := cputime.Tree(pid), cputime.Self()
	r, err := load()
	r.serverCPU, r.harnessCPU = cputime.Tree(pid)-server, cputime.Self()-harness
	return r, err
}

// warmUp runs round until one completes, for at most 60 s.
func warmUp(ctx context.Context, round func(context.Context) error) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		err := round(rctx)
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("warm-up: %w", err)
		}
	}
}

// median returns the result with the median rate.
func median(rs []result) result {
	s := slices.Clone(rs)
	slices.SortFunc(s, func(a, b result) int {
		switch {
		case a.rate() < b.rate():
			return -1
		case a.rate() > b.rate():
			return 1
		}
		return 0
	})
	return s[len(s)/2]
}

// load runs round on n goroutines for d and returns the rounds done.
func (m *market) load(ctx context.Context, n int, d time.Duration, round func(context.Context) error) (result, error) {
	var (
		mu       sync.Mutex
		times    []time.Duration
		errs     atomic.Int64
		firstErr atomic.Pointer[error]
		wg       sync.WaitGroup
	)
	start := time.Now()
	deadline := start.Add(d)
	for range n {
		wg.Go(func() {
			for time.Now().Before(deadline) && ctx.Err() == nil {
				t0 := time.Now()
				rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				err := round(rctx)
				cancel()
				if err != nil {
					errs.Add(1)
					firstErr.CompareAndSwap(nil, &err)
					continue
				}
				mu.Lock()
				times = append(times, time.Since(t0))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	r := result{rounds: len(times), elapsed: time.Since(start), errors: errs.Load()}
	if e := firstErr.Load(); e != nil {
		r.firstErr = *e
	}
	slices.Sort(times)
	if len(times) > 0 {
		r.p50, r.p99 = times[len(times)/2], times[len(times)*99/100]
	}
	if r.errors > 0 && r.rounds == 0 {
		return r, fmt.Errorf("every round failed: %w", r.firstErr)
	}
	return r, nil
}

// ---- the agents ----

func agentName(id string) string { return "clients/bench/agents/" + id }

// market is the consumer and the suppliers, each a running agent that
// serves both kinds of round.
type market struct {
	p        *parleyProc
	disp     dispatcherv1.DispatcherServiceClient
	consumer *sdk.ServiceAgent
	to       []string
	stop     func()

	mu      sync.Mutex
	waiting map[string]chan sdk.Message // reference dialogues: the consumer's messages by dialogue
	early   map[string][]sdk.Message    // reference messages that came before their dialogue was known
}

func newMarket(ctx context.Context, p *parleyProc, concurrency int) (*market, error) {
	reg := registryv1.NewRegistryServiceClient(p.conn)
	rctx := p.ctx(ctx)
	if _, err := reg.CreateClient(rctx, &registryv1.CreateClientRequest{ClientId: "bench"}); err != nil {
		return nil, fmt.Errorf("create client: %w", err)
	}
	m := &market{p: p, disp: dispatcherv1.NewDispatcherServiceClient(p.conn), waiting: map[string]chan sdk.Message{}, early: map[string][]sdk.Message{}}
	ids := []string{"c"}
	for i := range suppliers {
		ids = append(ids, fmt.Sprintf("s%d", i))
		m.to = append(m.to, agentName(fmt.Sprintf("s%d", i)))
	}
	actx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	m.stop = func() { cancel(); wg.Wait() }
	for i, id := range ids {
		if _, err := reg.CreateAgent(rctx, &registryv1.CreateAgentRequest{Parent: "clients/bench", AgentId: id, Agent: &registryv1.Agent{DisplayName: id}}); err != nil {
			m.stop()
			return nil, fmt.Errorf("create agent %s: %w", id, err)
		}
		if id != "c" {
			if _, err := reg.FollowAgent(rctx, &registryv1.FollowAgentRequest{Name: agentName(id), Agent: agentName("c")}); err != nil {
				m.stop()
				return nil, fmt.Errorf("%s follows c: %w", id, err)
			}
		}
		na, err := sdk.NewNetworkAgent(p.conn, agentName(id), sdk.NetworkOptions{Key: p.token, ClearBacklog: true, Concurrency: concurrency})
		if err != nil {
			m.stop()
			return nil, err
		}
		sa, err := sdk.NewServiceAgent(p.conn, na, nil)
		if err != nil {
			m.stop()
			return nil, err
		}
		if id == "c" {
			m.consumer = sa
			err = na.Handle(sdk.RouteKey{Agent: na.Name(), Type: sdk.TypeGeneralError}, "reference", m.consumerReference)
		} else {
			supply(sa, i)
			err = na.Handle(sdk.RouteKey{Agent: na.Name(), Type: sdk.TypeGeneralError}, "reference", m.supplierReference(na.Name(), i))
		}
		if err != nil {
			m.stop()
			return nil, err
		}
		wg.Go(func() { _ = na.Run(actx) })
	}
	return m, nil
}

// price is supplier i's price: s0 is the cheapest.
func price(i int) sdk.Price {
	return sdk.Price{AmountMicros: int64(1_000_000 + i*100_000), Currency: "USD"}
}

// supply registers supplier i's allocate stages: an offer at once, and
// order_complete for an acceptance.
func supply(sa *sdk.ServiceAgent, i int) {
	sa.Supply("new_task_request", func(ctx context.Context, _ sdk.Message, r sdk.Responder) error {
		_, err := r.Reply(ctx, "offer", map[string]any{"offer": map[string]int{"supplier": i}, "offer_timeout": 30, "price": price(i)})
		return err
	})
	sa.Supply("accept_offer", func(ctx context.Context, _ sdk.Message, r sdk.Responder) error {
		_, err := r.Reply(ctx, "order_complete", map[string]string{"delivered": "yes"})
		return err
	})
}

func byPrice(b sdk.Bid) float64 { return -float64(b.Price.AmountMicros) }

// allocateRound is one allocate round, through confirm_success.
func (m *market) allocateRound(ctx context.Context) error {
	round, err := m.consumer.Allocate(ctx, sdk.Request{To: m.to, Task: map[string]string{"what": "ship"}, Window: 30 * time.Second}, byPrice)
	if err != nil {
		return err
	}
	defer func() { _ = round.Close(context.WithoutCancel(ctx)) }()
	if len(round.Offers) != suppliers {
		return fmt.Errorf("%d offers, want %d", len(round.Offers), suppliers)
	}
	order, err := round.Accept(ctx, round.Offers[0], nil)
	if err != nil {
		return err
	}
	for _, o := range round.Offers[1:] {
		if err := round.Reject(ctx, o); err != nil {
			return err
		}
	}
	done, err := round.Await(ctx, order.Supplier, "order_complete", "order_failed")
	if err != nil {
		return err
	}
	if done.Type != "order_complete" {
		return fmt.Errorf("order ended with %s", done.Type)
	}
	return round.Confirm(ctx, done, true)
}

// ---- the reference: the same messages, no protocol ----

func (m *market) reply(ctx context.Context, sender, inReplyTo, typ, body string) error {
	_, err := m.disp.ReplyMessage(m.p.ctx(ctx), &dispatcherv1.ReplyMessageRequest{Sender: sender, InReplyTo: inReplyTo, MessageType: typ, BodyJson: body})
	return err
}

// supplierReference answers a reference task with a bid, and an award
// with done.
func (m *market) supplierReference(name string, i int) sdk.HandlerFunc {
	bid, _ := json.Marshal(map[string]any{"bid": map[string]int{"supplier": i}, "price": price(i)})
	return func(ctx context.Context, msg sdk.Message) (any, error) {
		switch msg.Type {
		case "task":
			return nil, m.reply(ctx, name, msg.ID, "bid", string(bid))
		case "award":
			return nil, m.reply(ctx, name, msg.ID, "done", `{"delivered":"yes"}`)
		}
		return nil, nil
	}
}

// consumerReference hands the consumer's reference messages to the round
// waiting in their dialogue.
func (m *market) consumerReference(_ context.Context, msg sdk.Message) (any, error) {
	if msg.Type != "bid" && msg.Type != "done" {
		return nil, nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if ch := m.waiting[msg.DialogueID]; ch != nil {
		ch <- msg
	} else {
		m.early[msg.DialogueID] = append(m.early[msg.DialogueID], msg)
	}
	return nil, nil
}

func (m *market) referenceRound(ctx context.Context) error {
	c := agentName("c")
	res, err := m.disp.SendMessage(m.p.ctx(ctx), &dispatcherv1.SendMessageRequest{
		Sender: c, To: &dispatcherv1.DistributionList{Direct: m.to}, MessageType: "task", BodyJson: `{"task":{"what":"ship"}}`,
	})
	if err != nil {
		return err
	}
	ch := make(chan sdk.Message, suppliers+1)
	m.mu.Lock()
	for _, msg := range m.early[res.GetDialogueId()] {
		ch <- msg
	}
	delete(m.early, res.GetDialogueId())
	m.waiting[res.GetDialogueId()] = ch
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		delete(m.waiting, res.GetDialogueId())
		m.mu.Unlock()
		_, _ = m.disp.CloseDialogue(m.p.ctx(context.WithoutCancel(ctx)), &dispatcherv1.CloseDialogueRequest{Name: c + "/dialogues/" + res.GetDialogueId()})
	}()
	next := func() (sdk.Message, error) {
		select {
		case <-ctx.Done():
			return sdk.Message{}, ctx.Err()
		case msg := <-ch:
			return msg, nil
		}
	}
	var bids []sdk.Message
	for len(bids) < suppliers {
		msg, err := next()
		if err != nil {
			return fmt.Errorf("%d bids of %d: %w", len(bids), suppliers, err)
		}
		bids = append(bids, msg)
	}
	// Rank as allocate does: parse each price, cheapest first.
	prices := map[string]int64{}
	for _, b := range bids {
		var body struct{ Price sdk.Price }
		_ = json.Unmarshal(b.Body, &body)
		prices[b.ID] = body.Price.AmountMicros
	}
	slices.SortStableFunc(bids, func(a, b sdk.Message) int { return int(prices[a.ID] - prices[b.ID]) })
	if err := m.reply(ctx, c, bids[0].ID, "award", "{}"); err != nil {
		return err
	}
	for _, b := range bids[1:] {
		if err := m.reply(ctx, c, b.ID, "decline", "{}"); err != nil {
			return err
		}
	}
	done, err := next()
	if err != nil {
		return err
	}
	return m.reply(ctx, c, done.ID, "thanks", "{}")
}

// ---- the server ----

type parleyProc struct {
	pid   int // parley serve; its routine workers are its children
	token string
	conn  *grpc.ClientConn
	stop  func()
}

func (p *parleyProc) ctx(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+p.token)
}

// startParley runs `parley serve` on loopback with its own data
// directory until stop.
func startParley(ctx context.Context, bin, data string) (*parleyProc, error) {
	proc, err := parleyproc.Start(ctx, bin, data)
	if err != nil {
		return nil, err
	}
	p := &parleyProc{pid: proc.PID}
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
	if p.conn, err = grpc.NewClient(proc.GRPCAddr, append(sdk.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...); err != nil {
		p.stop()
		return nil, err
	}
	return p, nil
}
