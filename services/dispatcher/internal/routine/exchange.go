package routine

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// exchange is a frame written to a worker that awaits its answer: a
// program (P, answered K or E) or a call (C, answered D, E, U or B, with
// the call's tool calls, T, on the way).
type exchange struct {
	call     bool          // a call: T frames are its tool calls
	budget   time.Duration // the run's wall-time budget
	deadline time.Time     // the caller's deadline; zero for none
	limit    int           // the largest frame its answers may be
	out      chan answer   // the lead, or its answer when the worker died
	leading  bool          // it reads the worker's frames (await)
	sent     int64         // when it was queued, Unix ns
	ran      time.Duration // the budget the kill was armed with
}

// answer is a frame from a worker, or why none will come.
type answer struct {
	typ  byte
	f    [][]byte
	err  error // the worker died: the run's error, or errRequeue
	lead bool  // the exchange is the oldest pending: it reads the frames
}

// errRequeue is an exchange whose worker died before it started: it ran
// nowhere and may be sent again.
var errRequeue = errors.New("the routine's worker died before the call started")

// errUnknown is a call of a program its worker no longer holds.
var errUnknown = errors.New("the routine's worker does not hold the program")

// answerFields is how many fields an answer of type typ has before the
// time stamp the worker adds (stamp); ok is false for a type that is no
// answer.
func answerFields(typ byte) (n int, ok bool) {
	switch typ {
	case frameDone:
		return 4, true
	case frameError:
		return 3, true
	case frameCompiled:
		return 2, true
	case frameUnknown, frameBusy:
		return 0, true
	}
	return 0, false
}

// arm arms ex's kill: its budget (or what is left before the caller's
// deadline, if less) plus the margin, from its start, lag ago. Called with
// w.mu held, when ex is the first pending exchange.
//
// A worker has one kill timer, reset for each exchange as it starts (a
// timer per call cost an allocation and a timer-heap insert and delete
// on every call).
func (p *Pool) arm(w *worker, ex *exchange, lag time.Duration) {
	ex.ran = ex.budget
	if !ex.deadline.IsZero() {
		ex.ran = min(ex.ran, max(time.Until(ex.deadline), time.Millisecond))
	}
	now := time.Now()
	w.headStart.Store(now.UnixNano() - int64(lag))
	d := max(ex.ran+p.opts.KillMargin-lag, 0)
	w.killEx, w.killAt = ex, now.Add(d)
	if w.kill == nil {
		w.kill = time.AfterFunc(d, func() { w.killHead() })
	} else {
		w.kill.Reset(d)
	}
}

// disarm stops the kill timer: no exchange is running. Called with w.mu
// held.
func (w *worker) disarm() {
	if w.kill != nil {
		w.kill.Stop()
	}
	w.killEx = nil
}

// killHead kills the worker if the exchange its timer was armed for is
// still running and past its time. The timer may have fired for an
// exchange that has since been answered, with the next one armed while
// this waited for the lock: killAt tells them apart.
func (w *worker) killHead() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.killEx != nil && len(w.pending) > 0 && w.pending[0] == w.killEx && !time.Now().Before(w.killAt) {
		w.killed.Store(true)
		_ = w.cmd.Process.Kill()
	}
}

// await returns ex's next frame: a tool call, or its answer. The oldest
// pending exchange reads the worker's frames itself (they are all its
// own), so a call alone on its worker is woken by the pipe directly, as
// with no pipelining; when it has its answer it hands the reading to the
// next one.
func (p *Pool) await(w *worker, ex *exchange) answer {
	if !ex.leading {
		a := <-ex.out
		if !a.lead {
			return a
		}
		ex.leading = true
	}
	typ, f, err := readFrameLimit(w.r, func() int { return ex.limit })
	if err == nil && typ == frameTool {
		if ex.call {
			return answer{typ: typ, f: f}
		}
		err = errBadFrame
	}
	var at int64
	if err == nil {
		n, ok := answerFields(typ)
		switch {
		case !ok || !answers(ex, typ) || len(f) < n || len(f) > n+1:
			err = errBadFrame
		case len(f) == n+1:
			at, f = getInt(f[n]), f[:n]
		}
	}
	if err != nil {
		p.fail(w, err)
		return <-ex.out
	}
	w.mu.Lock()
	if w.killed.Load() { // its answer came too late
		w.mu.Unlock()
		p.fail(w, nil)
		return <-ex.out
	}
	w.pending[0] = nil
	w.pending = w.pending[1:]
	switch typ {
	case frameDone:
		w.cpu.Store(getInt(f[3]))
	case frameError:
		w.cpu.Store(getInt(f[2]))
	}
	if len(w.pending) > 0 {
		// The worker started the next exchange when it wrote this answer,
		// or when the exchange was written to it if that came later.
		next, lag := w.pending[0], time.Duration(0)
		if at > 0 {
			lag = min(max(time.Duration(time.Now().UnixNano()-max(at, next.sent)), 0), next.budget)
		}
		p.arm(w, next, lag)
		next.out <- answer{lead: true}
	} else {
		w.disarm()
		w.headStart.Store(0)
	}
	w.mu.Unlock()
	return answer{typ: typ, f: f}
}

