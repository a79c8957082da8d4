// Package sdk is the Go SDK for Parley agents. This first part connects an
// agent to the dispatcher over its Connect stream and answers what the
// dispatcher routes to it: Agora envelopes of the protocols the agent
// handles, natural-language envelopes, and Agent Protocol steps.
//
//	conn, _ := grpc.NewClient("127.0.0.1:9090", append(sdk.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
//	err := sdk.Connect(ctx, conn, "clients/acme/agents/weather",
//		sdk.Protocol("3a732bde0e63d2e838d1a722feebf3d67b52b211", func(ctx context.Context, e sdk.Envelope) (json.RawMessage, error) {
//			return json.RawMessage(`{"temperature":7,"precipitation":0,"weatherCondition":"sunny"}`), nil
//		}),
//		sdk.NaturalLanguage(func(ctx context.Context, e sdk.Envelope) (json.RawMessage, error) {
//			return json.Marshal("Ask me with the weather protocol.")
//		}),
//	)
//
// Connect blocks until ctx ends or the stream fails; callers reconnect. Each
// request runs in its own goroutine with a context that ends at the
// dispatcher's reply deadline. A handler error becomes an Agora failure for
// the peer (envelopes) or a failed step.
package sdk

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
)

// Envelope is an inbound Agora envelope routed to the agent.
type Envelope struct {
	// ProtocolHash is the protocol's SHA-1 in 40 lowercase hex characters;
	// empty for natural language.
	ProtocolHash string
	// Protocol is the protocol document's bytes, when there is one.
	Protocol []byte
	// Body is the envelope body, raw JSON.
	Body json.RawMessage
	// ConversationID is set within a multiround conversation.
	ConversationID string
}

// EnvelopeFunc answers an envelope with a reply body (raw JSON).
type EnvelopeFunc func(ctx context.Context, e Envelope) (json.RawMessage, error)

// Step is an Agent Protocol step to execute.
type Step struct {
	TaskID          string
	StepID          string
	TaskInput       string
	Input           string
	AdditionalInput json.RawMessage // a JSON object, possibly empty
}

// StepResult is the outcome of a step.
type StepResult struct {
	Output           string
	AdditionalOutput json.RawMessage // a JSON object, or nil
	IsLast           bool
	Name             string
	Artifacts        []*dispatcherv1.StepArtifact
}

// StepFunc executes a step.
type StepFunc func(ctx context.Context, s Step) (StepResult, error)

// Handler is something the agent handles; build one with Protocol,
// NaturalLanguage, Steps or OnReady.
type Handler struct {
	apply func(*agent)
}

type agent struct {
	protocols map[string]EnvelopeFunc // by lowercase hex
	hashes    []string                // as given, for the hello
	nl        EnvelopeFunc
	steps     StepFunc
	ready     func()
	key       string
}

// Protocol handles envelopes of one protocol, named by its SHA-1 as 40 hex
// characters.
func Protocol(sha1Hex string, fn EnvelopeFunc) Handler {
	return Handler{func(a *agent) {
		a.protocols[lower(sha1Hex)] = fn
		a.hashes = append(a.hashes, sha1Hex)
	}}
}

// NaturalLanguage handles envelopes without a protocol.
func NaturalLanguage(fn EnvelopeFunc) Handler { return Handler{func(a *agent) { a.nl = fn }} }

// Steps executes Agent Protocol steps.
func Steps(fn StepFunc) Handler { return Handler{func(a *agent) { a.steps = fn }} }

// OnReady is called once the dispatcher has accepted the connection and
// routes requests to it.
func OnReady(fn func()) Handler { return Handler{func(a *agent) { a.ready = fn }} }

// Key authenticates the stream with the agent's key (parley_ak_…), or the
// operator token. A server with access control refuses a stream without
// one.
func Key(secret string) Handler { return Handler{func(a *agent) { a.key = secret }} }

// ErrNotAuthorized is returned, wrapped, when the server refuses the
// stream's credential (UNAUTHENTICATED) or its agent (PERMISSION_DENIED).
// Retrying cannot help: fix the key or the agent name.
var ErrNotAuthorized = errors.New("the server refused this agent's credential")

