package server

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"sort"
	"strings"
	"sync"

	"google.golang.org/protobuf/proto"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/platform/pagetoken"
	"github.com/parleyhq/parley/services/dispatcher/internal/pdschema"
	"github.com/parleyhq/parley/services/dispatcher/internal/routine"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

// stepRoutineID is the routine id of an agent's Agent Protocol step routine.
const stepRoutineID = "steps"

// compiledRoutine is a routine version ready to run. A nil prog means the
// agent has no such routine.
type compiledRoutine struct {
	name       string
	version    int64
	prog       *routine.Program
	compileErr error

	mu          sync.Mutex // guards failures and quarantined
	failures    int32
	quarantined bool
}

func (r *compiledRoutine) usable() bool {
	if r == nil || r.prog == nil && r.compileErr == nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return !r.quarantined
}

// routineCache keeps compiled routines, re-reading the store after CacheTTL
// and recompiling only when the version changed.
type routineCache struct {
	s     *Server
	cache *cache[*compiledRoutine]

	mu    sync.Mutex // guards byKey
	byKey map[string]*compiledRoutine
}

func newRoutineCache(s *Server) *routineCache {
	return &routineCache{s: s, cache: newCache[*compiledRoutine](s.opts.CacheTTL, s.now), byKey: map[string]*compiledRoutine{}}
}

func routineName(agent, id string) string { return agent + "/routines/" + id }

// get returns the routine of agent for id (a PD hash or "steps"); its prog
// is nil when there is none.
func (c *routineCache) get(ctx context.Context, agent, id string) (*compiledRoutine, error) {
	name := routineName(agent, id)
	return c.cache.get(ctx, name, func(ctx context.Context) (*compiledRoutine, error) {
		r, err := c.s.store.GetRoutine(ctx, name)
		if errors.Is(err, store.ErrNotFound) {
			return &compiledRoutine{name: name}, nil
		}
		if err != nil {
			return nil, err
		}
		c.mu.Lock()
		prev := c.byKey[name]
		c.mu.Unlock()
		if prev != nil && prev.version == r.GetVersion() {
			prev.mu.Lock()
			prev.failures = r.GetConsecutiveFailures()
			prev.quarantined = r.GetState() == dispatcherv1.Routine_STATE_QUARANTINED
			prev.mu.Unlock()
			return prev, nil
		}
		cr := &compiledRoutine{
			name:        name,
			version:     r.GetVersion(),
			failures:    r.GetConsecutiveFailures(),
			quarantined: r.GetState() == dispatcherv1.Routine_STATE_QUARANTINED,
		}
		tools, err := c.s.tools(ctx, agent)
		if err != nil {
			return nil, err
		}
		cr.prog, cr.compileErr = routine.Compile(ctx, name, r.GetSource(), tools, c.s.opts.RoutineLimits)
		c.mu.Lock()
		c.byKey[name] = cr
		c.mu.Unlock()
		return cr, nil
	})
}

// exists reports whether agent has a routine for id, in any state: a
// quarantined routine still makes its protocol supported (the LLM answers).
func (c *routineCache) exists(ctx context.Context, agent, id string) bool {
	r, err := c.get(ctx, agent, id)
	return err == nil && (r.prog != nil || r.compileErr != nil)
}

// forgetAgent drops cached routines of agent, after its tools changed.
func (c *routineCache) forgetAgent(agent string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for name := range c.byKey {
		if len(name) > len(agent) && name[:len(agent)+1] == agent+"/" {
			delete(c.byKey, name)
			c.cache.forget(name)
		}
	}
}

// run calls fn of routine r and records the outcome, quarantining it after
// QuarantineAfter consecutive failures. check validates the output.
func (s *Server) runRoutine(ctx context.Context, r *compiledRoutine, fn string, args []json.RawMessage, memory json.RawMessage, check func(json.RawMessage) error) (out, newMemory json.RawMessage, err error) {
	if r.compileErr != nil {
		err = r.compileErr
	} else {
		out, newMemory, err = r.prog.Call(ctx, fn, args, memory)
		if errors.Is(err, routine.ErrBusy) {
			return nil, nil, err // the pool's fault, not the routine's
		}
		if err == nil && check != nil {
			err = check(out)
		}
	}
	r.mu.Lock()
	failures := r.failures
	r.mu.Unlock()
	if err == nil && failures == 0 {
		return out, newMemory, nil // the hot path writes nothing
	}
	if err != nil {
		s.metrics.routineFailures.Inc()
	}
	s.countStop(err)
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	// Recorded even when the caller has gone: the failure happened.
	stored, rerr := s.store.RecordRoutineRun(context.WithoutCancel(ctx), r.name, r.version, msg, failureKind(err), s.opts.QuarantineAfter)
	if rerr != nil {
		s.logger.WarnContext(ctx, "routine outcome not recorded; quarantine may lag", slog.String("routine", r.name), slog.Any("err", rerr))
		return out, newMemory, err
	}
	r.mu.Lock()
	r.failures = stored.GetConsecutiveFailures()
	wasQuarantined := r.quarantined
	r.quarantined = stored.GetState() == dispatcherv1.Routine_STATE_QUARANTINED
	if r.quarantined && !wasQuarantined {
		s.metrics.quarantines.Inc()
		s.logger.WarnContext(ctx, "routine quarantined; the LLM answers its protocol until a new version is set",
			slog.String("routine", r.name), slog.Int64("version", r.version), slog.Any("err", err))
	}
	r.mu.Unlock()
	return out, newMemory, err
}

