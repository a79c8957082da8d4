// Package shadow runs LLM-written routine candidates beside the LLM: when
// the LLM answered a protocol, the candidate for (agent, protocol, side)
// answers the same input off the caller's path, the negotiator hears
// whether they agreed, and a candidate it promotes is installed as the
// agent's routine (hosted.Set.Install), so later calls need no LLM. The
// negotiator sits behind the Candidates interface.
package shadow

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"go.starlark.net/syntax"

	"github.com/parleyhq/parley/services/dispatcher/internal/agora"
	"github.com/parleyhq/parley/services/dispatcher/internal/cache"
	"github.com/parleyhq/parley/services/dispatcher/internal/hosted"
	"github.com/parleyhq/parley/services/dispatcher/internal/metrics"
	"github.com/parleyhq/parley/services/dispatcher/internal/routine"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

// Side is the side of a protocol a routine plays.
type Side string

// Sides, spelled as the negotiator's enum names (they enter candidate
// names).
const (
	Sender   Side = "ROUTINE_SIDE_SENDER"
	Receiver Side = "ROUTINE_SIDE_RECEIVER"
)

// State is a candidate's state at the negotiator.
type State int

// Candidate states.
const (
	StateOther    State = iota // retired, or anything not run
	StateShadow                // runs beside the LLM
	StatePromoted              // agreed often enough: install it
)

// Candidate is an LLM-written routine the negotiator keeps for (agent,
// protocol, side).
type Candidate struct {
	Name       string
	Source     string
	State      State
	Agreements int
	// Check is run on Source (hosted.Set.Check) before the candidate is
	// shadowed or installed; checked records that it passed.
	Check   hosted.Check
	checked bool
}

// Result is one outcome reported to the negotiator: a comparison with the
// LLM (Agreed, and Detail when not), or a failed check (CheckFailed, with
// Detail saying why), which rejects the candidate whatever its state.
type Result struct {
	Agreed      bool
	Detail      string
	CheckFailed bool
}

// ErrNoCandidate is the error of a candidate the negotiator does not hold.
var ErrNoCandidate = errors.New("no routine candidate")

// Candidates is what shadow runs need of the negotiator.
type Candidates interface {
	// Candidate returns a candidate; ErrNoCandidate when there is none.
	Candidate(ctx context.Context, name string) (Candidate, error)
	// Report tells the negotiator one outcome and returns the candidate as
	// it now stands.
	Report(ctx context.Context, name string, r Result) (Candidate, error)
}

// Options configures a Runner.
type Options struct {
	CacheTTL time.Duration
	Now      func() time.Time
	Logger   *slog.Logger
	Metrics  *metrics.Metrics
}

// shadowWorkers bounds the shadow runs in flight; a call that finds every
// one busy is not compared (the candidate simply waits for a later call).
const shadowWorkers = 2

// shadowTimeout bounds one shadow comparison: the candidate lookup, the
// run (which has its own routine budgets) and the report.
const shadowTimeout = 30 * time.Second

// Shadow outcomes, the label of parley_dispatcher_shadow_runs_total.
const (
	shadowAgreed    = "agreed"
	shadowDisagreed = "disagreed"
	shadowPromoted  = "promoted"
	shadowSkipped   = "skipped"
	shadowError     = "error"
	shadowConflict  = "conflict"
	// The candidate failed its check and was rejected.
	shadowCheckFailed = "check_failed"
)

// shadowInstallTimeout bounds installing a promoted candidate. The install
// runs on a context StopShadows waits for rather than cancels, so a
// promotion is not lost to a shutdown in its middle.
const shadowInstallTimeout = 10 * time.Second

// Runner runs LLM-written routine candidates beside the LLM. Candidates
// are looked up per (agent, PD, side) with a short TTL, so a PD with no
// candidate costs no negotiator round trip per call.
type Runner struct {
	neg        Candidates
	routines   *hosted.Set
	opts       Options
	candidates *cache.Cache[*Candidate] // nil: none
	slots      chan struct{}
	stop       context.Context // done when the server stops shadow runs
	cancel     context.CancelFunc

	mu      sync.Mutex // guards stopped and wg.Add
	stopped bool
	wg      sync.WaitGroup

	// installMu serialises installs, each a read-merge-write of the
	// agent's routine for a PD (a sender and a receiver candidate of one
	// PD may be promoted at once).
	installMu sync.Mutex
}

