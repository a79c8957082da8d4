package routine

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"time"
)

// workerEnv, set by the pool in a worker's environment to the worker's
// memory cap in bytes, makes the binary a routine worker.
const workerEnv = "PARLEY_ROUTINE_WORKER"

// workerCPUEnv is the CPU time a worker may use in its life, in seconds
// (PoolOptions.WorkerCPU).
const workerCPUEnv = "PARLEY_ROUTINE_WORKER_CPU"

// cpuDeath is what a worker says on stderr when a run passes its CPU
// limit; the pool reads it to name the kind.
const cpuDeath = "CPU time limit exceeded"

// IsWorker reports whether this process was started by a Pool as a routine
// worker. Every binary that runs a Pool (parley, the dispatcher, and the
// test binaries of the packages that start one, in TestMain) begins its
// main with:
//
//	if routine.IsWorker() {
//		os.Exit(routine.ServeWorker())
//	}
func IsWorker() bool { return os.Getenv(workerEnv) != "" }

// ServeWorker runs this process as a routine worker, on stdin and stdout,
// until stdin closes, and returns the exit code. It first caps its own
// address space (see limitSelf), so nothing the routines do can take more
// memory than the pool allows.
func ServeWorker() int {
	limit, err := strconv.ParseInt(os.Getenv(workerEnv), 10, 64)
	if err != nil || limit <= 0 {
		fmt.Fprintf(os.Stderr, "routine worker: %s must be the memory cap in bytes\n", workerEnv)
		return 2
	}
	// The Go heap collects hard before the cap; stacks are bounded well
	// under it (deep recursion in a builtin dies, it does not grow).
	debug.SetMemoryLimit(limit / 2)
	debug.SetGCPercent(workerGCPercent)
	debug.SetMaxStack(64 << 20)
	if err := limitSelf(limit); err != nil {
		fmt.Fprintf(os.Stderr, "routine worker: %v\n", err)
		return 2
	}
	life, err := strconv.ParseInt(os.Getenv(workerCPUEnv), 10, 64)
	if err != nil || life <= 0 {
		fmt.Fprintf(os.Stderr, "routine worker: %s must be the CPU seconds a worker may use\n", workerCPUEnv)
		return 2
	}
	if err := limitCPU(uint64(life), uint64(life)); err != nil {
		fmt.Fprintf(os.Stderr, "routine worker: %v\n", err)
		return 2
	}
	exitOnCPULimit()
	in, out, err := workerPipes()
	if err != nil {
		fmt.Fprintf(os.Stderr, "routine worker: %v\n", err)
		return 2
	}
	w := &workerConn{
		r:        bufio.NewReaderSize(in, 64<<10),
		w:        bufio.NewWriterSize(out, 64<<10),
		programs: map[string]*Program{},
		cpuLife:  uint64(life),
		cpuSoft:  uint64(life),
	}
	if err := w.serve(); !errors.Is(err, io.EOF) {
		fmt.Fprintf(os.Stderr, "routine worker: %v\n", err)
		return 1
	}
	return 0
}

// workerGCPercent is the worker's GOGC. A worker's live heap is small (its
// compiled programs), so at the default of 100 it collected every few
// hundred calls, and the collector took about a quarter of its CPU on the
// envelope benchmark. The memory limit above still makes it collect hard
// before the cap, and RLIMIT_AS is the bound either way.
const workerGCPercent = 400

// workerCacheSize bounds the programs a worker keeps compiled; past it the
// worker forgets them all and the pool sends them again (frameUnknown).
const workerCacheSize = 256

type workerConn struct {
	r        *bufio.Reader
	w        *bufio.Writer
	queued   []frame // P and C frames read while a call waited for a tool's answer
	programs map[string]*Program
	cpuLife  uint64        // the hard RLIMIT_CPU, seconds
	cpuSoft  uint64        // the soft RLIMIT_CPU set last, seconds
	cpu      time.Duration // the CPU used at the end of the last run
	wall     wallTimer     // the runs' wall-time timer, one run at a time
}

// armCPU sets the soft CPU limit so that the run about to start can use
// at most budget plus one to two seconds of CPU (RLIMIT_CPU counts whole
// seconds): past it the kernel sends SIGXCPU and the worker exits
// (exitOnCPULimit). The wall-time kill normally comes first; this bound
// is the kernel's, and holds even if the server cannot kill in time. The
// soft limit never passes the hard one, the worker's whole life (the pool
// replaces a worker at half of it).
//
// It costs no system call in most runs: the CPU used is the figure read at
// the end of the last run (the worker uses none while it waits), and the
// limit, in whole seconds, changes about once per second of CPU.
func (c *workerConn) armCPU(budget time.Duration) {
	soft := min(uint64((c.cpu+budget+time.Second-1)/time.Second)+1, c.cpuLife)
	if soft != c.cpuSoft && limitCPU(soft, c.cpuLife) == nil {
		c.cpuSoft = soft
	}
}

// usedCPU reads the CPU used so far, for the pool and the next armCPU.
func (c *workerConn) usedCPU() []byte {
	c.cpu = cpuUsed()
	return putInt(int64(c.cpu))
}

// frame is a frame read ahead.
type frame struct {
	typ byte
	f   [][]byte
}

