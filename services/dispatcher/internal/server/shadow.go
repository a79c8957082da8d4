package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	negotiatorv1 "github.com/parleyhq/parley/gen/parley/negotiator/v1"
	"github.com/parleyhq/parley/services/dispatcher/internal/agora"
	"github.com/parleyhq/parley/services/dispatcher/internal/routine"
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
)

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
	if c.GetState() != negotiatorv1.RoutineCandidateState_ROUTINE_CANDIDATE_STATE_SHADOW {
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
		if _, err := s.SetRoutine(ctx, &dispatcherv1.SetRoutineRequest{Routine: &dispatcherv1.Routine{Name: routineName(agent, hexHash), Source: got.GetSource()}}); err != nil {
			s.metrics.shadowRuns.WithLabelValues(shadowError).Inc()
			s.logger.ErrorContext(ctx, "promoted routine not installed", slog.String("candidate", name), slog.Any("err", err))
			return
		}
		s.metrics.shadowRuns.WithLabelValues(shadowPromoted).Inc()
		s.logger.InfoContext(ctx, "routine candidate promoted and installed", slog.String("candidate", name), slog.String("agent", agent),
			slog.String("protocol", hexHash), slog.Int("agreements", int(got.GetAgreements())))
	default:
		s.metrics.shadowRuns.WithLabelValues(shadowAgreed).Inc()
	}
}

// compareCandidate runs fn of the candidate's source with the agent's tools
// and the server's routine budgets and compares its result with llmOut. A
// run that fails is a disagreement; err is set only when nothing could be
// compared (every routine worker busy, the tools unreadable).
func (s *Server) compareCandidate(ctx context.Context, agent string, c *negotiatorv1.RoutineCandidate, fn string, args []json.RawMessage, memory, llmOut json.RawMessage) (agreed bool, detail string, err error) {
	tools, err := s.tools(ctx, agent)
	if err != nil {
		return false, "", err
	}
	prog, err := routine.Compile(ctx, c.GetName(), c.GetSource(), tools, s.opts.RoutineLimits)
	if errors.Is(err, routine.ErrBusy) {
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
	if errors.Is(err, routine.ErrBusy) {
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