// failureKind is what stopped a failed run, for the Routine resource: a
// check of the output that failed is the routine's error.
func failureKind(err error) dispatcherv1.RoutineFailureKind {
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

// countStop counts a run stopped by a budget or killed, by kind.
func (s *Server) countStop(err error) {
	switch k := routine.KindOf(err); k {
	case routine.KindTime, routine.KindMemory, routine.KindOutput, routine.KindSteps:
		s.metrics.routineStops.WithLabelValues(k.String()).Inc()
	}
}

// tools returns agent's tools as routine host functions.
func (s *Server) tools(ctx context.Context, agent string) (map[string]routine.Tool, error) {
	list, err := s.store.ListTools(ctx, agent)
	if err != nil {
		return nil, err
	}
	out := make(map[string]routine.Tool, len(list))
	for _, t := range list {
		id := lastSegment(t.GetName())
		switch k := t.GetKind().(type) {
		case *dispatcherv1.Tool_Table:
			fn, err := routine.TableTool(k.Table.GetEntriesJson())
			if err != nil {
				continue // validated on SetTool; skip rather than break every routine
			}
			out[id] = fn
		}
	}
	return out, nil
}

// GetRoutine implements DispatcherServiceServer.
func (s *Server) GetRoutine(ctx context.Context, req *dispatcherv1.GetRoutineRequest) (*dispatcherv1.Routine, error) {
	if _, ok := parseRoutineName(req.GetName()); !ok {
		return nil, invalid("name", "must be clients/{client}/agents/{agent}/routines/{sha1-hex or steps}")
	}
	r, err := s.store.GetRoutine(ctx, req.GetName())
	if err != nil {
		return nil, s.toStatus(ctx, err, "ROUTINE_NOT_FOUND")
	}
	return r, nil
}

// ListRoutines implements DispatcherServiceServer.
func (s *Server) ListRoutines(ctx context.Context, req *dispatcherv1.ListRoutinesRequest) (*dispatcherv1.ListRoutinesResponse, error) {
	var v grpcerr.Violations
	if !validAgentName(req.GetParent()) {
		v.Add("parent", "must be clients/{client}/agents/{agent}")
	}
	size, ok := pagetoken.Size(req.GetPageSize(), 50, 1000)
	if !ok {
		v.Add("page_size", "must not be negative")
	}
	after, err := pagetoken.Decode(req.GetPageToken(), req.GetParent())
	if err != nil {
		v.Add("page_token", "is not a token from a previous call with the same parent")
	}
	if err := v.Err("INVALID_ARGUMENT", Domain); err != nil {
		return nil, err
	}
	list, err := s.store.ListRoutines(ctx, req.GetParent(), after, size+1)
	if err != nil {
		return nil, s.toStatus(ctx, err, "")
	}
	resp := &dispatcherv1.ListRoutinesResponse{}
	if len(list) > size {
		list = list[:size]
		resp.NextPageToken = pagetoken.Encode(list[size-1].GetName(), req.GetParent())
	}
	resp.Routines = list
	return resp, nil
}

// SetRoutine implements DispatcherServiceServer.
func (s *Server) SetRoutine(ctx context.Context, req *dispatcherv1.SetRoutineRequest) (*dispatcherv1.Routine, error) {
	r := req.GetRoutine()
	var v grpcerr.Violations
	agent, ok := parseRoutineName(r.GetName())
	if !ok {
		v.Add("routine.name", "must be clients/{client}/agents/{agent}/routines/{sha1-hex or steps}")
	}
	if r.GetSource() == "" {
		v.Add("routine.source", "must not be empty")
	} else if len(r.GetSource()) > 256<<10 {
		v.Add("routine.source", "must be at most 256 KiB")
	}
	if err := v.Err("INVALID_ARGUMENT", Domain); err != nil {
		return nil, err
	}
	tools, err := s.tools(ctx, agent)
	if err != nil {
		return nil, s.toStatus(ctx, err, "")
	}
	if _, err := routine.Compile(ctx, r.GetName(), r.GetSource(), tools, s.opts.RoutineLimits); err != nil {
		return nil, routineCompileStatus(err)
	}
	stored, err := s.store.SetRoutine(ctx, r.GetName(), r.GetSource(), s.now())
	if err != nil {
		return nil, s.toStatus(ctx, err, "")
	}
	s.routines.cache.forget(r.GetName())
	return stored, nil
}

// SetTool implements DispatcherServiceServer.
func (s *Server) SetTool(ctx context.Context, req *dispatcherv1.SetToolRequest) (*dispatcherv1.Tool, error) {
	t := req.GetTool()
	var v grpcerr.Violations
	agent, ok := parseToolName(t.GetName())
	if !ok {
		v.Add("tool.name", "must be clients/{client}/agents/{agent}/tools/{tool}, tool a Starlark identifier")
	}
	switch k := t.GetKind().(type) {
	case *dispatcherv1.Tool_Table:
		if _, err := routine.TableTool(k.Table.GetEntriesJson()); err != nil {
			v.Add("tool.table.entries_json", err.Error())
		} else if len(k.Table.GetEntriesJson()) > 1<<20 {
			v.Add("tool.table.entries_json", "must be at most 1 MiB")
		}
	default:
		v.Add("tool.kind", "must be set (table)")
	}
	for field, raw := range map[string]string{"tool.input_schema_json": t.GetInputSchemaJson(), "tool.output_schema_json": t.GetOutputSchemaJson()} {
		if raw == "" {
			continue
		}
		if _, err := pdschema.Compile(raw, ""); err != nil {
			v.Add(field, err.Error())
		} else if !strings.HasPrefix(strings.TrimSpace(raw), "{") {
			v.Add(field, "must be a JSON Schema object")
		} else if len(raw) > 64<<10 {
			v.Add(field, "must be at most 64 KiB")
		}
	}
	if err := v.Err("INVALID_ARGUMENT", Domain); err != nil {
		return nil, err
	}
	stored, err := s.store.SetTool(ctx, proto.Clone(t).(*dispatcherv1.Tool), s.now())
	if err != nil {
		return nil, s.toStatus(ctx, err, "")
	}
	s.routines.forgetAgent(agent)
	return stored, nil
}

// ListTools implements DispatcherServiceServer.
func (s *Server) ListTools(ctx context.Context, req *dispatcherv1.ListToolsRequest) (*dispatcherv1.ListToolsResponse, error) {
	size, after, err := listParams(req.GetParent(), req.GetPageSize(), req.GetPageToken())
	if err != nil {
		return nil, err
	}
	list, err := s.store.ListTools(ctx, req.GetParent())
	if err != nil {
		return nil, s.toStatus(ctx, err, "")
	}
	page, next := paginate(list, (*dispatcherv1.Tool).GetName, after, size)
	resp := &dispatcherv1.ListToolsResponse{Tools: page}
	if next != "" {
		resp.NextPageToken = pagetoken.Encode(next, req.GetParent())
	}
	return resp, nil
}

// listParams validates a List request's parent, page size and token; it
// returns the page size and the key the page starts after.
func listParams(parent string, pageSize int32, pageToken string) (int, string, error) {
	var v grpcerr.Violations
	if !validAgentName(parent) {
		v.Add("parent", "must be clients/{client}/agents/{agent}")
	}
	size, ok := pagetoken.Size(pageSize, 50, 1000)
	if !ok {
		v.Add("page_size", "must not be negative")
	}
	after, err := pagetoken.Decode(pageToken, parent)
	if err != nil {
		v.Add("page_token", "is not a token from a previous call with the same parent")
	}
	return size, after, v.Err("INVALID_ARGUMENT", Domain)
}

// paginate returns the page of list (sorted by key) that starts after the
// key after, and the key to continue after ("" on the last page).
func paginate[T any](list []T, key func(T) string, after string, size int) ([]T, string) {
	if after != "" {
		i := sort.Search(len(list), func(i int) bool { return key(list[i]) > after })
		list = list[i:]
	}
	if len(list) <= size {
		return list, ""
	}
	return list[:size], key(list[size-1])
}