// New returns a Runner; with neg nil it runs nothing.
func New(neg Candidates, routines *hosted.Set, opts Options) *Runner {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Metrics == nil {
		opts.Metrics = metrics.New(nil)
	}
	stop, cancel := context.WithCancel(context.Background())
	return &Runner{neg: neg, routines: routines, opts: opts, candidates: cache.New[*Candidate](opts.CacheTTL, opts.Now), slots: make(chan struct{}, shadowWorkers), stop: stop, cancel: cancel}
}

// Stop cancels the shadow runs in flight and waits for them to end; later
// calls start none. The app calls it before closing the store.
func (s *Runner) Stop() {
	s.mu.Lock()
	s.stopped = true
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
}

// Wait waits until every shadow run started so far has ended (tests call
// it between requests, when no run can start meanwhile).
func (s *Runner) Wait() { s.wg.Wait() }

// CandidateName is the negotiator's name of the routine candidate for
// (agent, PD, side): routineCandidates/ and the first 16 bytes of
// SHA-256(agent NUL sha1-hex NUL side enum name), in hex.
func CandidateName(agent, hexHash string, side Side) string {
	h := sha256.Sum256([]byte(agent + "\x00" + hexHash + "\x00" + string(side)))
	return "routineCandidates/" + hex.EncodeToString(h[:16])
}

// Run compares, off the caller's path, what the LLM answered (llmOut)
// with what the SHADOW candidate for (agent, PD, side), if any, answers
// fn(args) in the routine runtime, and reports the comparison to the
// negotiator. A candidate the negotiator then promotes is installed as the
// agent's routine (a new version), so the next call needs no LLM. At most
// one shadow run per call, and at most shadowWorkers at once.
func (s *Runner) Run(ctx context.Context, agent, hexHash string, side Side, fn string, args []json.RawMessage, memory, llmOut json.RawMessage) {
	if s == nil || s.neg == nil {
		return
	}
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return
	}
	s.wg.Add(1)
	s.mu.Unlock()
	select {
	case s.slots <- struct{}{}:
	default:
		s.wg.Done()
		s.opts.Metrics.ShadowRuns.WithLabelValues(shadowSkipped).Inc()
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shadowTimeout)
	unhook := context.AfterFunc(s.stop, cancel)
	go func() {
		defer s.wg.Done()
		defer func() { <-s.slots }()
		defer cancel()
		defer unhook()
		s.runShadow(ctx, agent, hexHash, side, fn, args, memory, llmOut)
	}()
}

func (s *Runner) runShadow(ctx context.Context, agent, hexHash string, side Side, fn string, args []json.RawMessage, memory, llmOut json.RawMessage) {
	name := CandidateName(agent, hexHash, side)
	c, err := s.candidates.Get(ctx, name, func(ctx context.Context) (*Candidate, error) {
		c, err := s.neg.Candidate(ctx, name)
		if errors.Is(err, ErrNoCandidate) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		return &c, nil
	})
	if err != nil {
		s.opts.Logger.InfoContext(ctx, "routine candidate lookup failed; no shadow run", slog.String("agent", agent), slog.String("protocol", hexHash), slog.Any("err", err))
		return
	}
	if c == nil {
		return
	}
	if c.State == StateShadow || c.State == StatePromoted {
		if c = s.check(ctx, agent, c); c == nil {
			return
		}
	}
	switch c.State {
	case StateShadow:
	case StatePromoted:
		// The LLM answered although the candidate was promoted: its install
		// failed or was lost (the state is cached before installing). Retry.
		s.installPromoted(ctx, agent, hexHash, name, c)
		return
	default:
		return
	}
	agreed, detail, err := s.compareCandidate(ctx, agent, c, fn, args, memory, llmOut)
	if err != nil {
		s.opts.Metrics.ShadowRuns.WithLabelValues(shadowError).Inc()
		s.opts.Logger.InfoContext(ctx, "shadow run not compared", slog.String("candidate", name), slog.Any("err", err))
		return
	}
	got, err := s.neg.Report(ctx, name, Result{Agreed: agreed, Detail: detail})
	if err != nil {
		// Most often another call's report settled it first: look again.
		s.candidates.Forget(name)
		s.opts.Metrics.ShadowRuns.WithLabelValues(shadowError).Inc()
		s.opts.Logger.InfoContext(ctx, "shadow result not reported", slog.String("candidate", name), slog.Any("err", err))
		return
	}
	s.candidates.Put(name, &got)
	switch {
	case !agreed:
		s.opts.Metrics.ShadowRuns.WithLabelValues(shadowDisagreed).Inc()
		// detail quotes both answers (bodies): it goes to the candidate's
		// rejection reason, which only its owner reads, never to the log.
		s.opts.Logger.InfoContext(ctx, "routine candidate disagreed with the LLM", slog.String("candidate", name), slog.String("agent", agent),
			slog.String("protocol", hexHash), slog.Int("state", int(got.State)))
	case got.State == StatePromoted:
		s.installPromoted(ctx, agent, hexHash, name, &got)
	default:
		s.opts.Metrics.ShadowRuns.WithLabelValues(shadowAgreed).Inc()
	}
}

