package server

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/url"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/platform/auth"
	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/platform/pagetoken"
	"github.com/parleyhq/parley/services/dispatcher/internal/agora"
	"github.com/parleyhq/parley/services/dispatcher/internal/directory"
	"github.com/parleyhq/parley/services/dispatcher/internal/hub"
	"github.com/parleyhq/parley/services/dispatcher/internal/inbound"
	"github.com/parleyhq/parley/services/dispatcher/internal/outbound"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

// DeliverEnvelope implements DispatcherServiceServer: one Agora HTTP
// request in, the HTTP reply out, for a gateway that reaches the
// dispatcher over gRPC (in process the routes call the pipeline directly).
// Agora errors travel in the reply.
func (s *Server) DeliverEnvelope(ctx context.Context, req *dispatcherv1.DeliverEnvelopeRequest) (*dispatcherv1.DeliverEnvelopeResponse, error) {
	r := s.inbound.Deliver(ctx, inbound.Envelope{
		Agent: req.GetAgent(), Peer: req.GetPeer(), ConversationID: req.GetConversationId(),
		End: req.GetEndConversation(), JSON: req.GetEnvelopeJson(),
	})
	return &dispatcherv1.DeliverEnvelopeResponse{HttpStatus: int32(r.Status), ReplyJson: r.Body}, nil
}

// Send implements DispatcherServiceServer.
func (s *Server) Send(ctx context.Context, req *dispatcherv1.SendRequest) (*dispatcherv1.SendResponse, error) {
	var v grpcerr.Violations
	if !directory.ValidAgentName(req.GetAgent()) {
		v.Add("agent", "must be clients/{client}/agents/{agent}")
	}
	target, err := url.Parse(req.GetTargetUrl())
	if err != nil || (target.Scheme != "https" && target.Scheme != "http") || target.Host == "" {
		v.Add("target_url", "must be an absolute http or https URL")
	}
	if (req.GetTask() == "") == (req.GetText() == "") {
		v.Add("task", "exactly one of task and text must be set")
	}
	if req.GetTaskDataJson() != "" && !json.Valid([]byte(req.GetTaskDataJson())) {
		v.Add("task_data_json", "must be JSON")
	}
	for field, raw := range map[string]string{"input_schema_json": req.GetInputSchemaJson(), "output_schema_json": req.GetOutputSchemaJson()} {
		if raw != "" && !json.Valid([]byte(raw)) {
			v.Add(field, "must be JSON")
		}
	}
	if h := req.GetProtocolHash(); h != "" && !isHex40(strings.ToLower(h)) {
		v.Add("protocol_hash", "must be 40 hex characters")
	}
	dialect, derr := agora.ParseDialect(req.GetDialect())
	if derr != nil {
		v.Add("dialect", derr.Error())
	}
	if err := v.Err("INVALID_ARGUMENT", Domain); err != nil {
		return nil, err
	}
	r := outbound.Request{
		Agent: req.GetAgent(), TargetURL: req.GetTargetUrl(), Task: req.GetTask(), Text: req.GetText(),
		TaskDescription: req.GetTaskDescription(), ProtocolHash: strings.ToLower(req.GetProtocolHash()), Dialect: dialect,
	}
	if d := req.GetTaskDataJson(); d != "" {
		r.TaskData = json.RawMessage(d)
	}
	if v := req.GetInputSchemaJson(); v != "" {
		r.InputSchema = json.RawMessage(v)
	}
	if v := req.GetOutputSchemaJson(); v != "" {
		r.OutputSchema = json.RawMessage(v)
	}
	res, err := s.outbound.Send(ctx, r)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return &dispatcherv1.SendResponse{
		Status: res.Status, ResultJson: string(res.Body), ProtocolHash: res.ProtocolHash, Path: res.Path,
		Error: res.Error, Negotiation: res.Negotiation,
	}, nil
}

// ListSendCounts implements DispatcherServiceServer.
func (s *Server) ListSendCounts(ctx context.Context, req *dispatcherv1.ListSendCountsRequest) (*dispatcherv1.ListSendCountsResponse, error) {
	size, after, err := listParams(req.GetParent(), req.GetPageSize(), req.GetPageToken())
	if err != nil {
		return nil, err
	}
	list, err := s.store.ListSendCounts(ctx, req.GetParent())
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	// The store lists counts in (task, target) order: the key below sorts
	// the same way, as neither part holds a NUL.
	page, next := paginate(list, func(c store.SendCount) string { return c.Task + "\x00" + c.TargetURL }, after, size)
	resp := &dispatcherv1.ListSendCountsResponse{}
	if next != "" {
		resp.NextPageToken = pagetoken.Encode(next, req.GetParent())
	}
	for _, c := range page {
		resp.Counts = append(resp.Counts, &dispatcherv1.SendCount{Task: c.Task, TargetUrl: c.TargetURL, Conversations: c.Conversations, WithProtocol: c.WithProtocol})
	}
	return resp, nil
}

