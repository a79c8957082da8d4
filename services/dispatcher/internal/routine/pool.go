package routine

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/json"
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
// Fair shares: an agent holds at most PoolOptions.AgentShare workers at
// once; its further calls wait for its own share (never for another
// agent's) up to their wall-time budget, then fail with ErrBusy.

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
	// AgentShare is the most workers one agent holds at once; when 0,
	// three quarters of the workers (at least 1), so that a quarter (at
	// least one worker when there are two or more) stays free for the
	// other agents whatever one agent does.
	AgentShare int
	// MemoryBytes caps each worker's memory above its start size.
	MemoryBytes int64
	// KillMargin is how long past its budget a run may go before its
	// worker is killed.
	KillMargin time.Duration
	// InProcess runs routines in this process, with the in-process guards
	// only and no hard boundary (for the guards' own tests).
	InProcess bool
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

// Pool runs routines: in worker processes behind the hard boundary, or in
// process (PoolOptions.InProcess). Close it to stop the workers.
type Pool struct {
	opts PoolOptions
	idle chan *worker // one entry per worker slot; nil is a slot not started

	mu     sync.Mutex // guards agents, live and closed
	agents map[string]*agentShare
	live   map[*worker]struct{}
	closed bool

	started  atomic.Int64
	recycled atomic.Int64
	kills    [KindSteps + 1]atomic.Int64
	peakRSS  atomic.Int64
}

type agentShare struct {
	sem   chan struct{}
	users int
}

// NewPoolWith returns a pool configured by o. Workers start on first use.
func NewPoolWith(o PoolOptions) *Pool {
	if o.AgentShare <= 0 {
		o.AgentShare = max(o.Workers-o.Workers/4, 1)
		if o.Workers >= 2 {
			o.AgentShare = min(o.AgentShare, o.Workers-1)
		}
	}
	o.WorkerCPU = o.WorkerCPU.Round(time.Second) // RLIMIT_CPU counts seconds
	if o.Executable == "" {
		o.Executable = "/proc/self/exe"
	}
	p := &Pool{opts: o, idle: make(chan *worker, o.Workers), agents: map[string]*agentShare{}, live: map[*worker]struct{}{}}
	for range o.Workers {
		p.idle <- nil
	}
	return p
}

// Options returns the pool's options (AgentShare as NewPoolWith derived
// it, WorkerCPU rounded to seconds).
func (p *Pool) Options() PoolOptions { return p.opts }

func (p *Pool) remote() bool { return p != nil && !p.opts.InProcess }

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

// acquire takes a slot of agent's share, then a worker slot, waiting at
// most wait in all or until ctx ends; w is nil when the slot's worker is
// not started. A ctx that ends first is the caller's error, not the pool's.
func (p *Pool) acquire(ctx context.Context, agent string, wait time.Duration) (w *worker, release func(*worker), err error) {
	p.mu.Lock()
	sh := p.agents[agent]
	if sh == nil {
		sh = &agentShare{sem: make(chan struct{}, p.opts.AgentShare)}
		p.agents[agent] = sh
	}
	sh.users++
	p.mu.Unlock()
	leave := func() {
		p.mu.Lock()
		if sh.users--; sh.users == 0 {
			delete(p.agents, agent)
		}
		p.mu.Unlock()
	}
	var timer *time.Timer
	timeout := func() <-chan time.Time {
		if timer == nil {
			timer = time.NewTimer(wait)
		}
		return timer.C
	}
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	select {
	case sh.sem <- struct{}{}:
	default:
		select {
		case sh.sem <- struct{}{}:
		case <-timeout():
			leave()
			return nil, nil, fmt.Errorf("%w: %w: this agent's %d routine workers stayed busy for %v", ErrBudget, ErrBusy, p.opts.AgentShare, wait)
		case <-ctx.Done():
			leave()
			return nil, nil, fmt.Errorf("waiting for a routine worker: %w", context.Cause(ctx))
		}
	}
	select {
	case w = <-p.idle:
	default:
		select {
		case w = <-p.idle:
		case <-timeout():
			<-sh.sem
			leave()
			return nil, nil, fmt.Errorf("%w: %w: all %d routine workers stayed busy for %v", ErrBudget, ErrBusy, p.opts.Workers, wait)
		case <-ctx.Done():
			<-sh.sem
			leave()
			return nil, nil, fmt.Errorf("waiting for a routine worker: %w", context.Cause(ctx))
		}
	}
	return w, func(w *worker) {
		p.idle <- w
		<-sh.sem
		leave()
	}, nil
}

