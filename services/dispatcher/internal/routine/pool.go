package routine

import (
	"bufio"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The hard boundary. Go cannot stop a goroutine inside a long builtin
// (all(range(1 << 62)) is one step), and the in-process guards estimate
// memory, they do not cap it. So a Pool runs routines in worker processes,
// the server's own binary re-executed (IsWorker, ServeWorker), warm and
// reused. Each worker:
//   - runs one call at a time, single-threaded (GOMAXPROCS=1), so it uses
//     at most one core;
//   - has its address space capped (RLIMIT_AS, limitSelf) at its start
//     size plus PoolOptions.MemoryBytes;
//   - is killed (SIGKILL) when a call passes its wall-time budget (or the
//     caller's deadline) plus PoolOptions.KillMargin, and replaced.
// Inside a worker the in-process guards still run and give the early,
// precise errors (steps, allocation estimate, output size); the kill and
// the cap are what hold when they cannot. See docs/adr/0005.
//
// Fair shares: a worker is leased to one agent at a time. An agent that
// holds none takes any free worker; one that holds some takes another only
// while more workers are free than it holds (mayLease), so the agents
// already busy always leave room for one that arrives: one agent alone
// holds at most half the workers (rounded up), and two flooding at once
// leave at least one free when there are four or more workers, so a third
// agent's calls find one at once. When a newcomer takes the last free
// worker, an agent holding two or more gives one back as its calls end
// (givesBack), and a freed worker goes to the waiting agent holding the
// fewest (handOut). An agent's calls beyond what it may hold wait for room
// on its own workers (never on another agent's) up to their wall-time
// budget, then fail with ErrBusy.
//
// Pipelining: a worker leased to an agent takes up to pipelineDepth of
// that agent's calls at once. They are written to its pipe as they come
// and it runs them one after the other, so under load a worker reads its
// next call without sleeping and the server writes to a worker that is
// awake: the two process wake-ups per call that dominated the boundary's
// cost happen once per burst instead. Each call keeps its own kill, armed
// when it starts (the worker stamps each answer with the time it wrote
// it, so the next call's start is known to the server); a call that has
// not started when its worker dies is sent again, to any worker, and a
// call that would start after its wait budget is answered busy by the
// worker. Only the agent's own calls queue behind its runaway: its share
// is unchanged, and other agents never share its workers.

// ErrBusy is returned when no worker frees up within the wall-time budget.
var ErrBusy = errors.New("every routine worker is busy")

// PoolOptions configure a Pool. MemoryBytes, KillMargin and WorkerCPU must
// be positive: the dispatcher's config owns their defaults
// (--routine-memory-bytes, --routine-kill-margin, --routine-worker-cpu) and
// NewPoolWith substitutes none.
type PoolOptions struct {
	// Workers is how many routine runs execute at once (worker processes);
	// it must be at least 1.
	Workers int
	// AgentShare, when positive, caps the workers one agent holds at once
	// below what the fair-share rule allows (Pool.mayLease: an agent
	// alone takes at most half the workers, rounded up); 0 adds no cap.
	AgentShare int
	// MemoryBytes caps each worker's memory above its start size.
	MemoryBytes int64
	// KillMargin is how long past its budget a run may go before its
	// worker is killed.
	KillMargin time.Duration
	// Executable is the worker binary; this process's own when empty.
	Executable string
	// WorkerCPU is the CPU time one worker may use in its life (its hard
	// RLIMIT_CPU); the pool replaces a worker that has used half of it,
	// or before a run whose budget it may not have left.
	// Each run may also use at most its wall budget plus one to two
	// seconds of CPU (a soft RLIMIT_CPU set before the run). It must be at
	// least 4 s (the config refuses less).
	WorkerCPU time.Duration
}

// Pool runs routines in worker processes behind the hard boundary (or, for
// tests only, in process: InProcessForTests). Close it to stop the workers.
type Pool struct {
	opts PoolOptions
	// inProcess runs routines in this process (InProcessForTests).
	inProcess bool
	// mu guards free, returning, seq, agents, live and closed, and every
	// worker's load, share, draining and leaving. It is never taken while a
	// worker's mu is held.
	mu sync.Mutex
	// free holds the worker slots leased to no agent, one entry each; nil
	// is a slot whose worker is not started.
	free []*worker
	// returning counts the slots on their way back to free: workers
	// leaving their agent once idle, and dead or worn ones being reaped.
	returning int
	seq       uint64 // the last waiter's
	agents    map[string]*agentShare
	live      map[*worker]struct{}
	closed    bool

	// fresh is pipelineFresh (tests set it longer).
	fresh time.Duration
	// waits, when set (by tests), is called with the agent of each call
	// that finds no room and waits for it.
	waits func(agent string)

	started  atomic.Int64
	recycled atomic.Int64
	kills    [KindSteps + 1]atomic.Int64
	peakRSS  atomic.Int64
}

// agentShare is one agent's part of the pool. Guarded by Pool.mu.
type agentShare struct {
	name    string
	held    []*worker // the workers leased to the agent
	leasing int       // free slots taken for it whose worker is being started
	leaving int       // workers of held that go back to the free slots once idle
	waiters []*waiter // calls waiting for room, first come first served
	users   int       // calls between acquire and release
}

// holds is how many workers sh holds or is taking.
func (sh *agentShare) holds() int { return len(sh.held) + sh.leasing }

// waiter is a call waiting for room.
type waiter struct {
	room   chan grant
	budget time.Duration
	seq    uint64 // the order the calls began to wait in, pool-wide
}

// grant is what a waiting call gets: room on w, one of its agent's
// workers, or (lease) the free slot w (nil: not started), taken for its
// agent (agentShare.leasing counts it).
type grant struct {
	w     *worker
	lease bool
}

// pipelineDepth is how many of its agent's calls a worker holds at once:
// the one running and those written behind it.
const pipelineDepth = 4

// pipelineFresh bounds how long a worker's running call may have run for
// another call to be written behind it: calls are queued behind quick
// ones only. A slower routine keeps a worker to itself, and the calls
// after it wait for a worker as without pipelining (a queued call cannot
// be taken back, and would wait for the running one to end).
const pipelineFresh = 10 * time.Millisecond

// NewPoolWith returns a pool configured by o. Workers start on first use.
func NewPoolWith(o PoolOptions) *Pool {
	if o.AgentShare <= 0 || o.AgentShare > o.Workers {
		o.AgentShare = o.Workers
	}
	o.WorkerCPU = o.WorkerCPU.Round(time.Second) // RLIMIT_CPU counts seconds
	if o.Executable == "" {
		o.Executable = "/proc/self/exe"
	}
	p := &Pool{opts: o, free: make([]*worker, o.Workers, max(o.Workers, 1)), agents: map[string]*agentShare{}, live: map[*worker]struct{}{}, fresh: pipelineFresh}
	return p
}

// Options returns the pool's options (AgentShare as NewPoolWith derived
// it, WorkerCPU rounded to seconds).
func (p *Pool) Options() PoolOptions { return p.opts }

// InProcessForTests returns a pool that runs routines in this process,
// under the in-process guards only: no worker process, no hard boundary
// (a long builtin is never stopped, memory is estimated, not capped), no
// bound on concurrent runs and no fair shares. It exists for the guards'
// own tests and for tests of packages that run routines without needing
// the boundary. Product code never uses it: e2e's
// TestArch_noInProcessRoutines fails if any non-test file but this
// declaration names it (and TestArch_binariesCarryNoTestSupport if a
// binary links package routinetest).
func InProcessForTests() *Pool { return &Pool{inProcess: true} }

func (p *Pool) remote() bool { return !p.inProcess }

// PoolStats are counters of a pool's workers.
type PoolStats struct {
	Started int64 // worker processes started
	// Kills counts workers killed or dead during a run, by the run's kind
	// (KindTime: killed at the deadline; KindMemory: died at the cap).
	Kills map[Kind]int64
	// Recycled counts workers replaced after using half their CPU time
	// (PoolOptions.WorkerCPU).
	Recycled int64
	// PeakRSS is the most memory any reaped worker held, in bytes.
	PeakRSS int64
	// Workers are the process ids of the live workers.
	Workers []int
}

// Stats returns the pool's counters.
func (p *Pool) Stats() PoolStats {
	s := PoolStats{Started: p.started.Load(), Recycled: p.recycled.Load(), Kills: map[Kind]int64{}, PeakRSS: p.peakRSS.Load()}
	for k := range p.kills {
		if n := p.kills[k].Load(); n > 0 {
			s.Kills[Kind(k)] = n
		}
	}
	p.mu.Lock()
	for w := range p.live {
		s.Workers = append(s.Workers, w.cmd.Process.Pid)
	}
	p.mu.Unlock()
	slices.Sort(s.Workers)
	return s
}

// Close stops every worker and waits for them to exit; runs still going
// fail. The pool must not be used after.
func (p *Pool) Close() error {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	p.closed = true
	live := make([]*worker, 0, len(p.live))
	for w := range p.live {
		live = append(live, w)
	}
	p.mu.Unlock()
	for _, w := range live {
		_ = w.cmd.Process.Kill()
		p.reap(w)
	}
	return nil
}

type agentKey struct{}

// WithAgent returns ctx naming the agent whose share of the workers the
// runs under it take. By default a run's agent is read from the routine's
// name (clients/{client}/agents/{agent}/routines/…); runs of other names
// (dry runs) share one anonymous share.
func WithAgent(ctx context.Context, agent string) context.Context {
	return context.WithValue(ctx, agentKey{}, agent)
}

func agentOf(ctx context.Context, name string) string {
	if a, ok := ctx.Value(agentKey{}).(string); ok {
		return a
	}
	if i := strings.Index(name, "/routines/"); i > 0 {
		return name[:i]
	}
	return ""
}

// acquire reserves room for one call on a worker leased to agent: a
// worker the agent holds with nothing queued, else a free slot if the
// agent may lease one (mayLease), else the least loaded of its workers
// with room in its pipeline. Otherwise it waits until until, or until ctx
// ends (the caller's error, not the pool's), for room on the agent's
// workers or a free slot handed to it (handOut). The call releases the
// room with release.
func (p *Pool) acquire(ctx context.Context, agent string, until time.Time, budget time.Duration) (*worker, error) {
	p.mu.Lock()
	sh := p.agents[agent]
	if sh == nil {
		sh = &agentShare{name: agent}
		p.agents[agent] = sh
	}
	sh.users++
	if p.closed {
		p.leave(sh)
		p.mu.Unlock()
		return nil, errors.New("the routine pool is closed")
	}
	if w := p.pick(sh, budget, true); w != nil {
		w.load++
		p.mu.Unlock()
		return w, nil
	}
	if p.mayLease(sh, len(p.free)) {
		slot := p.takeFree()
		sh.leasing++
		return p.lease(sh, slot, budget)
	}
	if w := p.pick(sh, budget, false); w != nil {
		w.load++
		p.mu.Unlock()
		return w, nil
	}
	p.seq++
	wt := &waiter{room: make(chan grant, 1), budget: budget, seq: p.seq}
	sh.waiters = append(sh.waiters, wt)
	waits := p.waits
	p.mu.Unlock()
	if waits != nil {
		waits(agent)
	}
	timer := time.NewTimer(time.Until(until))
	defer timer.Stop()
	select {
	case g := <-wt.room:
		if g.lease {
			p.mu.Lock()
			return p.lease(sh, g.w, budget)
		}
		return g.w, nil
	case <-timer.C:
		held := p.giveUp(sh, wt)
		return nil, fmt.Errorf("%w: %w: no routine worker was free for this agent for %v (it holds %d of the %d workers)", ErrBudget, ErrBusy, budget, held, p.opts.Workers)
	case <-ctx.Done():
		p.giveUp(sh, wt)
		return nil, fmt.Errorf("waiting for a routine worker: %w", context.Cause(ctx))
	}
}

// mayLease reports whether sh may lease a slot when free are free: the
// fair-share rule. An agent holding none may take any free worker; one
// that holds some may take another only while more workers are free than
// it holds, and never past PoolOptions.AgentShare. So whatever the
// agents already holding workers do, they leave room for one that holds
// none: one agent alone takes at most half the workers (rounded up), and
// two flooding together leave at least one free when there are four or
// more. When a newcomer takes the last free worker, the agents
// holding more than what is free give workers back as their calls end
// (givesBack).
// Called with p.mu held.
func (p *Pool) mayLease(sh *agentShare, free int) bool {
	h := sh.holds()
	return free > 0 && h < p.opts.AgentShare && (h == 0 || free > h)
}

// givesBack reports whether sh holds two or more workers and at least two
// more than are free (or on their way back): then one of its workers goes
// back to the free slots once its calls end, instead of taking the
// agent's next call, until as many are free as the rule of mayLease would
// have left. Called with p.mu held.
func (p *Pool) givesBack(sh *agentShare) bool {
	h := sh.holds() - sh.leaving
	return h >= 2 && len(p.free)+p.returning < h-1
}

// handOut gives free slots to the waiting calls whose agents may lease
// them (mayLease): each to the first waiting call of the agent holding the
// fewest workers, the longest-waiting first among equals (max-min
// fairness). Called with p.mu held.
func (p *Pool) handOut() {
	for len(p.free) > 0 {
		var best *agentShare
		for _, sh := range p.agents {
			if len(sh.waiters) == 0 || !p.mayLease(sh, len(p.free)) {
				continue
			}
			if best == nil || sh.holds() < best.holds() || sh.holds() == best.holds() && sh.waiters[0].seq < best.waiters[0].seq {
				best = sh
			}
		}
		if best == nil {
			return
		}
		slot := p.takeFree()
		wt := best.waiters[0]
		best.waiters = best.waiters[1:]
		best.leasing++
		wt.room <- grant{w: slot, lease: true}
	}
}

// takeFree takes the slot that has been free the longest: slots are
// taken in turn. Called with p.mu held, when one is free.
func (p *Pool) takeFree() *worker {
	w := p.free[0]
	p.free[0] = nil
	p.free = p.free[1:]
	return w
}

// giveUp ends a wait of acquire that got nothing, and returns how many
// workers the agent held.
func (p *Pool) giveUp(sh *agentShare, wt *waiter) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dropWaiter(sh, wt)
	held := sh.holds()
	p.leave(sh)
	return held
}

