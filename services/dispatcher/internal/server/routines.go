package server

import (
	"context"
	"sort"
	"strings"

	"google.golang.org/protobuf/proto"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/platform/pagetoken"
	"github.com/parleyhq/parley/services/dispatcher/internal/directory"
	"github.com/parleyhq/parley/services/dispatcher/internal/pdschema"
	"github.com/parleyhq/parley/services/dispatcher/internal/routine"
)

// GetRoutine implements DispatcherServiceServer.
func (s *Server) GetRoutine(ctx context.Context, req *dispatcherv1.GetRoutineRequest) (*dispatcherv1.Routine, error) {
	if !validRoutineName(req.GetName()) {
		return nil, invalid("name", "must be clients/{client}/agents/{agent}/routines/{sha1-hex or steps}")
	}
	r, err := s.store.GetRoutine(ctx, req.GetName())
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return r, nil
}

// ListRoutines implements DispatcherServiceServer.
func (s *Server) ListRoutines(ctx context.Context, req *dispatcherv1.ListRoutinesRequest) (*dispatcherv1.ListRoutinesResponse, error) {
	var v grpcerr.Violations
	if !directory.ValidAgentName(req.GetParent()) {
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
		return nil, s.toStatus(ctx, err)
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
	if !validRoutineName(r.GetName()) {
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
	stored, err := s.routines.Install(ctx, r.GetName(), r.GetSource())
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return stored, nil
}

// SetTool implements DispatcherServiceServer.
func (s *Server) SetTool(ctx context.Context, req *dispatcherv1.SetToolRequest) (*dispatcherv1.Tool, error) {
	t := req.GetTool()
	var v grpcerr.Violations
	if _, ok := parseToolName(t.GetName()); !ok {
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
	stored, err := s.routines.SetTool(ctx, proto.Clone(t).(*dispatcherv1.Tool))
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
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
		return nil, s.toStatus(ctx, err)
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
	if !directory.ValidAgentName(parent) {
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
