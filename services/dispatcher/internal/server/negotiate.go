package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	negotiatorv1 "github.com/parleyhq/parley/gen/parley/negotiator/v1"
	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/services/dispatcher/internal/agora"
)

// NegotiationPDHash is the SHA-1 of Parley's negotiation PD, the
// meta-protocol (propose, counter, accept, reject) negotiations run under as
// multiround Agora conversations. The negotiator owns its text
// (GetNegotiationProtocol); the dispatcher recognises the hash so that every
// hosted agent answers negotiations through its negotiator with no registry
// lookup.
const NegotiationPDHash = "9ec699d26addfb295aeb7c7b7b014102cab38c6c"

// negotiationRetryAfter is how long a failed negotiation for a (agent,
// task, target) is not retried; Sends meanwhile go out in natural language.
const negotiationRetryAfter = 10 * time.Minute

// negotiationState is the receiving side's conversation memory during a
// negotiation.
type negotiationState struct {
	Negotiation string `json:"negotiation"`
	Installed   bool   `json:"installed,omitempty"`
}

// answerNegotiation hands one negotiation message (meta-protocol, or the
// reference library's free text) to the negotiator, with the agent's tools
// and their schemas, and answers with its reply. When the negotiation ends
// accepted, the agreed PD is registered, the receiver's routine installed
// and the PD added to the agent's supported protocols.
func (s *Server) answerNegotiation(ctx context.Context, agent *agentEntry, peer string, body, memIn json.RawMessage) (out, memory json.RawMessage, path, failure string) {
	name := agent.agent.GetName()
	var st negotiationState
	if len(memIn) > 0 {
		_ = json.Unmarshal(memIn, &st)
	}
	if peer == "" {
		peer = "unknown"
	}
	req := &negotiatorv1.ReceiveNegotiationMessageRequest{Name: st.Negotiation, BodyJson: body}
	if st.Negotiation == "" {
		req.Agent, req.Peer, req.Tools = name, peer, s.toolSpecs(ctx, name)
	}
	n, err := s.neg.ReceiveNegotiationMessage(ctx, req)
	if err != nil {
		s.logger.InfoContext(ctx, "negotiation message refused", slog.String("agent", name), slog.Any("err", err))
		return nil, memIn, pathFailure, "The negotiation cannot go on: " + negotiationFailure(err)
	}
	st.Negotiation = n.GetName()
	if n.GetState() == negotiatorv1.NegotiationState_NEGOTIATION_STATE_ACCEPTED && !st.Installed {
		if err := s.installAgreed(ctx, name, n, true); err != nil {
			s.logger.ErrorContext(ctx, "agreed protocol not installed", slog.String("agent", name), slog.String("negotiation", n.GetName()), slog.Any("err", err))
			return nil, memIn, pathFailure, "The protocol was agreed but could not be installed; retry later"
		}
		st.Installed = true
	}
	memory, _ = json.Marshal(st)
	out = n.GetOutboundMessageJson()
	if len(out) == 0 {
		out = json.RawMessage("null")
	}
	return out, memory, pathNegotiation, ""
}

func negotiationFailure(err error) string {
	lerr := llmError(err)
	if errors.Is(lerr, ErrNoLLM) {
		return "it needs a language model and none is configured"
	}
	if errors.Is(lerr, ErrLLMBudget) {
		return llmFailure(lerr)
	}
	return status.Convert(err).Message()
}

// installAgreed makes an agreed PD usable on this side: the registry stores
// it, this side's routine (when the negotiator derived one) is set, and on
// the receiving side the PD joins the agent's supported protocols.
func (s *Server) installAgreed(ctx context.Context, agent string, n *negotiatorv1.Negotiation, receiver bool) error {
	ctx = context.WithoutCancel(ctx) // half an installation helps nobody
	hexHash := n.GetProtocolSha1Hex()
	if _, err := s.registry.CreateProtocol(ctx, &registryv1.CreateProtocolRequest{Protocol: &registryv1.Protocol{Content: n.GetProtocol()}}); err != nil && status.Code(err) != codes.AlreadyExists {
		return fmt.Errorf("register the protocol: %w", err)
	}
	if src := n.GetRoutine(); src != "" {
		if _, err := s.SetRoutine(ctx, &dispatcherv1.SetRoutineRequest{Routine: &dispatcherv1.Routine{Name: routineName(agent, hexHash), Source: src}}); err != nil {
			return fmt.Errorf("set the routine: %w", err)
		}
	}
	if receiver {
		if _, err := s.registry.AddSupportedProtocol(ctx, &registryv1.AddSupportedProtocolRequest{Name: agent, Protocol: hexHash}); err != nil {
			return fmt.Errorf("add the supported protocol: %w", err)
		}
		s.agents.forget(agent)
	}
	s.logger.InfoContext(ctx, "negotiated protocol installed", slog.String("agent", agent), slog.String("protocol", hexHash),
		slog.String("negotiation", n.GetName()), slog.Bool("routine", n.GetRoutine() != ""))
	return nil
}