// pick returns the worker of sh with nothing queued or, unless empty,
// the least loaded one with room in its pipeline whose running call
// started less than pipelineFresh ago; nil if none. The anonymous share
// (dry runs of every agent) is not pipelined. A worker going back to the
// free slots takes no more calls. A worker that may not have the CPU time
// left for the calls it would then hold is drained
// (PoolOptions.WorkerCPU). Called with p.mu held.
func (p *Pool) pick(sh *agentShare, budget time.Duration, empty bool) *worker {
	var best *worker
	now := time.Now().UnixNano()
	for _, w := range sh.held {
		if w.draining || w.leaving || w.dead.Load() || w.load >= pipelineDepth {
			continue
		}
		if w.load > 0 {
			if start := w.headStart.Load(); empty || sh.name == "" || start > 0 && now-start > int64(p.fresh) {
				continue
			}
		}
		if p.worn(w, w.load+1, budget) {
			p.drain(w)
			continue
		}
		if best == nil || w.load < best.load {
			best = w
		}
	}
	return best
}

// worn reports whether w may run out of its life's CPU time in the next
// calls runs of the given budget: each may use its budget plus the soft
// limit's two seconds, and one to spare, before the kernel kills it.
func (p *Pool) worn(w *worker, calls int, budget time.Duration) bool {
	return time.Duration(w.cpu.Load())+time.Duration(calls)*(budget+3*time.Second) > p.opts.WorkerCPU
}