// maxCheckDetail bounds the reason of a failed check sent to the
// negotiator (it keeps it as the rejection reason).
const maxCheckDetail = 4 << 10

// check runs c's check once per cached candidate: c, marked checked, when
// it passes; nil when it fails (the candidate is reported rejected) or
// cannot run now (busy workers: a later call tries again).
func (s *Runner) check(ctx context.Context, agent string, c *Candidate) *Candidate {
	if c.checked {
		return c
	}
	err := s.routines.Check(routine.WithAgent(ctx, agent), c.Source, c.Check)
	if err == nil {
		ok := *c
		ok.checked = true
		s.candidates.Put(c.Name, &ok)
		return &ok
	}
	if !errors.Is(err, hosted.ErrCheckFailed) {
		s.opts.Metrics.ShadowRuns.WithLabelValues(shadowError).Inc()
		s.opts.Logger.InfoContext(ctx, "routine candidate not checked", slog.String("candidate", c.Name), slog.Any("err", err))
		return nil
	}
	s.opts.Metrics.ShadowRuns.WithLabelValues(shadowCheckFailed).Inc()
	// The reason quotes example bodies: it goes to the candidate's
	// rejection reason, which only its owner reads, never to the log.
	s.opts.Logger.InfoContext(ctx, "routine candidate failed its check; rejected", slog.String("candidate", c.Name), slog.String("agent", agent))
	detail := err.Error()
	if len(detail) > maxCheckDetail {
		detail = strings.ToValidUTF8(detail[:maxCheckDetail], "")
	}
	got, err := s.neg.Report(ctx, c.Name, Result{CheckFailed: true, Detail: detail})
	if err != nil {
		s.candidates.Forget(c.Name)
		s.opts.Logger.InfoContext(ctx, "failed check not reported", slog.String("candidate", c.Name), slog.Any("err", err))
		return nil
	}
	s.candidates.Put(c.Name, &got)
	return nil
}

// InstallPromoted installs the promoted candidate c now, as a lookup that
// finds it PROMOTED does.
func (s *Runner) InstallPromoted(ctx context.Context, agent, hexHash string, c Candidate) {
	if checked := s.check(ctx, agent, &c); checked != nil {
		s.installPromoted(ctx, agent, hexHash, c.Name, checked)
	}
}

