package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	negotiatorv1 "github.com/parleyhq/parley/gen/parley/negotiator/v1"
	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/egress"
	"github.com/parleyhq/parley/services/dispatcher/internal/agora"
	"github.com/parleyhq/parley/services/dispatcher/internal/directory"
	"github.com/parleyhq/parley/services/dispatcher/internal/hosted"
	"github.com/parleyhq/parley/services/dispatcher/internal/llm"
	"github.com/parleyhq/parley/services/dispatcher/internal/negotiation"
	"github.com/parleyhq/parley/services/dispatcher/internal/notify"
	"github.com/parleyhq/parley/services/dispatcher/internal/shadow"
)

// NotificationSource adapts the registry's gRPC client to notify.Source.
func NotificationSource(c registryv1.RegistryServiceClient) notify.Source {
	return notificationSource{c}
}

type notificationSource struct {
	c registryv1.RegistryServiceClient
}

func (n notificationSource) Notifications(ctx context.Context, after, trimThrough uint64, limit int, wait time.Duration) ([]*registryv1.Notification, uint64, error) {
	resp, err := n.c.ListNotifications(ctx, &registryv1.ListNotificationsRequest{
		After: after, TrimThrough: trimThrough, PageSize: int32(min(limit, 1000)), Wait: durationpb.New(wait), //nolint:gosec // clamped to 1000
	})
	if err != nil {
		return nil, 0, err
	}
	return resp.GetNotifications(), resp.GetFirstSequence(), nil
}

// registryPeer adapts the registry's gRPC client to directory.Registry,
// translating its codes into the directory's sentinels at this edge.
type registryPeer struct {
	c registryv1.RegistryServiceClient
}

// registryError maps a registry status onto the directory's sentinels.
func registryError(err error) error {
	switch status.Code(err) {
	case codes.NotFound:
		return fmt.Errorf("%w: %s", directory.ErrNotFound, status.Convert(err).Message())
	case codes.InvalidArgument, codes.PermissionDenied, codes.ResourceExhausted, codes.FailedPrecondition:
		return fmt.Errorf("%w: %s", directory.ErrRefused, status.Convert(err).Message())
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		return fmt.Errorf("%w: %s", directory.ErrUnavailable, status.Convert(err).Message())
	}
	return fmt.Errorf("registry: %w", err)
}

func (r registryPeer) GetAgent(ctx context.Context, name string) (directory.Agent, error) {
	a, err := r.c.GetAgent(ctx, &registryv1.GetAgentRequest{Name: name})
	if err != nil {
		return directory.Agent{}, registryError(err)
	}
	e := directory.Agent{Name: a.GetName(), Supported: map[string]bool{}, Unsupported: map[string]bool{}}
	for _, p := range a.GetSupportedProtocols() {
		e.Supported[strings.ToLower(strings.TrimPrefix(p.GetProtocol(), "protocols/"))] = true
	}
	for _, p := range a.GetUnsupportedProtocols() {
		e.Unsupported[strings.ToLower(strings.TrimPrefix(p.GetProtocol(), "protocols/"))] = true
	}
	e.Implemented = a.GetSupportPolicy() == registryv1.SupportPolicy_SUPPORT_POLICY_IMPLEMENTED
	switch a.GetDialect() {
	case registryv1.Dialect_DIALECT_STD:
		e.Dialect = agora.Std
	case registryv1.Dialect_DIALECT_PYLIB:
		e.Dialect = agora.Pylib
	default:
		e.Dialect = agora.Spec2024
	}
	return e, nil
}

func (r registryPeer) ResolveProtocol(ctx context.Context, hash string, sources []string) (directory.Document, error) {
	pd, err := r.c.ResolveProtocol(ctx, &registryv1.ResolveProtocolRequest{Hash: hash, Sources: sources})
	if err != nil {
		return directory.Document{}, registryError(err)
	}
	return directory.Document{
		Hash: pd.GetSha1Hex(), Content: pd.GetContent(), Title: pd.GetTitle(), Description: pd.GetDescription(), Tags: pd.GetTags(),
		RequestSchema: pd.GetRequestSchemaJson(), ResponseSchema: pd.GetResponseSchemaJson(),
		StateMachine: pd.GetStateMachine(),
	}, nil
}

func (r registryPeer) CreateProtocol(ctx context.Context, content []byte) error {
	_, err := r.c.CreateProtocol(ctx, &registryv1.CreateProtocolRequest{Protocol: &registryv1.Protocol{Content: content}})
	if err != nil && status.Code(err) != codes.AlreadyExists {
		return registryError(err)
	}
	return nil
}

func (r registryPeer) AddSupportedProtocol(ctx context.Context, agent, hash string) error {
	_, err := r.c.AddSupportedProtocol(ctx, &registryv1.AddSupportedProtocolRequest{Name: agent, Protocol: hash})
	if err != nil {
		return registryError(err)
	}
	return nil
}

// agentChecker is hosted.Agents over the directory: an agent exists when
// the registry knows it.
type agentChecker struct{ dir *directory.Directory }

func (a agentChecker) Exists(ctx context.Context, name string) error {
	_, err := a.dir.RefreshAgent(ctx, name)
	return err
}

// checkOf is the check the negotiator wrote for a routine; an invalid
// example (not a JSON list) becomes an empty argument list, which fails
// the check.
func checkOf(c *negotiatorv1.RoutineCheck) hosted.Check {
	out := hosted.Check{Functions: c.GetFunctions()}
	for _, t := range c.GetTools() {
		out.Tools = append(out.Tools, hosted.CheckTool{Name: t.GetName(), InputSchema: string(t.GetInputSchemaJson()), Result: string(t.GetResultJson())})
	}
	for _, call := range c.GetCalls() {
		cc := hosted.CheckCall{Fn: call.GetFunction(), OutputSchema: string(call.GetOutputSchemaJson()), Optional: call.GetOptional()}
		for _, raw := range call.GetArgsJson() {
			var args []json.RawMessage
			_ = json.Unmarshal(raw, &args)
			cc.Examples = append(cc.Examples, args)
		}
		out.Calls = append(out.Calls, cc)
	}
	return out
}

