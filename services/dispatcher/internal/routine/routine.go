// Package routine runs Starlark routines in a sandbox: no I/O, no load, only
// the json module and the host functions (tools) the agent declares, with
// budgets on execution steps, wall time, allocation, tool calls and output
// size, and a worker pool that bounds how many run at once.
//
// A Program is compiled and initialised once, then frozen, so calls share no
// mutable state; each call gets its own thread and budgets. Values cross the
// boundary as JSON: arguments are decoded into Starlark values, the result is
// encoded back, with the json module's exact results (codec.go has the fast
// paths).
package routine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	starjson "go.starlark.net/lib/json"
	"go.starlark.net/starlark"
	"go.starlark.net/syntax"
)

// ErrBudget marks a call stopped by one of its budgets.
var ErrBudget = errors.New("routine budget exceeded")

// ErrTimeBudget marks the ErrBudget errors caused by the wall-time budget or
// the caller's deadline (a run stopped, or finished late). Unlike the step
// and allocation budgets, these depend on the machine's load, not only on
// the routine.
var ErrTimeBudget = errors.New("routine time budget exceeded")

// timeBudgetError is an ErrBudget error that also matches ErrTimeBudget,
// keeping the wrapped error's text.
type timeBudgetError struct{ err error }

func (e timeBudgetError) Error() string   { return e.err.Error() }
func (e timeBudgetError) Unwrap() []error { return []error{e.err, ErrTimeBudget} }

// ErrLimits marks Limits with a budget that is not positive. Every budget
// must be set: the dispatcher's config owns their values, and Compile fills
// in none.
var ErrLimits = errors.New("routine limits not set")

// ErrNoPool marks Limits that name no Pool. A routine runs behind the
// worker boundary of a Pool (NewPoolWith) or, in tests only, in process
// (InProcessForTests); never in process by default.
var ErrNoPool = errors.New("routine limits name no pool")

// Limits are a call's budgets, each of which must be positive.
type Limits struct {
	MaxSteps       uint64        // Starlark execution steps
	Timeout        time.Duration // wall time
	MaxOutputBytes int           // encoded result and memory, bytes
	MaxToolCalls   int           // tool calls per run
	MaxAllocBytes  int64         // allocation budget per run (guard.go), bytes
	// Pool runs the routine: its worker processes are the hard boundary
	// and bound concurrent runs (and compiles) across programs. It must be
	// set: Compile refuses nil (ErrNoPool). Only tests may use the pool of
	// InProcessForTests.
	Pool *Pool
}

// Validate returns an ErrLimits error naming every budget of l that is not
// positive.
func (l Limits) Validate() error {
	var unset []string
	for _, b := range []struct {
		name string
		ok   bool
	}{
		{"MaxSteps", l.MaxSteps > 0},
		{"Timeout", l.Timeout > 0},
		{"MaxOutputBytes", l.MaxOutputBytes > 0},
		{"MaxToolCalls", l.MaxToolCalls > 0},
		{"MaxAllocBytes", l.MaxAllocBytes > 0},
	} {
		if !b.ok {
			unset = append(unset, b.name)
		}
	}
	if unset != nil {
		return fmt.Errorf("%w: %s must be positive", ErrLimits, strings.Join(unset, ", "))
	}
	return nil
}

// Tool is a host function a routine can call with one argument. Build one
// with TableTool.
type Tool struct {
	// call answers any argument, encoded as JSON.
	call func(ctx context.Context, arg json.RawMessage) (json.RawMessage, error)
	// callString, when set, answers a string argument as is, sparing the
	// hot path a JSON encode and decode of the key.
	callString func(ctx context.Context, arg string) (json.RawMessage, error)
	// table, for a TableTool, is its entries: a pool's workers build the
	// tool from them and answer it without a round trip.
	table *string
}

// Program is a compiled, initialised and frozen routine.
type Program struct {
	globals starlark.StringDict // in this process
	limits  Limits
	remote  *remoteProgram // in the pool's workers
}

var fileOptions = &syntax.FileOptions{While: true, TopLevelControl: true, GlobalReassign: true}

var (
	jsonEncode = starjson.Module.Members["encode"]
	jsonDecode = starjson.Module.Members["decode"]
)

// localCall is the thread-local key of a call's *callState.
const localCall = "parley.call"

// callState is what tools need of the call that runs them.
type callState struct {
	ctx             context.Context
	toolCalls, max  int64
	alloc, maxAlloc int64 // bytes charged by guard.go, and the budget
	maxArg          int   // a tool argument's largest encoding: the output cap
	expired         atomic.Bool
}