// Connect attaches agent (clients/{client}/agents/{agent}) to the dispatcher
// reachable over conn and serves requests until ctx ends (returning nil) or
// the stream fails.
func Connect(ctx context.Context, conn grpc.ClientConnInterface, agentName string, handlers ...Handler) error {
	a := &agent{protocols: map[string]EnvelopeFunc{}}
	for _, h := range handlers {
		h.apply(a)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	callCtx := ctx
	if a.key != "" {
		callCtx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+a.key)
	}
	stream, err := dispatcherv1.NewDispatcherServiceClient(conn).Connect(callCtx)
	if err != nil {
		return connectError(err)
	}
	hello := &dispatcherv1.AgentHello{Agent: agentName, ProtocolHashes: a.hashes, NaturalLanguage: a.nl != nil, Steps: a.steps != nil}
	if err := stream.Send(&dispatcherv1.ConnectRequest{Kind: &dispatcherv1.ConnectRequest_Hello{Hello: hello}}); err != nil {
		if errors.Is(err, io.EOF) {
			// The server ended the stream; Recv says why.
			if _, err = stream.Recv(); err == nil {
				err = io.ErrUnexpectedEOF
			}
			return connectError(err)
		}
		return fmt.Errorf("connect: send hello: %w", err)
	}
	var sendMu sync.Mutex // serialises stream.Send
	send := func(m *dispatcherv1.ConnectRequest) {
		sendMu.Lock()
		defer sendMu.Unlock()
		_ = stream.Send(m) // a broken stream surfaces in Recv
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		m, err := stream.Recv()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled {
				return nil
			}
			return connectError(err)
		}
		switch k := m.GetKind().(type) {
		case *dispatcherv1.ConnectResponse_Ready:
			if a.ready != nil {
				a.ready()
			}
		case *dispatcherv1.ConnectResponse_Envelope:
			wg.Add(1)
			go func() {
				defer wg.Done()
				send(a.envelope(ctx, k.Envelope))
			}()
		case *dispatcherv1.ConnectResponse_Step:
			wg.Add(1)
			go func() {
				defer wg.Done()
				send(a.step(ctx, k.Step))
			}()
		}
	}
}

// connectError wraps a stream error, marking refusals with
// ErrNotAuthorized so that a caller's reconnect loop can stop.
func connectError(err error) error {
	switch status.Code(err) {
	case codes.Unauthenticated, codes.PermissionDenied:
		return fmt.Errorf("connect: %w: %s", ErrNotAuthorized, status.Convert(err).Message())
	}
	return fmt.Errorf("connect: %w", err)
}

func (a *agent) envelope(ctx context.Context, r *dispatcherv1.EnvelopeRequest) *dispatcherv1.ConnectRequest {
	rep := &dispatcherv1.EnvelopeReply{RequestId: r.GetRequestId()}
	out := &dispatcherv1.ConnectRequest{Kind: &dispatcherv1.ConnectRequest_EnvelopeReply{EnvelopeReply: rep}}
	fn := a.nl
	if r.GetProtocolHash() != "" {
		fn = a.protocols[r.GetProtocolHash()]
	}
	if fn == nil {
		rep.Error = "this agent has no handler for the message"
		return out
	}
	if dl := r.GetDeadline(); dl.IsValid() && dl.GetSeconds() > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, dl.AsTime())
		defer cancel()
	}
	body, err := fn(ctx, Envelope{ProtocolHash: r.GetProtocolHash(), Protocol: r.GetProtocolContent(), Body: r.GetBodyJson(), ConversationID: r.GetConversationId()})
	if err != nil {
		rep.Error = err.Error()
		return out
	}
	rep.BodyJson = body
	return out
}

func (a *agent) step(ctx context.Context, r *dispatcherv1.StepRequest) *dispatcherv1.ConnectRequest {
	rep := &dispatcherv1.StepReply{RequestId: r.GetRequestId()}
	out := &dispatcherv1.ConnectRequest{Kind: &dispatcherv1.ConnectRequest_StepReply{StepReply: rep}}
	if a.steps == nil {
		rep.Error = "this agent does not execute steps"
		return out
	}
	if dl := r.GetDeadline(); dl.IsValid() && dl.GetSeconds() > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, dl.AsTime())
		defer cancel()
	}
	res, err := a.steps(ctx, Step{TaskID: r.GetTaskId(), StepID: r.GetStepId(), TaskInput: r.GetTaskInput(), Input: r.GetInput(), AdditionalInput: r.GetAdditionalInputJson()})
	if err != nil {
		rep.Error = err.Error()
		return out
	}
	rep.Output, rep.AdditionalOutputJson, rep.IsLast, rep.StepName, rep.Artifacts = res.Output, res.AdditionalOutput, res.IsLast, res.Name, res.Artifacts
	return out
}

func lower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c >= 'A' && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}