// negotiatorPeer adapts the negotiator's gRPC client to
// negotiation.Negotiator.
type negotiatorPeer struct {
	c negotiatorv1.NegotiatorServiceClient
}

func fromNegotiation(n *negotiatorv1.Negotiation) negotiation.Negotiation {
	out := negotiation.Negotiation{
		Name: n.GetName(), Outbound: json.RawMessage(n.GetOutboundMessageJson()), Protocol: n.GetProtocol(),
		ProtocolHash: n.GetProtocolSha1Hex(), Routine: n.GetRoutine(), Check: checkOf(n.GetRoutineCheck()), FailureReason: n.GetFailureReason(),
	}
	switch n.GetState() {
	case negotiatorv1.NegotiationState_NEGOTIATION_STATE_OPEN:
		out.State = negotiation.StateOpen
	case negotiatorv1.NegotiationState_NEGOTIATION_STATE_ACCEPTED:
		out.State = negotiation.StateAccepted
	}
	return out
}

func (n negotiatorPeer) Start(ctx context.Context, agent, peer string, task negotiation.Task) (negotiation.Negotiation, error) {
	r, err := n.c.StartNegotiation(ctx, &negotiatorv1.StartNegotiationRequest{Agent: agent, Peer: peer, Task: &negotiatorv1.TaskSpec{
		Name: task.Name, Description: task.Description, InputSchemaJson: task.InputSchema, OutputSchemaJson: task.OutputSchema,
	}})
	if err != nil {
		return negotiation.Negotiation{}, llmError(err)
	}
	return fromNegotiation(r), nil
}

func (n negotiatorPeer) Receive(ctx context.Context, name string, body json.RawMessage, agent, peer string, tools []llm.Tool) (negotiation.Negotiation, error) {
	req := &negotiatorv1.ReceiveNegotiationMessageRequest{Name: name, BodyJson: body, Agent: agent, Peer: peer}
	for _, t := range tools {
		req.Tools = append(req.Tools, &negotiatorv1.ToolSpec{Name: t.Name, Description: t.Description, InputSchemaJson: t.InputSchema, OutputSchemaJson: t.OutputSchema})
	}
	r, err := n.c.ReceiveNegotiationMessage(ctx, req)
	if err != nil {
		return negotiation.Negotiation{}, llmError(err)
	}
	return fromNegotiation(r), nil
}

func (n negotiatorPeer) NegotiateAfter(ctx context.Context, task, target string) (int, error) {
	th, err := n.c.GetThresholds(ctx, &negotiatorv1.GetThresholdsRequest{Task: task, Target: target})
	if err != nil {
		return 0, llmError(err)
	}
	return int(th.GetNegotiateAfter()), nil
}

func (n negotiatorPeer) Protocol(ctx context.Context) ([]byte, error) {
	r, err := n.c.GetNegotiationProtocol(ctx, &negotiatorv1.GetNegotiationProtocolRequest{})
	if err != nil {
		return nil, llmError(err)
	}
	return r.GetProtocol(), nil
}

// candidatePeer adapts the negotiator's routine-candidate calls to
// shadow.Candidates.
type candidatePeer struct {
	c negotiatorv1.NegotiatorServiceClient
}

func fromCandidate(c *negotiatorv1.RoutineCandidate) shadow.Candidate {
	out := shadow.Candidate{Name: c.GetName(), Source: c.GetSource(), Check: checkOf(c.GetCheck()), Agreements: int(c.GetAgreements())}
	switch c.GetState() {
	case negotiatorv1.RoutineCandidateState_ROUTINE_CANDIDATE_STATE_SHADOW:
		out.State = shadow.StateShadow
	case negotiatorv1.RoutineCandidateState_ROUTINE_CANDIDATE_STATE_PROMOTED:
		out.State = shadow.StatePromoted
	}
	return out
}

func (p candidatePeer) Candidate(ctx context.Context, name string) (shadow.Candidate, error) {
	c, err := p.c.GetRoutineCandidate(ctx, &negotiatorv1.GetRoutineCandidateRequest{Name: name})
	if status.Code(err) == codes.NotFound {
		return shadow.Candidate{}, shadow.ErrNoCandidate
	}
	if err != nil {
		return shadow.Candidate{}, err
	}
	return fromCandidate(c), nil
}

func (p candidatePeer) Report(ctx context.Context, name string, r shadow.Result) (shadow.Candidate, error) {
	c, err := p.c.ReportShadowResult(ctx, &negotiatorv1.ReportShadowResultRequest{Name: name, Agreed: r.Agreed, Detail: r.Detail, CheckFailed: r.CheckFailed})
	if err != nil {
		return shadow.Candidate{}, err
	}
	return fromCandidate(c), nil
}

// newSendClient returns the HTTP client for outbound envelopes. Unless
// allowPrivate, it refuses to dial loopback, private, link-local and other
// internal addresses (platform/egress checks the dialed IP, so DNS
// rebinding cannot evade it), and it does not follow redirects. lookup,
// when set, replaces the system resolver (a test seam).
func newSendClient(allowPrivate bool, lookup egress.Lookup) *http.Client {
	dialer := &egress.Dialer{Timeout: 2 * time.Second, Lookup: lookup}
	if allowPrivate {
		dialer.Allow = egress.AllowAll
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DialContext = dialer.DialContext
	tr.Proxy = nil
	return &http.Client{
		Transport:     tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}
