// Package hosted keeps the routines and tools of the agents this
// dispatcher hosts: it compiles routines once per version, runs them with
// their failure bookkeeping (quarantine), and installs new ones. Install is
// the one way a routine gets in, whether from SetRoutine, an agreed
// negotiation or a promoted shadow candidate.
package hosted

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/platform/resource"
	"github.com/parleyhq/parley/services/dispatcher/internal/cache"
	"github.com/parleyhq/parley/services/dispatcher/internal/llm"
	"github.com/parleyhq/parley/services/dispatcher/internal/metrics"
	"github.com/parleyhq/parley/services/dispatcher/internal/routine"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

// StepsID is the routine id of an agent's Agent Protocol step routine.
const StepsID = "steps"

// Errors of this package; routine.ErrBusy passes through as is.
var (
	// ErrInvalid: a routine source that does not compile or initialise.
	ErrInvalid = errors.New("the routine does not run")
	// ErrBadInput: the routine failed on input that no schema checked;
	// the sender's fault as far as the dispatcher can tell, so it does not
	// count toward quarantine.
	ErrBadInput = errors.New("the routine could not use the request")
	// ErrBadOutput: the routine's output did not pass Call.Check; it
	// also wraps ErrRoutineFault.
	ErrBadOutput = errors.New("the routine's output does not fit")
	// ErrRoutineFault: the routine failed on its own account (a crash on
	// checked input, a budget, output that does not fit); it counts.
	ErrRoutineFault = errors.New("the routine failed")
)

// Name returns clients/{c}/agents/{a}/routines/{id}.
func Name(agent, id string) string { return agent + "/routines/" + id }

// Agents tells whether an agent is hosted; directory.Directory's Agent
// does.
type Agents interface {
	Exists(ctx context.Context, name string) error
}

// Options configures a Set. QuarantineAfter must be positive:
// the dispatcher's config owns its default and New substitutes none.
type Options struct {
	Limits routine.Limits
	// QuarantineAfter consecutive faults quarantine a routine.
	QuarantineAfter int
	// CacheTTL is how long a compiled routine is used before the store is
	// read again (recompiling only a new version).
	CacheTTL time.Duration
	Now      func() time.Time
	Logger   *slog.Logger
	Metrics  *metrics.Metrics
}

// Set is the hosted agents' routines and tools. It is safe for concurrent
// use.
type Set struct {
	store  store.Store
	agents Agents
	opts   Options
	cache  *cache.Cache[*Routine]

	mu    sync.Mutex // guards byKey and toolChanges
	byKey map[string]*Routine
	// toolChanges counts forgetAgent calls. A compilation notes it before
	// reading the tools and goes into byKey only if no tool changed since:
	// byKey is reused for as long as the routine's version stays, so one
	// built on the old tools would keep them until the routine changed.
	// Per Set, not per agent, as tool changes are rare.
	toolChanges uint64
}

// New returns a Set over st; agents checks that an agent exists before
// anything is installed for it.
func New(st store.Store, agents Agents, opts Options) *Set {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Metrics == nil {
		opts.Metrics = metrics.New(nil)
	}
	return &Set{store: st, agents: agents, opts: opts, cache: cache.New[*Routine](opts.CacheTTL, opts.Now), byKey: map[string]*Routine{}}
}

// Routine is one routine version ready to run. Its program is nil when the
// agent has no such routine.
type Routine struct {
	name       string
	version    int64
	prog       *routine.Program
	compileErr error

	mu          sync.Mutex // guards failures and quarantined
	failures    int32
	quarantined bool
}

// Exists reports whether there is a routine, in any state.
func (r *Routine) Exists() bool { return r != nil && (r.prog != nil || r.compileErr != nil) }