// installPromoted installs the promoted candidate c as (part of) the
// agent's routine for the PD, idempotently: nothing is done when the
// routine already defines the candidate's functions (installed before, or
// written by the user, which is never replaced). A routine of the other
// side is kept: the candidate is appended to it when their top-level names
// do not clash and the merged source passes SetRoutine's validation;
// otherwise nothing is installed and the outcome is a conflict. A failure
// that may pass (busy workers, the store) is an error; the next call that
// finds the candidate PROMOTED tries again.
func (s *Runner) installPromoted(ctx context.Context, agent, hexHash, cname string, c *Candidate) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shadowInstallTimeout)
	defer cancel()
	s.installMu.Lock()
	defer s.installMu.Unlock()
	rname := hosted.Name(agent, hexHash)
	src, installed, conflict, err := s.mergedRoutine(ctx, rname, c.Source)
	switch {
	case err != nil:
		s.opts.Metrics.ShadowRuns.WithLabelValues(shadowError).Inc()
		s.opts.Logger.ErrorContext(ctx, "promoted routine not installed", slog.String("candidate", cname), slog.String("agent", agent), slog.String("protocol", hexHash), slog.Any("err", err))
		return
	case installed:
		return
	case conflict != "":
		s.opts.Metrics.ShadowRuns.WithLabelValues(shadowConflict).Inc()
		s.opts.Logger.WarnContext(ctx, "promoted routine not installed: it conflicts with the installed routine", slog.String("candidate", cname), slog.String("agent", agent), slog.String("protocol", hexHash), slog.String("conflict", conflict))
		return
	}
	if _, err := s.routines.Install(ctx, rname, src); err != nil {
		if errors.Is(err, hosted.ErrInvalid) && src != c.Source {
			s.opts.Metrics.ShadowRuns.WithLabelValues(shadowConflict).Inc()
			s.opts.Logger.WarnContext(ctx, "promoted routine not installed: merged with the installed routine it does not pass validation", slog.String("candidate", cname), slog.String("agent", agent), slog.String("protocol", hexHash), slog.Any("err", err))
			return
		}
		s.opts.Metrics.ShadowRuns.WithLabelValues(shadowError).Inc()
		s.opts.Logger.ErrorContext(ctx, "promoted routine not installed", slog.String("candidate", cname), slog.String("agent", agent), slog.String("protocol", hexHash), slog.Any("err", err))
		return
	}
	s.opts.Metrics.ShadowRuns.WithLabelValues(shadowPromoted).Inc()
	s.opts.Logger.InfoContext(ctx, "routine candidate promoted and installed", slog.String("candidate", cname), slog.String("agent", agent), slog.String("protocol", hexHash), slog.Int("agreements", c.Agreements))
}

// mergedRoutine returns the source to install for the candidate cand as
// the routine rname: cand alone when there is no routine, else the routine
// followed by cand. installed reports that the routine already defines
// every function cand defines; conflict, when not "", says why the two
// cannot be merged.
func (s *Runner) mergedRoutine(ctx context.Context, rname, cand string) (src string, installed bool, conflict string, err error) {
	candNames, candFuncs, err := topLevelNames(cand)
	if err != nil {
		return "", false, "the candidate does not parse: " + err.Error(), nil
	}
	cur, err := s.routines.Source(ctx, rname)
	if errors.Is(err, store.ErrNotFound) {
		return cand, false, "", nil
	}
	if err != nil {
		return "", false, "", err
	}
	curNames, curFuncs, err := topLevelNames(cur)
	if err != nil {
		return "", false, "the installed routine does not parse: " + err.Error(), nil
	}
	if len(candFuncs) > 0 && !slices.ContainsFunc(candFuncs, func(f string) bool { return !slices.Contains(curFuncs, f) }) {
		return "", true, "", nil
	}
	var clash []string
	for _, n := range candNames {
		if slices.Contains(curNames, n) {
			clash = append(clash, n)
		}
	}
	if len(clash) > 0 {
		return "", false, "both define " + strings.Join(clash, ", "), nil
	}
	return strings.TrimRight(cur, "\n") + "\n\n" + cand, false, "", nil
}