// drain takes w out of service: it takes no more calls and is replaced
// once those it holds are done. Called with p.mu held.
func (p *Pool) drain(w *worker) {
	if !w.draining {
		w.draining = true
		p.recycled.Add(1)
	}
	if w.load == 0 && w.share != nil {
		p.unlease(w)
	}
}

// lease leases the free slot w (nil: not started), taken for sh (counted
// in sh.leasing), to sh and reserves room on it, starting a worker if the
// slot has none, or a dead or worn one. It is called with p.mu held and
// returns with it released.
func (p *Pool) lease(sh *agentShare, w *worker, budget time.Duration) (*worker, error) {
	p.mu.Unlock()
	if w != nil && (w.dead.Load() || p.worn(w, 1, budget)) {
		if !w.dead.Load() {
			p.recycled.Add(1)
		}
		_ = w.cmd.Process.Kill()
		p.reap(w)
		w = nil
	}
	var err error
	if w == nil {
		w, err = p.start()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	sh.leasing--
	if err != nil {
		p.free = append(p.free, nil)
		p.handOut()
		p.leave(sh)
		return nil, err
	}
	w.share = sh
	w.load = 1
	sh.held = append(sh.held, w)
	return w, nil
}

// release gives back the room a call took on w.
func (p *Pool) release(w *worker) {
	p.mu.Lock()
	defer p.mu.Unlock()
	sh := w.share
	p.free1(w)
	p.leave(sh)
}

// free1 frees one call's room on w. The room goes straight to the agent's
// first waiting call, so a call arriving later cannot take it first,
// unless w goes back to the free slots (givesBack) or is worn or dead.
// A worker with nothing queued goes back to the free slots unless the
// agent has calls waiting; a dead or worn one is replaced. Called with
// p.mu held.
func (p *Pool) free1(w *worker) {
	sh := w.share
	w.load--
	if !w.draining && time.Duration(w.cpu.Load()) >= p.opts.WorkerCPU/2 {
		w.draining = true // long before its hard CPU limit
		p.recycled.Add(1)
	}
	usable := !w.draining && !w.dead.Load()
	if usable && !w.leaving && p.givesBack(sh) {
		w.leaving = true
		sh.leaving++
		p.returning++
	}
	if usable && !w.leaving && len(sh.waiters) > 0 {
		wt := sh.waiters[0]
		if !p.worn(w, w.load+1, wt.budget) {
			sh.waiters = sh.waiters[1:]
			w.load++
			wt.room <- grant{w: w}
			return
		}
		w.draining = true
		p.recycled.Add(1)
	}
	if w.load == 0 {
		p.unlease(w)
	}
}

// unlease returns w's slot to the free ones, and hands out what that
// allows (handOut): w itself or, when w is dead or drained, an empty slot
// once w is reaped. The call that takes an empty slot starts its worker
// (lease), and that start does not count against its wait budget
// (Pool.call); started here in the background instead, a slow start (a
// loaded machine, -race) made the calls waiting for the slot fail busy.
// Called with p.mu held, when w holds no call.
func (p *Pool) unlease(w *worker) {
	sh := w.share
	sh.held = slices.DeleteFunc(sh.held, func(x *worker) bool { return x == w })
	w.share = nil
	if w.leaving {
		w.leaving = false
		sh.leaving--
		p.returning--
	}
	if !w.draining && !w.dead.Load() {
		p.free = append(p.free, w)
		p.handOut()
		return
	}
	p.returning++
	p.handOut() // sh holds one fewer: it may lease a free slot now
	go func() {
		_ = w.cmd.Process.Kill()
		p.reap(w)
		p.mu.Lock()
		defer p.mu.Unlock()
		p.returning--
		p.free = append(p.free, nil)
		p.handOut()
	}()
}

// dropWaiter removes wt from sh's waiters; if it was granted something
// meanwhile, that passes on: room on a worker is freed again, a free slot
// goes back. Called with p.mu held.
func (p *Pool) dropWaiter(sh *agentShare, wt *waiter) {
	if i := slices.Index(sh.waiters, wt); i >= 0 {
		sh.waiters = slices.Delete(sh.waiters, i, i+1)
		return
	}
	select {
	case g := <-wt.room:
		if g.lease {
			sh.leasing--
			p.free = append(p.free, g.w)
			p.handOut()
		} else {
			p.free1(g.w)
		}
	default:
	}
}

// leave ends a call's use of sh, and forgets an agent with no calls and
// no workers. Called with p.mu held.
func (p *Pool) leave(sh *agentShare) {
	sh.users--
	if sh.users == 0 && len(sh.held) == 0 && sh.leasing == 0 {
		delete(p.agents, sh.name)
	}
}

// worker is one worker process. Calls of the agent it is leased to write
// their frames to it in turn; the oldest pending exchange reads its
// answers (await).
type worker struct {
	cmd    *exec.Cmd
	in     *os.File
	r      *bufio.Reader // the oldest pending exchange's
	stderr *headBuffer

	wmu sync.Mutex // guards w: frames are written whole, in the order of pending
	w   *bufio.Writer

	mu      sync.Mutex // guards known, pending and the kill timer
	known   map[string]bool
	pending []*exchange // written and not answered, oldest first: the first is running
	kill    *time.Timer // kills it at killAt unless killEx has been answered (arm)
	killEx  *exchange
	killAt  time.Time

	// When it was ready (its hello read) and how long it took to start;
	// set before it is used, then read-only.
	born      time.Time
	startTook time.Duration

	cpu       atomic.Int64 // the CPU time it said it has used, ns
	headStart atomic.Int64 // when its running exchange started, Unix ns; 0 when none
	killed    atomic.Bool  // killed at a run's deadline
	dead      atomic.Bool  // its pipe broke or it was killed: replace it

	// Guarded by Pool.mu.
	load     int         // calls holding room on it
	share    *agentShare // the agent it is leased to; nil when free
	draining bool        // worn: it takes no more calls
	leaving  bool        // it goes back to the free slots once idle (givesBack)

	waitOnce sync.Once // Wait is called once, by whoever reaps it first
}

// wait waits for the worker's exit, once however many callers.
func (w *worker) wait() {
	w.waitOnce.Do(func() {
		w.in.Close()
		_ = w.cmd.Wait()
	})
}

// headBuffer keeps the first bytes a worker writes to stderr (the Go
// runtime's reason when it dies).
type headBuffer struct {
	mu sync.Mutex
	b  []byte
}

func (h *headBuffer) Write(b []byte) (int, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if n := 2048 - len(h.b); n > 0 {
		h.b = append(h.b, b[:min(n, len(b))]...)
	}
	return len(b), nil
}

func (h *headBuffer) String() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return string(h.b)
}