// worker is one worker process. Only the run holding it uses it.
type worker struct {
	cmd    *exec.Cmd
	in     *os.File
	w      *bufio.Writer
	r      *bufio.Reader
	stderr *headBuffer
	known  map[string]bool // programs the worker holds
	limit  int             // the largest frame the current exchange may read
	cpu    time.Duration   // the CPU time it said it has used
	killed atomic.Bool     // killed at a run's deadline
	dead   bool            // its pipe broke: reap it

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

// retire reaps w and puts a fresh worker (or an empty slot) back in the
// pool, in the background, then releases the caller's share.
func (p *Pool) retire(w *worker, release func(*worker)) {
	if !w.killed.Load() {
		_ = w.cmd.Process.Kill()
	}
	p.reap(w)
	go func() {
		nw, err := p.start()
		if err != nil {
			nw = nil // the next run starts one and reports the error
		}
		release(nw)
	}()
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

// run is one exchange with a worker, under the boundary: it takes a worker
// (starting one if needed), arms the kill at budget plus the margin, and
// hands it to do. A worker that dies or is killed is replaced.
func (p *Pool) run(ctx context.Context, name string, l Limits, do func(w *worker, deadline time.Duration) error) error {
	w, release, err := p.acquire(ctx, agentOf(ctx, name), l.Timeout)
	if err != nil {
		return err
	}
	if w != nil && w.cpu+l.Timeout+3*time.Second > p.opts.WorkerCPU {
		// Too little of its life's CPU is left for this run (its budget
		// plus the soft limit's two seconds, and one to spare): the
		// kernel would kill it mid-run.
		p.recycled.Add(1)
		_ = w.cmd.Process.Kill()
		p.reap(w)
		w = nil
	}
	if w == nil {
		if w, err = p.start(); err != nil {
			release(nil)
			return err
		}
	}
	budget, deadline := l.Timeout, time.Duration(0)
	if dl, ok := ctx.Deadline(); ok {
		if left := time.Until(dl); left < budget {
			budget, deadline = max(left, time.Millisecond), max(left, time.Millisecond)
		}
	}
	kill := time.AfterFunc(budget+p.opts.KillMargin, func() {
		w.killed.Store(true)
		_ = w.cmd.Process.Kill()
	})
	err = do(w, deadline)
	stopped := kill.Stop()
	if !w.dead && stopped {
		if w.cpu < p.opts.WorkerCPU/2 {
			release(w)
		} else { // worn: replace it long before its hard CPU limit
			p.recycled.Add(1)
			p.retire(w, release)
		}
		return err
	}
	// The worker was killed or broke: the run's error says why.
	if w.dead || err != nil {
		err = p.deathError(w, budget, err)
		p.kills[KindOf(err)].Add(1)
	}
	p.retire(w, release)
	return err
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

// load sends prog to w unless w holds it, and reads the verdict.
// With force it sends it anyway (Compile, which reads the function names).
func (p *Pool) load(w *worker, prog *remoteProgram, force bool) error {
	if w.known[prog.key] && !force {
		return nil
	}
	// Its answer lists the program's global names, each in its source.
	w.limit = 4*len(prog.def[2]) + frameSlack
	if err := w.send(frameProgram, prog.def...); err != nil {
		return err
	}
	typ, f, err := w.recv()
	if err != nil {
		return err
	}
	switch {
	case typ == frameCompiled && len(f) == 2:
		if force { // Compile: the program is not shared yet
			prog.callables = splitNames(f[0])
			prog.functions = splitNames(f[1])
		}
		if len(w.known) >= workerCacheSize {
			clear(w.known)
		}
		w.known[prog.key] = true
		return nil
	case typ == frameError:
		return w.remoteError(f)
	}
	w.dead = true
	return errBadFrame
}

func splitNames(b []byte) []string {
	if len(b) == 0 {
		return []string{}
	}
	return strings.Split(string(b), "\n")
}

func (w *worker) send(typ byte, fields ...[]byte) error {
	if err := writeFrame(w.w, typ, fields...); err != nil {
		w.dead = true
		return err
	}
	return nil
}

func (w *worker) recv() (byte, [][]byte, error) {
	typ, f, err := readFrame(w.r, w.limit)
	if err != nil {
		w.dead = true
	}
	return typ, f, err
}

// remoteError reads a worker's E frame: kind, message, CPU used.
func (w *worker) remoteError(f [][]byte) error {
	if len(f) != 3 || len(f[0]) != 1 {
		w.dead = true
		return errBadFrame
	}
	w.cpu = time.Duration(getInt(f[2]))
	return &failure{kind: Kind(f[0][0]), err: errors.New(string(f[1]))}
}

// compile compiles and initialises a program in a worker.
func (p *Pool) compile(ctx context.Context, name, src string, tools map[string]Tool, l Limits) (*Program, error) {
	prog := newRemoteProgram(name, src, tools, l)
	err := p.run(ctx, name, l, func(w *worker, _ time.Duration) error { return p.load(w, prog, true) })
	if err != nil {
		return nil, err
	}
	return &Program{limits: l, remote: prog}, nil
}

// call runs fn of prog in a worker, answering its tool calls.
func (p *Pool) call(ctx context.Context, prog *Program, fn string, args []json.RawMessage, memory json.RawMessage) (out, newMemory json.RawMessage, err error) {
	rp := prog.remote
	fields := make([][]byte, 0, 5+len(args))
	fields = append(fields, []byte(rp.key), []byte(fn), nil, putBool(memory != nil), memory)
	for _, a := range args {
		fields = append(fields, a)
	}
	err = p.run(ctx, rp.name, prog.limits, func(w *worker, deadline time.Duration) error {
		fields[2] = putInt(int64(deadline))
		for attempt := 0; ; attempt++ {
			if err := p.load(w, rp, false); err != nil {
				return err
			}
			// A result and memory, or a tool's name and argument, each
			// at most the output cap.
			w.limit = 2*prog.limits.MaxOutputBytes + frameSlack
			if err := w.send(frameCall, fields...); err != nil {
				return err
			}
			var unknown bool
			out, newMemory, unknown, err = p.answer(ctx, w, rp)
			if !unknown || attempt > 0 {
				return err
			}
			delete(w.known, rp.key) // evicted: send it again
		}
	})
	if err != nil {
		return nil, nil, err
	}
	return out, newMemory, nil
}

// answer reads a call's frames until its result, running its tool calls.
func (p *Pool) answer(ctx context.Context, w *worker, rp *remoteProgram) (out, newMemory json.RawMessage, unknown bool, err error) {
	for {
		typ, f, err := w.recv()
		if err != nil {
			return nil, nil, false, err
		}
		switch typ {
		case frameDone: // out hasMem mem cpu
			if len(f) != 4 || len(f[1]) != 1 {
				break
			}
			if f[1][0] == 1 {
				newMemory = json.RawMessage(f[2])
			}
			w.cpu = time.Duration(getInt(f[3]))
			return json.RawMessage(f[0]), newMemory, false, nil
		case frameError:
			return nil, nil, false, w.remoteError(f)
		case frameUnknown:
			return nil, nil, true, errBadFrame
		case frameTool:
			if len(f) != 2 {
				break
			}
			t, ok := rp.tools[string(f[0])]
			var res json.RawMessage
			var terr error
			if !ok || t.call == nil {
				terr = fmt.Errorf("no tool %q", f[0])
			} else {
				res, terr = t.call(ctx, json.RawMessage(f[1]))
			}
			if terr != nil {
				err = w.send(frameToolDone, putBool(false), []byte(terr.Error()))
			} else {
				err = w.send(frameToolDone, putBool(true), res)
			}
			if err != nil {
				return nil, nil, false, err
			}
			continue
		}
		w.dead = true
		return nil, nil, false, errBadFrame
	}
}