// topLevelNames returns the global names src binds (defs, assignments,
// loop variables and loads at top level, sorted) and, of them, the
// functions it defines.
func topLevelNames(src string) (names, funcs []string, err error) {
	f, err := (&syntax.FileOptions{While: true, TopLevelControl: true, GlobalReassign: true, Set: true}).Parse("routine", src, 0)
	if err != nil {
		return nil, nil, err
	}
	seen := map[string]bool{}
	add := func(id *syntax.Ident) {
		if id != nil && !seen[id.Name] {
			seen[id.Name] = true
			names = append(names, id.Name)
		}
	}
	var target func(e syntax.Expr)
	target = func(e syntax.Expr) {
		switch e := e.(type) {
		case *syntax.Ident:
			add(e)
		case *syntax.TupleExpr:
			for _, x := range e.List {
				target(x)
			}
		case *syntax.ListExpr:
			for _, x := range e.List {
				target(x)
			}
		case *syntax.ParenExpr:
			target(e.X)
		}
	}
	var walk func(stmts []syntax.Stmt)
	walk = func(stmts []syntax.Stmt) {
		for _, st := range stmts {
			switch st := st.(type) {
			case *syntax.DefStmt:
				add(st.Name)
				funcs = append(funcs, st.Name.Name)
			case *syntax.AssignStmt:
				target(st.LHS)
			case *syntax.ForStmt:
				target(st.Vars)
				walk(st.Body)
			case *syntax.WhileStmt:
				walk(st.Body)
			case *syntax.IfStmt:
				walk(st.True)
				walk(st.False)
			case *syntax.LoadStmt:
				for _, id := range st.To {
					add(id)
				}
			}
		}
	}
	walk(f.Stmts)
	slices.Sort(names)
	slices.Sort(funcs)
	return names, funcs, nil
}

// isTimeOverrun reports whether err is a run stopped (or finished late) at
// its wall-time budget or deadline. Unlike the step or allocation budgets it
// depends on the machine's load, not on the routine, so it is no verdict.
func isTimeOverrun(err error) bool {
	return errors.Is(err, routine.ErrTimeBudget)
}

// compareCandidate runs fn of the candidate's source with the agent's tools
// and the server's routine budgets and compares its result with llmOut. A
// run that fails is a disagreement; err is set only when nothing could be
// compared (every routine worker busy, the wall-time budget or deadline
// overrun, which says more of the machine's load than of the routine, the
// tools unreadable).
func (s *Runner) compareCandidate(ctx context.Context, agent string, c *Candidate, fn string, args []json.RawMessage, memory, llmOut json.RawMessage) (agreed bool, detail string, err error) {
	tools, err := s.routines.Tools(ctx, agent)
	if err != nil {
		return false, "", err
	}
	ctx = routine.WithAgent(ctx, agent) // the agent's share of the workers
	prog, err := routine.Compile(ctx, c.Name, c.Source, tools, s.routines.Limits())
	if errors.Is(err, routine.ErrBusy) || isTimeOverrun(err) {
		return false, "", err
	}
	if err != nil {
		return false, "the routine does not compile: " + err.Error(), nil
	}
	if !prog.Has(fn) {
		return false, fmt.Sprintf("the routine defines no %s", fn), nil
	}
	if memory == nil && fn == "reply" {
		memory = json.RawMessage("{}")
	}
	out, _, err := prog.Call(ctx, fn, args, memory)
	hosted.CountStop(s.opts.Metrics, err)
	if errors.Is(err, routine.ErrBusy) || isTimeOverrun(err) {
		return false, "", err
	}
	if err != nil {
		return false, fmt.Sprintf("%s failed: %v", fn, err), nil
	}
	if SameJSON(out, llmOut) {
		return true, "", nil
	}
	return false, fmt.Sprintf("%s answered %s, the LLM %s", fn, clip(out), clip(llmOut)), nil
}

// SameJSON is the shadow comparison: two results agree when their canonical
// JSON is equal. A string holding a JSON object or list stands for that
// value (as on the wire, see agora.Query); canonical JSON has object keys
// sorted, no insignificant space, and numbers as float64 (so 1 and 1.0
// agree). Anything that is not JSON agrees with nothing.
func SameJSON(a, b json.RawMessage) bool {
	ca, ok := canonicalJSON(a)
	if !ok {
		return false
	}
	cb, ok := canonicalJSON(b)
	return ok && ca == cb
}

func canonicalJSON(raw json.RawMessage) (string, bool) {
	q, _ := agora.Query(raw)
	var v any
	if err := json.Unmarshal(q, &v); err != nil {
		return "", false
	}
	out, err := json.Marshal(v)
	if err != nil {
		return "", false
	}
	return string(out), true
}

// clip shortens a result for a disagreement's detail.
func clip(b []byte) string {
	const n = 200
	if len(b) <= n {
		return string(b)
	}
	return string(b[:n]) + "…"
}