// Supported returns nil where the pool can run worker processes (Linux),
// else an error saying so: a server should refuse to start with it.
func Supported() error { return supported() }

// start starts a worker and waits for its hello.
func (p *Pool) start() (*worker, error) {
	if err := supported(); err != nil {
		return nil, err
	}
	p.mu.Lock()
	closed := p.closed
	p.mu.Unlock()
	if closed {
		return nil, errors.New("the routine pool is closed")
	}
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return nil, err
	}
	launched := time.Now()
	w := &worker{in: inW, stderr: &headBuffer{}, known: map[string]bool{}}
	// -test.run keeps a test binary without the worker hook from running
	// its tests (it fails the hello instead).
	w.cmd = exec.Command(p.opts.Executable, "-test.run=^$")
	w.cmd.Env = []string{
		fmt.Sprintf("%s=%d", workerEnv, p.opts.MemoryBytes),
		fmt.Sprintf("%s=%d", workerCPUEnv, int64(p.opts.WorkerCPU/time.Second)),
		"GOMAXPROCS=1", "GOTRACEBACK=single",
	}
	w.cmd.Dir = "/"
	w.cmd.Stdin, w.cmd.Stdout, w.cmd.Stderr = inR, outW, w.stderr
	w.cmd.SysProcAttr = procAttr()
	err = w.cmd.Start()
	inR.Close()
	outW.Close()
	if err != nil {
		inW.Close()
		outR.Close()
		return nil, fmt.Errorf("starting a routine worker: %w", err)
	}
	w.w = bufio.NewWriterSize(inW, 16<<10)
	w.r = bufio.NewReaderSize(outR, 16<<10)
	p.started.Add(1)
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		_ = w.cmd.Process.Kill()
		w.wait()
		return nil, errors.New("the routine pool is closed")
	}
	p.live[w] = struct{}{}
	p.mu.Unlock()
	hello := time.AfterFunc(30*time.Second, func() { _ = w.cmd.Process.Kill() })
	typ, _, err := readFrame(w.r, frameSlack)
	hello.Stop()
	w.born = time.Now()
	w.startTook = w.born.Sub(launched)
	if err != nil || typ != frameHello {
		_ = w.cmd.Process.Kill()
		p.reap(w)
		if err == nil {
			err = fmt.Errorf("frame %q instead of hello", typ)
		}
		return nil, fmt.Errorf("the routine worker %s did not start (does its main call routine.ServeWorker?): %w %s", p.opts.Executable, err, strings.TrimSpace(w.stderr.String()))
	}
	return w, nil
}