// Usable reports whether the routine exists and is not quarantined.
func (r *Routine) Usable() bool {
	if !r.Exists() {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return !r.quarantined
}

// Quarantined reports whether the routine exists and is quarantined.
func (r *Routine) Quarantined() bool {
	if !r.Exists() {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.quarantined
}

// Ready reports whether the routine is usable and compiled.
func (r *Routine) Ready() bool { return r.Usable() && r.prog != nil }

// Has reports whether the routine compiled and defines fn.
func (r *Routine) Has(fn string) bool { return r != nil && r.prog != nil && r.prog.Has(fn) }

// Get returns agent's routine for id (a PD hash or StepsID); it does not
// Exist when there is none.
func (s *Set) Get(ctx context.Context, agent, id string) (*Routine, error) {
	name := Name(agent, id)
	if r, ok := s.cache.Peek(name); ok {
		return r, nil // the warm path: no loader closure to allocate
	}
	return s.cache.Get(ctx, name, func(ctx context.Context) (*Routine, error) {
		r, err := s.store.GetRoutine(ctx, name)
		if errors.Is(err, store.ErrNotFound) {
			return &Routine{name: name}, nil
		}
		if err != nil {
			return nil, err
		}
		s.mu.Lock()
		prev, toolChanges := s.byKey[name], s.toolChanges
		s.mu.Unlock()
		if prev != nil && prev.version == r.GetVersion() {
			prev.mu.Lock()
			prev.failures = r.GetConsecutiveFailures()
			prev.quarantined = r.GetState() == dispatcherv1.Routine_STATE_QUARANTINED
			prev.mu.Unlock()
			return prev, nil
		}
		cr := &Routine{
			name:        name,
			version:     r.GetVersion(),
			failures:    r.GetConsecutiveFailures(),
			quarantined: r.GetState() == dispatcherv1.Routine_STATE_QUARANTINED,
		}
		tools, err := s.Tools(ctx, agent)
		if err != nil {
			return nil, err
		}
		cr.prog, cr.compileErr = routine.Compile(ctx, name, r.GetSource(), tools, s.opts.Limits)
		s.mu.Lock()
		// Built on tools read before a change, cr goes only to this
		// load's callers, who began before it (nor is it cached: forgetAgent).
		if s.toolChanges == toolChanges {
			s.byKey[name] = cr
		}
		s.mu.Unlock()
		return cr, nil
	})
}

// Exists reports whether agent has a routine for id, in any state: a
// quarantined routine still makes its protocol supported (the LLM
// answers).
func (s *Set) Exists(ctx context.Context, agent, id string) bool {
	r, err := s.Get(ctx, agent, id)
	return err == nil && r.Exists()
}

// HasSender reports whether agent has a usable routine for the PD that
// defines send.
func (s *Set) HasSender(ctx context.Context, agent, hexHash string) bool {
	r, err := s.Get(ctx, agent, strings.ToLower(hexHash))
	return err == nil && r.Usable() && r.Has("send")
}

// Hashes returns the PD hashes agent holds routines for, in name order
// (at most 1000).
func (s *Set) Hashes(ctx context.Context, agent string) []string {
	list, err := s.store.ListRoutines(ctx, agent, "", 1000)
	if err != nil {
		return nil
	}
	out := make([]string, 0, len(list))
	for _, r := range list {
		if h := resource.ID(r.GetName()); h != StepsID {
			out = append(out, h)
		}
	}
	return out
}

// Source returns the stored source of routine name; store.ErrNotFound
// when there is none.
func (s *Set) Source(ctx context.Context, name string) (string, error) {
	r, err := s.store.GetRoutine(ctx, name)
	if err != nil {
		return "", err
	}
	return r.GetSource(), nil
}

// Changed drops what the Set caches of name, a routine or a tool that
// another replica changed: the routine is read again on its next use, and
// a tool change recompiles its agent's routines. "" (changes may have been
// missed) drops every compiled routine and cached absence.
func (s *Set) Changed(name string) {
	if name == "" {
		s.forgetAgent("")
		return
	}
	if agent, _, ok := strings.Cut(name, "/tools/"); ok {
		s.forgetAgent(agent)
		return
	}
	s.cache.Forget(name)
}

// forgetAgent drops cached routines of agent ("": of all agents), after
// its tools changed. Compilations in flight read the old tools: they keep
// out of byKey (toolChanges) and the cache, and lookups from now on do not
// share them (ForgetPrefix counts as a Forget even for names not cached).
func (s *Set) forgetAgent(agent string) {
	prefix := ""
	if agent != "" {
		prefix = agent + "/"
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.toolChanges++
	for name := range s.byKey {
		if strings.HasPrefix(name, prefix) {
			delete(s.byKey, name)
		}
	}
	s.cache.ForgetPrefix(prefix)
}

// Call is one run of a routine function.
type Call struct {
	Fn     string
	Args   []json.RawMessage
	Memory json.RawMessage // nil: no memory argument
	// Check validates the output and returns it as the caller wants it
	// (agora.Query's unwrapping, say), so it is parsed once; a failure is
	// the routine's fault.
	Check func(json.RawMessage) (json.RawMessage, error)
	// InputChecked says a schema checked Args, so a crash on them is the
	// routine's fault. Without one the dispatcher cannot tell a bad
	// request from a bad routine, and gives the sender the benefit: the
	// run fails with ErrBadInput and does not count.
	InputChecked bool
}

// Run calls c.Fn of r and records the outcome: a routine fault counts
// toward quarantine (QuarantineAfter in a row), a success clears the
// count. Errors wrap ErrRoutineFault or ErrBadInput, or are routine.ErrBusy
// (the pool's fault, not the routine's, and not recorded).
func (s *Set) Run(ctx context.Context, r *Routine, c Call) (out, newMemory json.RawMessage, err error) {
	fault := true
	if r.compileErr != nil {
		err = r.compileErr
	} else {
		out, newMemory, err = r.prog.Call(ctx, c.Fn, c.Args, c.Memory)
		switch {
		case errors.Is(err, routine.ErrBusy):
			return nil, nil, err
		case err != nil:
			fault = c.InputChecked || errors.Is(err, routine.ErrBudget)
		case c.Check != nil:
			if out, err = c.Check(out); err != nil {
				err = fmt.Errorf("%w: %w", ErrBadOutput, err)
			}
		}
	}
	r.mu.Lock()
	failures := r.failures
	r.mu.Unlock()
	if err == nil && failures == 0 {
		return out, newMemory, nil // the hot path writes nothing
	}
	if err != nil && !fault {
		s.opts.Logger.InfoContext(ctx, "routine failed on an unchecked request; not counted toward quarantine", slog.String("routine", r.name), slog.Any("err", err))
		return nil, nil, fmt.Errorf("%w: %w", ErrBadInput, err)
	}
	if err != nil {
		s.opts.Metrics.RoutineFailures.Inc()
	}
	CountStop(s.opts.Metrics, err)
	kind := FailureKind(err)
	msg := ""
	if err != nil {
		msg = err.Error()
		err = fmt.Errorf("%w: %w", ErrRoutineFault, err)
	}
	// Recorded even when the caller has gone: the failure happened.
	stored, rerr := s.store.RecordRoutineRun(context.WithoutCancel(ctx), r.name, r.version, msg, kind, s.opts.QuarantineAfter)
	if rerr != nil {
		s.opts.Logger.WarnContext(ctx, "routine outcome not recorded; quarantine may lag", slog.String("routine", r.name), slog.Any("err", rerr))
		return out, newMemory, err
	}
	r.mu.Lock()
	r.failures = stored.GetConsecutiveFailures()
	wasQuarantined := r.quarantined
	r.quarantined = stored.GetState() == dispatcherv1.Routine_STATE_QUARANTINED
	nowQuarantined := r.quarantined // read under the lock: runs race here
	r.mu.Unlock()
	switch {
	case nowQuarantined && !wasQuarantined:
		s.opts.Metrics.Quarantines.Inc()
		s.opts.Logger.WarnContext(ctx, "routine quarantined; the LLM answers its protocol until a new version is set",
			slog.String("routine", r.name), slog.Int64("version", r.version), slog.Any("err", err))
	case err != nil:
		s.opts.Logger.InfoContext(ctx, "routine failed", slog.String("routine", r.name), slog.Int64("version", r.version),
			slog.Int("consecutive_failures", int(stored.GetConsecutiveFailures())), slog.Any("err", err))
	}
	return out, newMemory, err
}

// FailureKind is what stopped a failed run, for the Routine resource: a
// failed check of the output is the routine's error.
func FailureKind(err error) dispatcherv1.RoutineFailureKind {
	switch routine.KindOf(err) {
	case routine.KindTime:
		return dispatcherv1.RoutineFailureKind_ROUTINE_FAILURE_KIND_TIME
	case routine.KindMemory:
		return dispatcherv1.RoutineFailureKind_ROUTINE_FAILURE_KIND_MEMORY
	case routine.KindOutput:
		return dispatcherv1.RoutineFailureKind_ROUTINE_FAILURE_KIND_OUTPUT
	case routine.KindSteps:
		return dispatcherv1.RoutineFailureKind_ROUTINE_FAILURE_KIND_STEPS
	}
	if err != nil {
		return dispatcherv1.RoutineFailureKind_ROUTINE_FAILURE_KIND_ERROR
	}
	return dispatcherv1.RoutineFailureKind_ROUTINE_FAILURE_KIND_UNSPECIFIED
}

// CountStop counts, in m, a run stopped by a budget or killed at the
// worker boundary, by kind.
func CountStop(m *metrics.Metrics, err error) {
	switch k := routine.KindOf(err); k {
	case routine.KindTime, routine.KindMemory, routine.KindOutput, routine.KindSteps:
		m.RoutineKills.WithLabelValues(k.String()).Inc()
	}
}

// Tools returns agent's tools as routine host functions.
func (s *Set) Tools(ctx context.Context, agent string) (map[string]routine.Tool, error) {
	list, err := s.store.ListTools(ctx, agent)
	if err != nil {
		return nil, err
	}
	out := make(map[string]routine.Tool, len(list))
	for _, t := range list {
		switch k := t.GetKind().(type) {
		case *dispatcherv1.Tool_Table:
			fn, err := routine.TableTool(k.Table.GetEntriesJson())
			if err != nil {
				continue // validated on SetTool; skip rather than break every routine
			}
			out[resource.ID(t.GetName())] = fn
		}
	}
	return out, nil
}

// ToolSpecs describes agent's tools (for the LLM and the negotiator).
func (s *Set) ToolSpecs(ctx context.Context, agent string) []llm.Tool {
	list, err := s.store.ListTools(ctx, agent)
	if err != nil {
		s.opts.Logger.WarnContext(ctx, "tools not listed; going on without them", slog.String("agent", agent), slog.Any("err", err))
		return nil
	}
	out := make([]llm.Tool, 0, len(list))
	for _, t := range list {
		out = append(out, llm.Tool{
			Name:         resource.ID(t.GetName()),
			Description:  t.GetDescription(),
			InputSchema:  json.RawMessage(t.GetInputSchemaJson()),
			OutputSchema: json.RawMessage(t.GetOutputSchemaJson()),
		})
	}
	return out
}

// WithTools gives an LLM request the agent's tools and a way to run them.
func (s *Set) WithTools(ctx context.Context, req llm.Request) llm.Request {
	req.Tools = append(req.Tools, s.ToolSpecs(ctx, req.Agent)...)
	if len(req.Tools) == 0 {
		return req
	}
	agent := req.Agent
	req.CallTool = func(ctx context.Context, name string, arg json.RawMessage) (json.RawMessage, error) {
		tools, err := s.Tools(ctx, agent)
		if err != nil {
			return nil, err
		}
		t, ok := tools[name]
		if !ok {
			return nil, fmt.Errorf("no tool %q", name)
		}
		return t.Call(ctx, arg)
	}
	return req
}

// Install stores source as the next version of routine name (of a hosted
// agent), after checking that it compiles with the agent's tools. Errors
// wrap the Agents check's error, ErrInvalid, or are routine.ErrBusy.
func (s *Set) Install(ctx context.Context, name, source string) (*dispatcherv1.Routine, error) {
	i := strings.LastIndex(name, "/routines/")
	if i < 0 {
		return nil, fmt.Errorf("%w: %q is not a routine name", ErrInvalid, name)
	}
	agent := name[:i]
	if err := s.agents.Exists(ctx, agent); err != nil {
		return nil, err
	}
	tools, err := s.Tools(ctx, agent)
	if err != nil {
		return nil, err
	}
	if _, err := routine.Compile(ctx, name, source, tools, s.opts.Limits); err != nil {
		if errors.Is(err, routine.ErrBusy) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	stored, err := s.store.SetRoutine(ctx, name, source, s.opts.Now())
	if err != nil {
		return nil, err
	}
	s.cache.Forget(name)
	return stored, nil
}

// SetTool stores a tool of a hosted agent (validated by the caller) and
// makes its routines pick it up.
func (s *Set) SetTool(ctx context.Context, t *dispatcherv1.Tool) (*dispatcherv1.Tool, error) {
	i := strings.LastIndex(t.GetName(), "/tools/")
	if i < 0 {
		return nil, fmt.Errorf("%w: %q is not a tool name", ErrInvalid, t.GetName())
	}
	agent := t.GetName()[:i]
	if err := s.agents.Exists(ctx, agent); err != nil {
		return nil, err
	}
	stored, err := s.store.SetTool(ctx, t, s.opts.Now())
	if err != nil {
		return nil, err
	}
	s.forgetAgent(agent)
	return stored, nil
}

// Limits are the routine budgets runs get, for dry runs elsewhere.
func (s *Set) Limits() routine.Limits { return s.opts.Limits }