// answers reports whether typ answers ex.
func answers(ex *exchange, typ byte) bool {
	if ex.call {
		return typ == frameDone || typ == frameError || typ == frameUnknown || typ == frameBusy
	}
	return typ == frameCompiled || typ == frameError
}

// fail ends a dead or killed worker: the running exchange gets the
// reason (deathError), those queued behind it errRequeue.
func (p *Pool) fail(w *worker, ioErr error) {
	w.mu.Lock()
	w.dead.Store(true)
	pending := w.pending
	w.pending = nil
	w.disarm()
	w.mu.Unlock()
	var headErr error
	if len(pending) > 0 {
		headErr = p.deathError(w, pending[0].ran, ioErr)
		p.kills[KindOf(headErr)].Add(1)
	}
	_ = w.cmd.Process.Kill()
	p.reap(w)
	for i, ex := range pending {
		if i == 0 {
			ex.out <- answer{err: headErr}
		} else {
			ex.out <- answer{err: errRequeue}
		}
	}
}

// queue writes to w the program rp unless w holds it (or force), then the
// call c unless it is nil, and adds their exchanges to w's pending ones,
// in one piece: answers come back in the order of pending. It returns the
// program's exchange when it wrote the program.
func (p *Pool) queue(w *worker, rp *remoteProgram, l Limits, deadline time.Time, force bool, c *exchange, fields [][]byte) (*exchange, error) {
	w.wmu.Lock()
	defer w.wmu.Unlock()
	w.mu.Lock()
	if w.dead.Load() {
		w.mu.Unlock()
		return nil, errRequeue
	}
	var load *exchange
	if force || !w.known[rp.key] {
		// Its answer lists the program's global names, each in its source.
		load = &exchange{budget: l.Timeout, deadline: deadline, limit: 4*len(rp.def[2]) + frameSlack, out: make(chan answer, 1)}
		if len(w.known) >= workerCacheSize {
			clear(w.known)
		}
		w.known[rp.key] = true
	}
	for _, ex := range []*exchange{load, c} {
		if ex == nil {
			continue
		}
		ex.sent = time.Now().UnixNano()
		if len(w.pending) == 0 {
			p.arm(w, ex, 0)
			ex.leading = true
		}
		w.pending = append(w.pending, ex)
	}
	w.mu.Unlock()
	var err error
	if load != nil {
		err = putFrame(w.w, frameProgram, rp.def...)
	}
	if c != nil && err == nil {
		err = putFrame(w.w, frameCall, fields...)
	}
	if err == nil {
		err = w.w.Flush()
	}
	if err != nil {
		_ = w.cmd.Process.Kill() // its reader fails what it holds
	}
	return load, nil
}

// forget marks the program key as not held by w.
func (w *worker) forget(key string) {
	w.mu.Lock()
	delete(w.known, key)
	w.mu.Unlock()
}

// loaded waits for the answer to a program w was sent; with force
// (Compile) it reads the program's names from it.
func (p *Pool) loaded(w *worker, rp *remoteProgram, ex *exchange, force bool) error {
	a := p.await(w, ex)
	switch {
	case a.err != nil:
		return a.err
	case a.typ == frameCompiled:
		if force { // Compile: the program is not shared yet
			rp.callables = splitNames(a.f[0])
			rp.functions = splitNames(a.f[1])
		}
		return nil
	}
	w.forget(rp.key)
	return p.remoteError(w, ex, a.f)
}

// remoteError reads a worker's E frame: kind, message, CPU used.
func (p *Pool) remoteError(w *worker, ex *exchange, f [][]byte) error {
	if len(f[0]) != 1 {
		return p.badFrame(w, ex)
	}
	return &failure{kind: Kind(f[0][0]), err: errors.New(string(f[1]))}
}

// badFrame kills a worker that broke the protocol during ex.
func (p *Pool) badFrame(w *worker, ex *exchange) error {
	err := p.deathError(w, ex.ran, errBadFrame)
	p.kills[KindOf(err)].Add(1)
	return err
}

// compile compiles and initialises a program in a worker.
func (p *Pool) compile(ctx context.Context, name, src string, tools map[string]Tool, l Limits) (*Program, error) {
	prog := newRemoteProgram(name, src, tools, l)
	until := time.Now().Add(l.Timeout)
	deadline, _ := ctx.Deadline()
	for {
		w, err := p.acquire(ctx, agentOf(ctx, name), until, l.Timeout)
		if err != nil {
			return nil, err
		}
		load, err := p.queue(w, prog, l, deadline, true, nil, nil)
		if err == nil {
			err = p.loaded(w, prog, load, true)
		}
		p.release(w)
		if errors.Is(err, errRequeue) {
			if time.Now().Before(until) {
				continue
			}
			return nil, p.requeueBusy(l)
		}
		if err != nil {
			return nil, err
		}
		return &Program{limits: l, remote: prog}, nil
	}
}