// reap waits for a dead or killed worker and forgets it.
func (p *Pool) reap(w *worker) {
	w.wait()
	if ps := w.cmd.ProcessState; ps != nil {
		rss := peakRSS(ps)
		for {
			old := p.peakRSS.Load()
			if rss <= old || p.peakRSS.CompareAndSwap(old, rss) {
				break
			}
		}
	}
	p.mu.Lock()
	delete(p.live, w)
	p.mu.Unlock()
}

// remoteProgram is a program compiled in the pool's workers.
type remoteProgram struct {
	key, name            string
	def                  [][]byte // the P frame's fields
	tools                map[string]Tool
	callables, functions []string
}

func newRemoteProgram(name, src string, tools map[string]Tool, l Limits) *remoteProgram {
	lim := slices.Concat(putInt(int64(l.MaxSteps)), putInt(int64(l.Timeout)), putInt(int64(l.MaxOutputBytes)), putInt(int64(l.MaxToolCalls)), putInt(l.MaxAllocBytes))
	h := sha256.New()
	def := [][]byte{nil, []byte(name), []byte(src), lim}
	for _, f := range def[1:] {
		fmt.Fprintf(h, "%d:%s", len(f), f)
	}
	for _, tname := range slices.Sorted(mapKeys(tools)) {
		t := tools[tname]
		kind, entries := "f", ""
		if t.table != nil {
			kind, entries = "t", *t.table
		}
		def = append(def, []byte(tname), []byte(kind), []byte(entries))
		fmt.Fprintf(h, "%d:%s%s%d:%s", len(tname), tname, kind, len(entries), entries)
	}
	key := fmt.Sprintf("%x", h.Sum(nil))
	def[0] = []byte(key)
	return &remoteProgram{key: key, name: name, def: def, tools: tools}
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// deathError explains a run whose worker died or was killed.
func (p *Pool) deathError(w *worker, budget time.Duration, ioErr error) error {
	if big, ok := errors.AsType[*frameTooLargeError](ioErr); ok {
		_ = w.cmd.Process.Kill()
		return &failure{kind: KindOutput, err: fmt.Errorf("%w: the routine's worker sent %s allowed by its limits, and was killed", ErrBudget, big.Error())}
	}
	if w.killed.Load() {
		return &failure{kind: KindTime, err: fmt.Errorf("%w: wall time budget exceeded: the run was killed %v past its budget of %v", ErrBudget, p.opts.KillMargin, budget)}
	}
	_ = w.cmd.Process.Kill()
	w.wait() // its stderr is complete once it is reaped
	why := strings.TrimSpace(w.stderr.String())
	if first, _, ok := strings.Cut(why, "\n"); ok {
		why = first
	}
	if strings.Contains(why, cpuDeath) {
		return &failure{kind: KindTime, err: fmt.Errorf("%w: CPU time budget exceeded: the run used more than %v plus up to 2 s of CPU and was killed", ErrBudget, budget)}
	}
	if isMemoryDeath(why) {
		return &failure{kind: KindMemory, err: fmt.Errorf("%w: the run passed its worker's memory cap of %d MiB and was killed", ErrBudget, p.opts.MemoryBytes>>20)}
	}
	if why == "" && ioErr != nil {
		why = ioErr.Error()
	}
	return &failure{kind: KindError, err: fmt.Errorf("routine worker died: %s", why)}
}

// isMemoryDeath reports whether a worker's dying words say it hit its
// memory cap: the Go runtime's, or under -race the race detector's.
func isMemoryDeath(why string) bool {
	for _, s := range []string{"out of memory", "stack exceeds", "stack overflow", "failed to allocate", "address space"} {
		if strings.Contains(why, s) {
			return true
		}
	}
	return false
}

func splitNames(b []byte) []string {
	if len(b) == 0 {
		return []string{}
	}
	return strings.Split(string(b), "\n")
}