// Compile parses, compiles and initialises src. Top-level code runs under
// the same budgets as a call. Both happen in a worker process of
// limits.Pool, behind its hard boundary (pool.go), or, with the pool of
// InProcessForTests, in this process under the in-process guards only.
// Limits with no pool are refused (ErrNoPool).
func Compile(ctx context.Context, name, src string, tools map[string]Tool, limits Limits) (*Program, error) {
	if err := limits.Validate(); err != nil {
		return nil, err
	}
	if limits.Pool == nil {
		return nil, fmt.Errorf("compile %s: %w: routines run in a worker pool (routine.NewPoolWith)", name, ErrNoPool)
	}
	if limits.Pool.remote() {
		return limits.Pool.compile(ctx, name, src, tools, limits)
	}
	p, err := compileLocal(ctx, name, src, tools, limits)
	return p, classify(err)
}

func compileLocal(ctx context.Context, name, src string, tools map[string]Tool, limits Limits) (*Program, error) {
	predeclared := universeGuards()
	byName := make(map[string]*starlark.Builtin, len(tools))
	for tname, t := range tools {
		b := toolBuiltin(tname, t)
		predeclared[tname] = b
		byName[tname] = b
	}
	if _, taken := predeclared[CallToolName]; !taken {
		predeclared[CallToolName] = callToolBuiltin(byName)
	}
	f, err := fileOptions.Parse(name, src, 0)
	if err == nil {
		err = rewrite(f)
	}
	if err != nil {
		return nil, fmt.Errorf("compile %s: %w", name, err)
	}
	prog, err := starlark.FileProgram(f, predeclared.Has)
	if err != nil {
		return nil, fmt.Errorf("compile %s: %w", name, err)
	}
	thread, st, stop := newThread(ctx, name, limits, nil)
	defer stop()
	globals, err := prog.Init(thread, predeclared)
	if err == nil && st.expired.Load() {
		err = errExpired
	}
	if err != nil {
		return nil, wrapRunErr(err)
	}
	globals.Freeze()
	return &Program{globals: globals, limits: limits}, nil
}

// Has reports whether the routine defines a function fn.
func (p *Program) Has(fn string) bool {
	if p.remote != nil {
		_, ok := slices.BinarySearch(p.remote.callables, fn)
		return ok
	}
	_, ok := p.globals[fn].(starlark.Callable)
	return ok
}

// Functions returns the names of the functions the routine defines, sorted.
func (p *Program) Functions() []string {
	if p.remote != nil {
		return slices.Clone(p.remote.functions)
	}
	return p.functions()
}