// requeueBusy is the error of a run whose workers died before it started
// until its wait budget was spent.
func (p *Pool) requeueBusy(l Limits) error {
	return fmt.Errorf("%w: %w: the run's workers died before it started, for %v", ErrBudget, ErrBusy, l.Timeout)
}

// call runs fn of prog in a worker, answering its tool calls.
func (p *Pool) call(ctx context.Context, prog *Program, fn string, args []json.RawMessage, memory json.RawMessage) (out, newMemory json.RawMessage, err error) {
	rp, l := prog.remote, prog.limits
	// A call waits at most its budget for room on a worker, and the
	// worker answers it busy rather than start it later (it may be
	// queued behind the agent's other calls).
	until := time.Now().Add(l.Timeout)
	deadline, _ := ctx.Deadline()
	var dl int64
	if !deadline.IsZero() {
		dl = deadline.UnixNano()
	}
	// deadline and startBy share one buffer; startBy is rewritten in
	// place for each try (a frame is copied out when it is written).
	times := make([]byte, 16)
	binary.LittleEndian.PutUint64(times[:8], uint64(dl))
	fields := make([][]byte, 0, 6+len(args))
	fields = append(fields, rp.def[0], []byte(fn), times[:8:8], times[8:16:16], putBool(memory != nil), memory)
	for _, a := range args {
		fields = append(fields, a)
	}
	agent := agentOf(ctx, rp.name)
	for evicted := false; ; {
		asked := time.Now()
		w, err := p.acquire(ctx, agent, until, l.Timeout)
		if err != nil {
			return nil, nil, err
		}
		// A worker started for this call (by it, or in the background
		// while it waited for the slot) took the pool's time, not other
		// calls': its start does not count against the wait budget.
		startBy := until
		if w.born.After(asked) {
			startBy = until.Add(w.startTook)
		}
		binary.LittleEndian.PutUint64(fields[3], uint64(startBy.UnixNano()))
		out, newMemory, err = p.callOn(ctx, w, rp, l, deadline, fields)
		p.release(w)
		switch {
		case errors.Is(err, errUnknown) && !evicted: // evicted: send it again
			evicted = true
			continue
		case errors.Is(err, errUnknown):
			return nil, nil, errBadFrame
		case errors.Is(err, errRequeue) && time.Now().Before(until):
			continue
		case errors.Is(err, errRequeue):
			return nil, nil, p.requeueBusy(l)
		}
		return out, newMemory, err
	}
}

// callOn sends a call to w (and its program, unless w holds it) and waits
// for its answer, answering its tool calls.
func (p *Pool) callOn(ctx context.Context, w *worker, rp *remoteProgram, l Limits, deadline time.Time, fields [][]byte) (out, newMemory json.RawMessage, err error) {
	// A result and memory, or a tool's name and argument, each at most
	// the output cap.
	c := &exchange{call: true, budget: l.Timeout, deadline: deadline, limit: 2*l.MaxOutputBytes + frameSlack, out: make(chan answer, 2)}
	load, err := p.queue(w, rp, l, deadline, false, c, fields)
	if err != nil {
		return nil, nil, err
	}
	if load != nil {
		if err := p.loaded(w, rp, load, false); err != nil {
			p.await(w, c) // it was not run: U, or the worker died
			return nil, nil, err
		}
	}
	for {
		a := p.await(w, c)
		if a.err != nil {
			return nil, nil, a.err
		}
		f := a.f
		switch a.typ {
		case frameDone: // out hasMem mem cpu
			if len(f[1]) != 1 {
				return nil, nil, p.badFrame(w, c)
			}
			if f[1][0] == 1 {
				newMemory = json.RawMessage(f[2])
			}
			return json.RawMessage(f[0]), newMemory, nil
		case frameError:
			return nil, nil, p.remoteError(w, c, f)
		case frameUnknown:
			w.forget(rp.key)
			return nil, nil, errUnknown
		case frameBusy:
			return nil, nil, fmt.Errorf("%w: %w: the call waited behind this agent's other calls for more than its budget of %v", ErrBudget, ErrBusy, l.Timeout)
		case frameTool:
			if len(f) != 2 {
				return nil, nil, p.badFrame(w, c)
			}
			p.answerTool(ctx, w, rp, f[0], f[1])
		}
	}
}

// answerTool runs a tool call of a running call and writes its answer.
func (p *Pool) answerTool(ctx context.Context, w *worker, rp *remoteProgram, name, arg []byte) {
	t, ok := rp.tools[string(name)]
	var res json.RawMessage
	var terr error
	if !ok || t.call == nil {
		terr = fmt.Errorf("no tool %q", name)
	} else {
		res, terr = t.call(ctx, json.RawMessage(arg))
	}
	w.wmu.Lock()
	defer w.wmu.Unlock()
	var err error
	if terr != nil {
		err = writeFrame(w.w, frameToolDone, putBool(false), []byte(terr.Error()))
	} else {
		err = writeFrame(w.w, frameToolDone, putBool(true), res)
	}
	if err != nil {
		_ = w.cmd.Process.Kill() // its reader fails the call
	}
}