// ExecuteStep implements DispatcherServiceServer: a connected SDK handler,
// else the agent's step routine, else the LLM, else FAILED_PRECONDITION
// NO_EXECUTOR.
func (s *Server) ExecuteStep(ctx context.Context, req *dispatcherv1.ExecuteStepRequest) (*dispatcherv1.ExecuteStepResponse, error) {
	var v grpcerr.Violations
	if !directory.ValidAgentName(req.GetAgent()) {
		v.Add("agent", "must be clients/{client}/agents/{agent}")
	}
	if req.GetTaskId() == "" {
		v.Add("task_id", "must not be empty")
	}
	if req.GetStepId() == "" {
		v.Add("step_id", "must not be empty")
	}
	if addIn := req.GetAdditionalInputJson(); len(addIn) > 0 && !json.Valid(addIn) {
		v.Add("additional_input_json", "must be JSON")
	}
	if err := v.Err("INVALID_ARGUMENT", Domain); err != nil {
		return nil, err
	}
	resp, err := s.inbound.Step(ctx, inbound.Step{
		Agent: req.GetAgent(), TaskID: req.GetTaskId(), StepID: req.GetStepId(),
		TaskInput: req.GetTaskInput(), Input: req.GetInput(), AdditionalInput: req.GetAdditionalInputJson(),
	})
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return resp, nil
}

// Connect implements DispatcherServiceServer.
func (s *Server) Connect(stream dispatcherv1.DispatcherService_ConnectServer) error {
	err := s.hub.Serve(&connectStream{DispatcherService_ConnectServer: stream, admit: s.admit})
	var denied *admitError
	switch {
	case errors.As(err, &denied):
		return denied.status
	case err == nil:
		return nil
	case errors.Is(err, hub.ErrNoHello):
		return invalid("hello", "the first message must be a hello")
	case errors.Is(err, hub.ErrBadHello):
		field, desc, _ := strings.Cut(strings.TrimPrefix(err.Error(), hub.ErrBadHello.Error()+": "), " ")
		return invalid(field, desc)
	}
	return s.toStatus(stream.Context(), err)
}

// connectStream is the gRPC stream as the hub sees it: a client that hung
// up ends Recv with io.EOF, and the hello is admitted before the hub reads
// it.
type connectStream struct {
	dispatcherv1.DispatcherService_ConnectServer
	admit    func(ctx context.Context, agent string) error
	admitted bool
}

func (c *connectStream) Recv() (*dispatcherv1.ConnectRequest, error) {
	m, err := c.DispatcherService_ConnectServer.Recv()
	if status.Code(err) == codes.Canceled {
		return nil, io.EOF
	}
	if err == nil && !c.admitted {
		c.admitted = true
		if hello := m.GetHello(); hello != nil {
			if err := c.admit(c.Context(), hello.GetAgent()); err != nil {
				return nil, err
			}
		}
	}
	return m, err
}

// admitError carries the status refusing a hello through the hub.
type admitError struct{ status error }

func (e *admitError) Error() string { return status.Convert(e.status).Message() }

// admit binds a stream to the caller's key: an agent key may connect only
// its own agent (the operator any), and only an agent the registry holds.
// Both answers are PERMISSION_DENIED, so a caller cannot probe which agents
// exist. Without access control (no principal) anyone may connect any
// name, as before.
func (s *Server) admit(ctx context.Context, agent string) error {
	p, ok := auth.FromContext(ctx)
	if !ok {
		return nil
	}
	deny := func(why string) error {
		s.logger.WarnContext(ctx, "agent stream refused", slog.String("agent", agent), slog.String("principal", p.String()), slog.String("reason", why))
		return &admitError{grpcerr.New(codes.PermissionDenied, "this credential may not connect agent "+agent+"; connect with that agent's own key", "AGENT_STREAM_DENIED", Domain, map[string]string{"agent": agent})}
	}
	if p.Kind != auth.Operator && p.Agent != agent {
		return deny("not the key's agent")
	}
	if _, err := s.dir.RefreshAgent(ctx, agent); err != nil {
		if errors.Is(err, directory.ErrNotFound) {
			return deny("no such agent")
		}
		return err
	}
	return nil
}