// toolSpecs describes agent's tools to the negotiator.
func (s *Server) toolSpecs(ctx context.Context, agent string) []*negotiatorv1.ToolSpec {
	list, err := s.store.ListTools(ctx, agent)
	if err != nil {
		s.logger.WarnContext(ctx, "tools not listed; negotiating without them", slog.String("agent", agent), slog.Any("err", err))
		return nil
	}
	out := make([]*negotiatorv1.ToolSpec, 0, len(list))
	for _, t := range list {
		out = append(out, &negotiatorv1.ToolSpec{
			Name:             lastSegment(t.GetName()),
			Description:      t.GetDescription(),
			InputSchemaJson:  []byte(t.GetInputSchemaJson()),
			OutputSchemaJson: []byte(t.GetOutputSchemaJson()),
		})
	}
	return out
}

// withTools gives an LLM reply the agent's tools and a way to run them.
func (s *Server) withTools(ctx context.Context, req LLMRequest) LLMRequest {
	for _, t := range s.toolSpecs(ctx, req.Agent) {
		req.Tools = append(req.Tools, LLMTool{Name: t.GetName(), Description: t.GetDescription(), InputSchema: t.GetInputSchemaJson(), OutputSchema: t.GetOutputSchemaJson()})
	}
	if len(req.Tools) == 0 {
		return req
	}
	agent := req.Agent
	req.CallTool = func(ctx context.Context, name string, arg json.RawMessage) (json.RawMessage, error) {
		tools, err := s.tools(ctx, agent)
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

// negotiationBackoff remembers failed negotiations so a Send does not
// renegotiate on every call.
type negotiationBackoff struct {
	mu    sync.Mutex
	until map[string]time.Time
}

func (b *negotiationBackoff) blocked(key string, now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	t, ok := b.until[key]
	return ok && now.Before(t)
}

func (b *negotiationBackoff) fail(key string, until time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.until == nil || len(b.until) > 10_000 {
		b.until = map[string]time.Time{}
	}
	b.until[key] = until
}

// maybeNegotiate runs a negotiation with the target when the thresholds say
// so, and returns the agreed PD's hash ("" to go on without one) and the
// negotiation's name. With input and output schemas it negotiates at first
// contact: the deterministic path costs no LLM call. Without, it negotiates
// through the LLMs once the agent has sent the task to the target
// negotiate_after times (GetThresholds).
func (s *Server) maybeNegotiate(ctx context.Context, agent, base string, d agora.Dialect, req *dispatcherv1.SendRequest, picked string) (string, string) {
	if s.neg == nil {
		return "", ""
	}
	task := &negotiatorv1.TaskSpec{Name: req.GetTask(), Description: req.GetTaskDescription(), InputSchemaJson: []byte(req.GetInputSchemaJson()), OutputSchemaJson: []byte(req.GetOutputSchemaJson())}
	schemas := len(task.InputSchemaJson) > 0 && len(task.OutputSchemaJson) > 0
	key := agent + "\x00" + req.GetTask() + "\x00" + base
	if s.backoff.blocked(key, s.now()) {
		return "", ""
	}
	if !schemas {
		if picked != "" {
			return "", "" // a PD fits; the LLM speaks it
		}
		th, err := s.neg.GetThresholds(ctx, &negotiatorv1.GetThresholdsRequest{Task: req.GetTask(), Target: base})
		if err != nil {
			return "", ""
		}
		if s.sendCount(ctx, agent, req.GetTask(), base)+1 < int64(th.GetNegotiateAfter()) {
			return "", ""
		}
	}
	n, err := s.negotiate(ctx, agent, base, d, task)
	if err != nil || n.GetState() != negotiatorv1.NegotiationState_NEGOTIATION_STATE_ACCEPTED {
		reason := n.GetFailureReason()
		if err != nil {
			reason = err.Error()
		}
		s.logger.InfoContext(ctx, "negotiation did not agree; sending without a negotiated protocol",
			slog.String("agent", agent), slog.String("target", base), slog.String("task", req.GetTask()), slog.String("reason", reason))
		s.backoff.fail(key, s.now().Add(negotiationRetryAfter))
		s.metrics.negotiations.WithLabelValues("failed").Inc()
		return "", n.GetName()
	}
	if err := s.installAgreed(ctx, agent, n, false); err != nil {
		s.logger.ErrorContext(ctx, "agreed protocol not installed", slog.String("agent", agent), slog.Any("err", err))
		s.metrics.negotiations.WithLabelValues("failed").Inc()
		return "", n.GetName()
	}
	s.wellknown.forget(base)
	s.metrics.negotiations.WithLabelValues("accepted").Inc()
	return n.GetProtocolSha1Hex(), n.GetName()
}

func (s *Server) sendCount(ctx context.Context, agent, task, base string) int64 {
	list, err := s.store.ListSendCounts(ctx, agent)
	if err != nil {
		return 0
	}
	for _, c := range list {
		if c.Task == task && c.TargetURL == base {
			return c.Conversations
		}
	}
	return 0
}

// negotiate runs the sending side of a negotiation: the negotiator writes
// each message, which goes to the target under the negotiation PD as a
// multiround Agora conversation, and the target's answers go back to the
// negotiator, until it is no longer our turn. The conversation is ended
// with DELETE.
func (s *Server) negotiate(ctx context.Context, agent, base string, d agora.Dialect, task *negotiatorv1.TaskSpec) (*negotiatorv1.Negotiation, error) {
	pd, err := s.negotiationPD(ctx)
	if err != nil {
		return nil, err
	}
	n, err := s.neg.StartNegotiation(ctx, &negotiatorv1.StartNegotiationRequest{Agent: agent, Peer: base, Task: task})
	if err != nil {
		return nil, errors.New(negotiationFailure(err))
	}
	target := base
	defer func() {
		if target != base {
			s.endRemoteConversation(ctx, target)
		}
	}()
	for n.GetState() == negotiatorv1.NegotiationState_NEGOTIATION_STATE_OPEN && len(n.GetOutboundMessageJson()) > 0 {
		rep, err := s.postTo(ctx, target, d, NegotiationPDHash, pd, n.GetOutboundMessageJson(), true)
		if err != nil {
			return n, err
		}
		if rep.conv != "" {
			target = base + "/conversations/" + rep.conv
		}
		if rep.status != "success" {
			msg := rep.err
			if msg == "" {
				msg = rep.status
			}
			return n, fmt.Errorf("the target did not take the negotiation: %s", msg)
		}
		body, _ := agora.Query(rep.body)
		if n, err = s.neg.ReceiveNegotiationMessage(ctx, &negotiatorv1.ReceiveNegotiationMessageRequest{Name: n.GetName(), BodyJson: body}); err != nil {
			return nil, errors.New(negotiationFailure(err))
		}
	}
	// Our answer closed the negotiation (we accepted a counter-proposal, or
	// rejected): the target still has to hear it, or it never installs the
	// PD.
	if n.GetState() != negotiatorv1.NegotiationState_NEGOTIATION_STATE_OPEN && len(n.GetOutboundMessageJson()) > 0 {
		rep, err := s.postTo(ctx, target, d, NegotiationPDHash, pd, n.GetOutboundMessageJson(), true)
		if n.GetState() != negotiatorv1.NegotiationState_NEGOTIATION_STATE_ACCEPTED {
			return n, nil // a rejection is best effort
		}
		if err != nil {
			return n, err
		}
		if rep.status != "success" {
			return n, fmt.Errorf("the target did not take our acceptance: %s %s", rep.status, rep.err)
		}
	}
	return n, nil
}

// negotiationPD returns the negotiation PD's bytes and makes sure our
// registry holds it (so /protocols/{hash} serves it to peers).
func (s *Server) negotiationPD(ctx context.Context) ([]byte, error) {
	s.negPDMu.Lock()
	defer s.negPDMu.Unlock()
	if s.negPD != nil {
		return s.negPD, nil
	}
	r, err := s.neg.GetNegotiationProtocol(ctx, &negotiatorv1.GetNegotiationProtocolRequest{})
	if err != nil {
		return nil, fmt.Errorf("the negotiation protocol is unavailable: %w", err)
	}
	if _, err := s.registry.CreateProtocol(ctx, &registryv1.CreateProtocolRequest{Protocol: &registryv1.Protocol{Content: r.GetProtocol()}}); err != nil && status.Code(err) != codes.AlreadyExists {
		s.logger.WarnContext(ctx, "negotiation PD not registered; peers get it as a data: URI only", slog.Any("err", err))
	}
	s.negPD = r.GetProtocol()
	return s.negPD, nil
}

// endRemoteConversation sends DELETE to a conversation URL, best effort.
func (s *Server) endRemoteConversation(ctx context.Context, u string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.SendTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, u, bytes.NewReader(nil))
	if err != nil {
		return
	}
	if resp, err := s.client.Do(req); err == nil {
		resp.Body.Close()
	}
}

func (s *Server) hasSender(ctx context.Context, agent, hexHash string) bool {
	r, err := s.routines.get(ctx, agent, strings.ToLower(hexHash))
	return err == nil && r.usable() && r.prog != nil && r.prog.Has("send")
}
