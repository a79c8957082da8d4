package server

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
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	negotiatorv1 "github.com/parleyhq/parley/gen/parley/negotiator/v1"
	"github.com/parleyhq/parley/services/dispatcher/internal/agora"
	"github.com/parleyhq/parley/services/dispatcher/internal/routine"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

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
)

// shadowInstallTimeout bounds installing a promoted candidate. The install
// runs on a context StopShadows waits for rather than cancels, so a
// promotion is not lost to a shutdown in its middle.
const shadowInstallTimeout = 10 * time.Second

// shadows runs LLM-written routine candidates beside the LLM. Candidates
// are looked up per (agent, PD, side) with a short TTL, so a PD with no
// candidate costs no negotiator round trip per call.
type shadows struct {
	candidates *cache[*negotiatorv1.RoutineCandidate] // nil: none
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

func newShadows(ttl time.Duration, now func() time.Time) *shadows {
	stop, cancel := context.WithCancel(context.Background())
	return &shadows{candidates: newCache[*negotiatorv1.RoutineCandidate](ttl, now), slots: make(chan struct{}, shadowWorkers), stop: stop, cancel: cancel}
}

// StopShadows cancels the shadow runs in flight and waits for them to end;
// later calls start none. The app calls it before closing the store.
func (s *Server) StopShadows() {
	s.shadows.mu.Lock()
	s.shadows.stopped = true
	s.shadows.mu.Unlock()
	s.shadows.cancel()
	s.shadows.wg.Wait()
}

// candidateName is the negotiator's name of the routine candidate for
// (agent, PD, side): routineCandidates/ and the first 16 bytes of
// SHA-256(agent NUL sha1-hex NUL side enum name), in hex.
func candidateName(agent, hexHash string, side negotiatorv1.RoutineSide) string {
	h := sha256.Sum256([]byte(agent + "\x00" + hexHash + "\x00" + side.String()))
	return "routineCandidates/" + hex.EncodeToString(h[:16])
}

// shadow compares, off the caller's path, what the LLM answered (llmOut)
// with what the SHADOW candidate for (agent, PD, side), if any, answers
// fn(args) in the routine runtime, and reports the comparison to the
// negotiator. A candidate the negotiator then promotes is installed as the
// agent's routine (a new version), so the next call needs no LLM. At most
// one shadow run per call, and at most shadowWorkers at once.
func (s *Server) shadow(ctx context.Context, agent, hexHash string, side negotiatorv1.RoutineSide, fn string, args []json.RawMessage, memory, llmOut json.RawMessage) {
	if s.neg == nil {
		return
	}
	s.shadows.mu.Lock()
	if s.shadows.stopped {
		s.shadows.mu.Unlock()
		return
	}
	s.shadows.wg.Add(1)
	s.shadows.mu.Unlock()
	select {
	case s.shadows.slots <- struct{}{}:
	default:
		s.shadows.wg.Done()
		s.metrics.shadowRuns.WithLabelValues(shadowSkipped).Inc()
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shadowTimeout)
	unhook := context.AfterFunc(s.shadows.stop, cancel)
	go func() {
		defer s.shadows.wg.Done()
		defer func() { <-s.shadows.slots }()
		defer cancel()
		defer unhook()
		s.runShadow(ctx, agent, hexHash, side, fn, args, memory, llmOut)
	}()
}

func (s *Server) runShadow(ctx context.Context, agent, hexHash string, side negotiatorv1.RoutineSide, fn string, args []json.RawMessage, memory, llmOut json.RawMessage) {
	name := candidateName(agent, hexHash, side)
	c, err := s.shadows.candidates.get(ctx, name, func(ctx context.Context) (*negotiatorv1.RoutineCandidate, error) {
		c, err := s.neg.GetRoutineCandidate(ctx, &negotiatorv1.GetRoutineCandidateRequest{Name: name})
		if status.Code(err) == codes.NotFound {
			return nil, nil
		}
		return c, err
	})
	if err != nil {
		s.logger.InfoContext(ctx, "routine candidate lookup failed; no shadow run", slog.String("agent", agent), slog.String("protocol", hexHash), slog.Any("err", err))
		return
	}
	switch c.GetState() {
	case negotiatorv1.RoutineCandidateState_ROUTINE_CANDIDATE_STATE_SHADOW:
	case negotiatorv1.RoutineCandidateState_ROUTINE_CANDIDATE_STATE_PROMOTED:
		// The LLM answered although the candidate was promoted: its install
		// failed or was lost (the state is cached before installing). Retry.
		s.installPromoted(ctx, agent, hexHash, name, c)
		return
	default:
		return
	}
	agreed, detail, err := s.compareCandidate(ctx, agent, c, fn, args, memory, llmOut)
	if err != nil {
		s.metrics.shadowRuns.WithLabelValues(shadowError).Inc()
		s.logger.InfoContext(ctx, "shadow run not compared", slog.String("candidate", name), slog.Any("err", err))
		return
	}
	got, err := s.neg.ReportShadowResult(ctx, &negotiatorv1.ReportShadowResultRequest{Name: name, Agreed: agreed, Detail: detail})
	if err != nil {
		// Most often another call's report settled it first: look again.
		s.shadows.candidates.forget(name)
		s.metrics.shadowRuns.WithLabelValues(shadowError).Inc()
		s.logger.InfoContext(ctx, "shadow result not reported", slog.String("candidate", name), slog.Any("err", err))
		return
	}
	s.shadows.candidates.put(name, cacheEntry[*negotiatorv1.RoutineCandidate]{v: got, expires: s.now().Add(s.shadows.candidates.ttl)})
	switch {
	case !agreed:
		s.metrics.shadowRuns.WithLabelValues(shadowDisagreed).Inc()
		s.logger.InfoContext(ctx, "routine candidate disagreed with the LLM", slog.String("candidate", name), slog.String("agent", agent),
			slog.String("protocol", hexHash), slog.String("state", got.GetState().String()), slog.String("detail", detail))
	case got.GetState() == negotiatorv1.RoutineCandidateState_ROUTINE_CANDIDATE_STATE_PROMOTED:
		s.installPromoted(ctx, agent, hexHash, name, got)
	default:
		s.metrics.shadowRuns.WithLabelValues(shadowAgreed).Inc()
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
func (s *Server) installPromoted(ctx context.Context, agent, hexHash, cname string, c *negotiatorv1.RoutineCandidate) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shadowInstallTimeout)
	defer cancel()
	s.shadows.installMu.Lock()
	defer s.shadows.installMu.Unlock()
	rname := routineName(agent, hexHash)
	src, installed, conflict, err := s.mergedRoutine(ctx, rname, c.GetSource())
	switch {
	case err != nil:
		s.metrics.shadowRuns.WithLabelValues(shadowError).Inc()
		s.logger.ErrorContext(ctx, "promoted routine not installed", slog.String("candidate", cname), slog.String("agent", agent), slog.String("protocol", hexHash), slog.Any("err", err))
		return
	case installed:
		return
	case conflict != "":
		s.metrics.shadowRuns.WithLabelValues(shadowConflict).Inc()
		s.logger.WarnContext(ctx, "promoted routine not installed: it conflicts with the installed routine", slog.String("candidate", cname), slog.String("agent", agent), slog.String("protocol", hexHash), slog.String("conflict", conflict))
		return
	}
	if _, err := s.SetRoutine(ctx, &dispatcherv1.SetRoutineRequest{Routine: &dispatcherv1.Routine{Name: rname, Source: src}}); err != nil {
		if status.Code(err) == codes.InvalidArgument && src != c.GetSource() {
			s.metrics.shadowRuns.WithLabelValues(shadowConflict).Inc()
			s.logger.WarnContext(ctx, "promoted routine not installed: merged with the installed routine it does not pass validation", slog.String("candidate", cname), slog.String("agent", agent), slog.String("protocol", hexHash), slog.Any("err", err))
			return
		}
		s.metrics.shadowRuns.WithLabelValues(shadowError).Inc()
		s.logger.ErrorContext(ctx, "promoted routine not installed", slog.String("candidate", cname), slog.String("agent", agent), slog.String("protocol", hexHash), slog.Any("err", err))
		return
	}
	s.metrics.shadowRuns.WithLabelValues(shadowPromoted).Inc()
	s.logger.InfoContext(ctx, "routine candidate promoted and installed", slog.String("candidate", cname), slog.String("agent", agent), slog.String("protocol", hexHash), slog.Int("agreements", int(c.GetAgreements())))
}

// mergedRoutine returns the source to install for the candidate cand as
// the routine rname: cand alone when there is no routine, else the routine
// followed by cand. installed reports that the routine already defines
// every function cand defines; conflict, when not "", says why the two
// cannot be merged.
func (s *Server) mergedRoutine(ctx context.Context, rname, cand string) (src string, installed bool, conflict string, err error) {
	candNames, candFuncs, err := topLevelNames(cand)
	if err != nil {
		return "", false, "the candidate does not parse: " + err.Error(), nil
	}
	cur, err := s.store.GetRoutine(ctx, rname)
	if errors.Is(err, store.ErrNotFound) {
		return cand, false, "", nil
	}
	if err != nil {
		return "", false, "", err
	}
	curNames, curFuncs, err := topLevelNames(cur.GetSource())
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
	return strings.TrimRight(cur.GetSource(), "\n") + "\n\n" + cand, false, "", nil
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
func (s *Server) compareCandidate(ctx context.Context, agent string, c *negotiatorv1.RoutineCandidate, fn string, args []json.RawMessage, memory, llmOut json.RawMessage) (agreed bool, detail string, err error) {
	tools, err := s.tools(ctx, agent)
	if err != nil {
		return false, "", err
	}
	prog, err := routine.Compile(ctx, c.GetName(), c.GetSource(), tools, s.opts.RoutineLimits)
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
	s.countStop(err)
	if errors.Is(err, routine.ErrBusy) || isTimeOverrun(err) {
		return false, "", err
	}
	if err != nil {
		return false, fmt.Sprintf("%s failed: %v", fn, err), nil
	}
	if sameJSON(out, llmOut) {
		return true, "", nil
	}
	return false, fmt.Sprintf("%s answered %s, the LLM %s", fn, clip(out), clip(llmOut)), nil
}

// sameJSON is the shadow comparison: two results agree when their canonical
// JSON is equal. A string holding a JSON object or list stands for that
// value (as on the wire, see agora.Query); canonical JSON has object keys
// sorted, no insignificant space, and numbers as float64 (so 1 and 1.0
// agree). Anything that is not JSON agrees with nothing.
func sameJSON(a, b json.RawMessage) bool {
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