func (c *workerConn) serve() error {
	if err := writeFrame(c.w, frameHello); err != nil {
		return err
	}
	for {
		var typ byte
		var f [][]byte
		if len(c.queued) > 0 {
			typ, f = c.queued[0].typ, c.queued[0].f
			c.queued = c.queued[1:]
		} else {
			var err error
			if typ, f, err = readFrame(c.r, maxFrame); err != nil {
				return err
			}
		}
		var err error
		switch typ {
		case frameProgram:
			err = c.compile(f)
		case frameCall:
			err = c.call(f)
		default:
			err = fmt.Errorf("unexpected frame %q", typ)
		}
		if err != nil {
			return err
		}
	}
}

// compile handles P: key name src limits (tool name, kind, table)….
func (c *workerConn) compile(f [][]byte) error {
	if len(f) < 4 || (len(f)-4)%3 != 0 {
		return errBadFrame
	}
	key, name, src, lim := string(f[0]), string(f[1]), string(f[2]), f[3]
	if len(lim) != 40 {
		return errBadFrame
	}
	limits := Limits{
		MaxSteps:       uint64(getInt(lim[0:8])),
		Timeout:        time.Duration(getInt(lim[8:16])),
		MaxOutputBytes: int(getInt(lim[16:24])),
		MaxToolCalls:   int(getInt(lim[24:32])),
		MaxAllocBytes:  getInt(lim[32:40]),
	}
	c.armCPU(limits.Timeout)
	tools := map[string]Tool{}
	for i := 4; i < len(f); i += 3 {
		tname, kind, entries := string(f[i]), f[i+1], string(f[i+2])
		if string(kind) == "t" {
			t, err := TableTool(entries)
			if err != nil {
				return c.fail(err)
			}
			tools[tname] = t
		} else {
			tools[tname] = FuncTool(c.toolStub(tname))
		}
	}
	p, err := compileLocal(context.Background(), name, src, tools, limits)
	if err != nil {
		return c.fail(err)
	}
	if len(c.programs) >= workerCacheSize {
		clear(c.programs)
	}
	c.programs[key] = p
	c.usedCPU() // top-level code ran: the next armCPU counts it
	return c.answer(frameCompiled, []byte(strings.Join(sortedCallables(p), "\n")), []byte(strings.Join(p.functions(), "\n")))
}

// answer writes an answer to the pool, stamped with the time: the start
// of the next frame, if the pool has written it already (see wire.go).
func (c *workerConn) answer(typ byte, fields ...[]byte) error {
	return writeFrame(c.w, typ, append(fields, putInt(time.Now().UnixNano()))...)
}

// toolStub is a tool answered by the pool: the call goes to the parent as
// T and waits for its R.
func (c *workerConn) toolStub(name string) func(context.Context, json.RawMessage) (json.RawMessage, error) {
	return func(_ context.Context, arg json.RawMessage) (json.RawMessage, error) {
		if err := writeFrame(c.w, frameTool, []byte(name), arg); err != nil {
			return nil, err
		}
		typ, f, err := readFrame(c.r, maxFrame)
		for err == nil && (typ == frameCall || typ == frameProgram) {
			// The pool's next frames, written while this call runs.
			c.queued = append(c.queued, frame{typ, f})
			typ, f, err = readFrame(c.r, maxFrame)
		}
		if err != nil {
			return nil, err
		}
		if typ != frameToolDone || len(f) != 2 || len(f[0]) != 1 {
			return nil, errBadFrame
		}
		if f[0][0] == 0 {
			return nil, errors.New(string(f[1]))
		}
		if len(f[1]) == 0 {
			return nil, nil
		}
		return json.RawMessage(f[1]), nil
	}
}

// call handles C: key fn deadline startBy hasMem mem args….
func (c *workerConn) call(f [][]byte) error {
	if len(f) < 6 || len(f[4]) != 1 {
		return errBadFrame
	}
	p := c.programs[string(f[0])]
	if p == nil {
		return c.answer(frameUnknown)
	}
	now := time.Now()
	if startBy := getInt(f[3]); startBy > 0 && now.UnixNano() > startBy {
		return c.answer(frameBusy) // it waited its budget behind other calls
	}
	ctx := context.Background()
	budget := p.limits.Timeout
	if dl := getInt(f[2]); dl > 0 {
		ctx = deadlineCtx{ctx, time.Unix(0, dl)}
		budget = min(budget, time.Unix(0, dl).Sub(now))
	}
	c.armCPU(budget)
	var memory json.RawMessage
	if f[4][0] == 1 {
		memory = json.RawMessage(f[5])
	}
	args := make([]json.RawMessage, 0, len(f)-6)
	for _, a := range f[6:] {
		args = append(args, json.RawMessage(a))
	}
	out, mem, err := p.callLocal(ctx, string(f[1]), args, memory, &c.wall)
	if err != nil {
		return c.fail(err)
	}
	return c.answer(frameDone, out, putBool(mem != nil), mem, c.usedCPU())
}

// deadlineCtx carries the caller's deadline into a run in a worker
// without a timer of its own (context.WithDeadline arms one per call):
// in a worker only newThread reads it, and its wall-time timer ends the
// run at the deadline when that comes before the budget. Nothing in a
// worker waits on Done: its tools are tables and stubs answered by the
// pool, which cancels the caller's side.
type deadlineCtx struct {
	context.Context
	dl time.Time
}

func (c deadlineCtx) Deadline() (time.Time, bool) { return c.dl, true }

func (c *workerConn) fail(err error) error {
	err = classify(err)
	msg := err.Error()
	if len(msg) > maxErrorText {
		msg = strings.ToValidUTF8(msg[:maxErrorText], "") + "…"
	}
	return c.answer(frameError, []byte{byte(KindOf(err))}, []byte(msg), c.usedCPU())
}