// sortedCallables returns the names of the globals a Call can run.
func sortedCallables(p *Program) []string {
	var out []string
	for name, v := range p.globals {
		if _, ok := v.(starlark.Callable); ok {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

func (p *Program) functions() []string {
	var out []string
	for name, v := range p.globals {
		if _, ok := v.(*starlark.Function); ok {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// Call runs fn with args (raw JSON each). When memory is non-nil it is passed
// as a last argument, a mutable dict (empty for "null" or "{}"), and its
// state after the call is returned as newMemory.
func (p *Program) Call(ctx context.Context, fn string, args []json.RawMessage, memory json.RawMessage) (out, newMemory json.RawMessage, err error) {
	if !p.Has(fn) {
		return nil, nil, &failure{kind: KindError, err: fmt.Errorf("the routine defines no function %s", fn)}
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, &failure{kind: KindTime, err: fmt.Errorf("%w: %s", ErrBudget, err.Error())}
	}
	if p.remote != nil {
		return p.limits.Pool.call(ctx, p, fn, args, memory)
	}
	out, newMemory, err = p.callLocal(ctx, fn, args, memory, nil)
	return out, newMemory, classify(err)
}

// callLocal runs fn in this process. wall, when not nil, is the wall-time
// timer to use (a worker's, reused run after run); nil arms one for the
// run.
func (p *Program) callLocal(ctx context.Context, fn string, args []json.RawMessage, memory json.RawMessage, wall *wallTimer) (out, newMemory json.RawMessage, err error) {
	f, ok := p.globals[fn].(starlark.Callable)
	if !ok {
		return nil, nil, fmt.Errorf("the routine defines no function %s", fn)
	}
	thread, st, stop := newThread(ctx, fn, p.limits, wall)
	defer stop()
	sargs := make(starlark.Tuple, 0, len(args)+1)
	for _, a := range args {
		v, err := fromJSON(thread, a)
		if err != nil {
			return nil, nil, err
		}
		sargs = append(sargs, v)
	}
	var mem *starlark.Dict
	if memory != nil {
		mem = starlark.NewDict(0)
		if m := string(memory); m != "" && m != "null" {
			v, err := fromJSON(thread, memory)
			if err != nil {
				return nil, nil, err
			}
			d, ok := v.(*starlark.Dict)
			if !ok {
				return nil, nil, errors.New("conversation memory is not a JSON object")
			}
			mem = d
		}
		sargs = append(sargs, mem)
	}
	res, err := starlark.Call(thread, f, sargs, nil)
	if err != nil {
		return nil, nil, wrapRunErr(err)
	}
	if out, err = p.toJSON(thread, res); err != nil {
		return nil, nil, err
	}
	if mem != nil {
		if newMemory, err = p.toJSON(thread, mem); err != nil {
			return nil, nil, fmt.Errorf("memory: %w", err)
		}
	}
	// A run that finished after its deadline (one long step cannot be
	// interrupted) fails: a late result is never a success.
	if st.expired.Load() {
		return nil, nil, wrapRunErr(errExpired)
	}
	return out, newMemory, nil
}

// newThread returns a thread with the step budget and a timer that cancels it
// at the wall-time budget, or at ctx's deadline when that comes first; stop
// releases the timer. A ctx cancelled without a deadline (a caller gone)
// does not stop a running call: the wall-time budget bounds it anyway, and
// watching ctx costs every call a registration. The timer is wall, when
// not nil, or a new one.
func newThread(ctx context.Context, name string, l Limits, wall *wallTimer) (*starlark.Thread, *callState, func()) {
	thread := &starlark.Thread{
		Name:  name,
		Print: func(*starlark.Thread, string) {}, // print is a no-op: no I/O
		Load: func(*starlark.Thread, string) (starlark.StringDict, error) {
			return nil, errors.New("load is not allowed in routines")
		},
	}
	thread.SetMaxExecutionSteps(l.MaxSteps)
	st := &callState{ctx: ctx, max: int64(l.MaxToolCalls), maxAlloc: l.MaxAllocBytes, maxArg: l.MaxOutputBytes}
	thread.SetLocal(localCall, st)
	timeout, why := l.Timeout, "wall time budget exceeded"
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < timeout {
		timeout, why = time.Until(dl), "request deadline exceeded"
	}
	if wall != nil {
		wall.arm(timeout, thread, st, why)
		return thread, st, wall.stop
	}
	timer := time.AfterFunc(timeout, func() {
		st.expired.Store(true)
		thread.Cancel(why)
	})
	return thread, st, func() { timer.Stop() }
}

// wallTimer is one wall-time timer for runs made one after another (a
// worker's), reset for each: a timer per run cost an allocation and a
// timer-heap insert and delete on every call.
type wallTimer struct {
	mu     sync.Mutex
	t      *time.Timer
	thread *starlark.Thread // the run it is armed for; nil when none
	st     *callState
	why    string
	at     time.Time // when it is due
}

func (w *wallTimer) arm(d time.Duration, thread *starlark.Thread, st *callState, why string) {
	w.mu.Lock()
	w.thread, w.st, w.why, w.at = thread, st, why, time.Now().Add(d)
	w.mu.Unlock()
	if w.t == nil {
		w.t = time.AfterFunc(d, w.fire)
	} else {
		w.t.Reset(d)
	}
}

// fire cancels the run it is armed for. It may run late, for a run that
// has ended, with the next one armed while it waited for the lock: at
// tells them apart.
func (w *wallTimer) fire() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.thread != nil && !time.Now().Before(w.at) {
		w.st.expired.Store(true)
		w.thread.Cancel(w.why)
	}
}

func (w *wallTimer) stop() {
	w.t.Stop()
	w.mu.Lock()
	w.thread, w.st = nil, nil
	w.mu.Unlock()
}

// CallToolName is the builtin every routine has besides json and the tools
// by id: call_tool(name, args) calls the tool named name with one argument,
// the form routines derived by the negotiator use. A tool whose id is
// call_tool shadows it.
const CallToolName = "call_tool"

func callToolBuiltin(tools map[string]*starlark.Builtin) *starlark.Builtin {
	return starlark.NewBuiltin(CallToolName, func(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		var name string
		var arg starlark.Value
		if err := starlark.UnpackPositionalArgs(b.Name(), args, kwargs, 2, &name, &arg); err != nil {
			return nil, err
		}
		t, ok := tools[name]
		if !ok {
			return nil, fmt.Errorf("call_tool: this agent has no tool %q", name)
		}
		return starlark.Call(thread, t, starlark.Tuple{arg}, nil)
	})
}

func toolBuiltin(name string, t Tool) *starlark.Builtin {
	return starlark.NewBuiltin(name, func(thread *starlark.Thread, b *starlark.Builtin, args starlark.Tuple, kwargs []starlark.Tuple) (starlark.Value, error) {
		var arg starlark.Value
		if err := starlark.UnpackPositionalArgs(b.Name(), args, kwargs, 1, &arg); err != nil {
			return nil, err
		}
		st, _ := thread.Local(localCall).(*callState)
		if st == nil {
			return nil, fmt.Errorf("%s: tools can only be called from routine functions", name)
		}
		if atomic.AddInt64(&st.toolCalls, 1) > st.max {
			return nil, fmt.Errorf("%w: more than %d tool calls", ErrBudget, st.max)
		}
		var out json.RawMessage
		var err error
		if str, ok := arg.(starlark.String); ok && t.callString != nil {
			if len(str) > st.maxArg {
				return nil, argTooLarge(name, st.maxArg)
			}
			out, err = t.callString(st.ctx, string(str))
		} else {
			var enc []byte
			enc, err = encodeJSON(thread, arg, st.maxArg)
			if errors.Is(err, errTooLarge) || len(enc) > st.maxArg {
				return nil, argTooLarge(name, st.maxArg)
			}
			if err != nil {
				return nil, err
			}
			out, err = t.call(st.ctx, enc)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		if out == nil {
			return starlark.None, nil
		}
		return fromJSON(thread, out)
	})
}

// argTooLarge is a tool argument past its cap. An argument is something
// the routine sends out, like its result: it gets the output cap.
func argTooLarge(tool string, limit int) error {
	return &failure{kind: KindOutput, err: fmt.Errorf("%w: the argument of tool %s exceeds %d bytes", ErrBudget, tool, limit)}
}

func fromJSON(thread *starlark.Thread, raw json.RawMessage) (starlark.Value, error) {
	if len(raw) == 0 {
		return starlark.None, nil
	}
	return decodeJSON(thread, raw)
}

func (p *Program) toJSON(thread *starlark.Thread, v starlark.Value) (json.RawMessage, error) {
	enc, err := encodeJSON(thread, v, p.limits.MaxOutputBytes)
	if errors.Is(err, errTooLarge) {
		return nil, &failure{kind: KindOutput, err: fmt.Errorf("%w: output exceeds %d bytes", ErrBudget, p.limits.MaxOutputBytes)}
	}
	if errors.Is(err, errTooDeep) {
		return nil, &failure{kind: KindOutput, err: fmt.Errorf("%w: the result is nested deeper than %d levels", ErrBudget, maxFastDepth)}
	}
	if err != nil {
		return nil, fmt.Errorf("the result is not JSON-encodable: %w", wrapRunErr(err))
	}
	if len(enc) > p.limits.MaxOutputBytes {
		return nil, &failure{kind: KindOutput, err: fmt.Errorf("%w: output of %d bytes exceeds %d", ErrBudget, len(enc), p.limits.MaxOutputBytes)}
	}
	return enc, nil
}

// errExpired is a run that completed after its wall-time budget.
var errExpired = errors.New("wall time budget exceeded (the run completed late)")

// wrapRunErr marks cancellations (steps, wall time) as budget errors.
func wrapRunErr(err error) error {
	var ee *starlark.EvalError
	if errors.As(err, &ee) {
		msg := ee.Msg
		if isCancel(msg) {
			return markTime(fmt.Errorf("%w: %s", ErrBudget, msg), msg)
		}
		if errors.Is(err, ErrBudget) {
			k := KindOf(err)
			if k == KindNone {
				k = KindSteps
			}
			return &failure{kind: k, err: fmt.Errorf("routine stopped: %s: %w", strings.TrimSpace(ee.Backtrace()), ErrBudget)}
		}
		return fmt.Errorf("routine error: %s", ee.Backtrace())
	}
	if errors.Is(err, errExpired) || isCancel(err.Error()) {
		return markTime(fmt.Errorf("%w: %s", ErrBudget, err.Error()), err.Error())
	}
	return err
}

// markTime makes err match ErrTimeBudget when msg says the run was stopped
// by its wall time or deadline (the reasons given to thread.Cancel).
func markTime(err error, msg string) error {
	if strings.Contains(msg, "wall time budget exceeded") || strings.Contains(msg, "request deadline exceeded") {
		return timeBudgetError{err}
	}
	return err
}

func isCancel(msg string) bool {
	for _, s := range []string{"too many steps", "wall time budget exceeded", "request deadline exceeded", "Starlark computation cancelled"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}
