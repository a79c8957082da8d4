package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	negotiatorv1 "github.com/parleyhq/parley/gen/parley/negotiator/v1"
	"github.com/parleyhq/parley/platform/auth"
	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/platform/resource"
	"github.com/parleyhq/parley/services/negotiator/internal/negotiation"
	"github.com/parleyhq/parley/services/negotiator/internal/protocol"
	"github.com/parleyhq/parley/services/negotiator/internal/routine"
	"github.com/parleyhq/parley/services/negotiator/internal/suitability"
)

const negotiationPrefix = "negotiations/"

// StartNegotiation implements NegotiatorService.
func (s *Server) StartNegotiation(ctx context.Context, req *negotiatorv1.StartNegotiationRequest) (*negotiatorv1.Negotiation, error) {
	var v grpcerr.Violations
	checkAgent(&v, req.GetAgent(), true)
	checkPeer(&v, req.GetPeer(), true)
	checkTask(&v, req.GetTask(), true)
	if err := invalid(v); err != nil {
		return nil, err
	}
	now := timestamppb.New(s.opts.Now())
	n := &negotiatorv1.Negotiation{
		Name:       negotiationPrefix + s.opts.NewID(),
		Agent:      req.GetAgent(),
		Peer:       req.GetPeer(),
		Role:       negotiatorv1.NegotiationRole_NEGOTIATION_ROLE_SENDER,
		State:      negotiatorv1.NegotiationState_NEGOTIATION_STATE_OPEN,
		MaxRounds:  int32(s.opts.MaxRounds),
		Task:       req.GetTask(),
		CreateTime: now,
		UpdateTime: now,
	}
	task := taskOf(req.GetTask())
	var msg negotiation.Message
	if task.HasSchemas() {
		pd, err := negotiation.DeriveProtocol(*task)
		if err != nil {
			return nil, s.toStatus(ctx, err)
		}
		n.Mode = negotiatorv1.NegotiationMode_NEGOTIATION_MODE_DETERMINISTIC
		msg = negotiation.Message{Type: negotiation.TypePropose, Task: task, Protocol: string(pd)}
	} else {
		n.Mode = negotiatorv1.NegotiationMode_NEGOTIATION_MODE_LLM
		draft, err := s.llmTurn(ctx, n, negotiation.Sender, "")
		if err != nil {
			return nil, s.toStatus(ctx, err)
		}
		if draft.Protocol == "" {
			return nil, s.toStatus(ctx, fmt.Errorf("%w: the first proposal has no protocol", errOutputInvalid))
		}
		msg = negotiation.Message{Type: negotiation.TypePropose, Task: task, Protocol: draft.Protocol, Reason: draft.Reason}
	}
	m := negotiation.NewMachine(s.opts.MaxRounds)
	if err := m.Apply(negotiation.Sender, msg); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	s.record(n, m, msg.Encode(), true)
	n.OutboundMessageJson = msg.Encode()
	if err := s.store.CreateNegotiation(ctx, n); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return n, nil
}

// GetNegotiation implements NegotiatorService.
func (s *Server) GetNegotiation(ctx context.Context, req *negotiatorv1.GetNegotiationRequest) (*negotiatorv1.Negotiation, error) {
	if err := checkNegotiationName(req.GetName()); err != nil {
		return nil, err
	}
	n, err := s.ownedNegotiation(ctx, req.GetName())
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return n, nil
}

// ownedNegotiation reads the negotiation name for the caller, who must be
// its agent, that agent's client or the operator. The policy cannot check
// that, as a negotiation's name does not carry its agent. Another caller
// gets the error a missing negotiation gets, so it cannot learn whether
// one exists. Without access control (no principal) nothing is checked.
func (s *Server) ownedNegotiation(ctx context.Context, name string) (*negotiatorv1.Negotiation, error) {
	n, err := s.store.GetNegotiation(ctx, name)
	if err != nil {
		return nil, err
	}
	if p, on := auth.FromContext(ctx); on && !p.Owns(n.GetAgent()) {
		return nil, resource.NotFound("negotiation", name)
	}
	return n, nil
}

// mayOpenFor refuses to open a negotiation for an agent the caller is not
// (nor its client, nor the operator): the request names the agent, so the
// refusal is PERMISSION_DENIED, before anything is looked up.
func mayOpenFor(ctx context.Context, agent string) error {
	if p, on := auth.FromContext(ctx); on && !p.Owns(agent) {
		return grpcerr.New(codes.PermissionDenied, "this credential may not negotiate for agent "+agent+"; call with that agent's key, its client's key or the operator token", "AGENT_NOT_OWNED", Domain, map[string]string{"agent": agent})
	}
	return nil
}

func checkNegotiationName(name string) error {
	var v grpcerr.Violations
	id, ok := strings.CutPrefix(name, negotiationPrefix)
	if !ok || id == "" || strings.Contains(id, "/") {
		v.Add("name", "must look like negotiations/{negotiation}")
	}
	return invalid(v)
}

// ReceiveNegotiationMessage implements NegotiatorService.
func (s *Server) ReceiveNegotiationMessage(ctx context.Context, req *negotiatorv1.ReceiveNegotiationMessageRequest) (*negotiatorv1.Negotiation, error) {
	var v grpcerr.Violations
	if req.GetName() == "" {
		checkAgent(&v, req.GetAgent(), true)
		checkPeer(&v, req.GetPeer(), true)
	} else if err := checkNegotiationName(req.GetName()); err != nil {
		return nil, err
	}
	checkJSON(&v, "body_json", req.GetBodyJson())
	checkTools(&v, "tools", req.GetTools())
	if err := invalid(v); err != nil {
		return nil, err
	}
	if req.GetName() == "" {
		if err := mayOpenFor(ctx, req.GetAgent()); err != nil {
			return nil, err
		}
		return s.openReceiver(ctx, req)
	}
	stored, err := s.ownedNegotiation(ctx, req.GetName())
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	if stored.GetState() != negotiatorv1.NegotiationState_NEGOTIATION_STATE_OPEN {
		return nil, s.toStatus(ctx, negotiation.ErrClosed)
	}
	n := proto.CloneOf(stored)
	if n.GetMode() == negotiatorv1.NegotiationMode_NEGOTIATION_MODE_REFERENCE {
		if err := s.referenceTurn(ctx, n, req.GetBodyJson()); err != nil {
			return nil, s.toStatus(ctx, err)
		}
	} else if err := s.metaTurn(ctx, n, req.GetBodyJson()); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	n.UpdateTime = timestamppb.New(s.opts.Now())
	// LLM calls happened outside the transaction: write only if nobody
	// else advanced the negotiation meanwhile.
	out, err := s.store.UpdateNegotiation(ctx, n.GetName(), func(cur *negotiatorv1.Negotiation) error {
		if cur.GetRounds() != stored.GetRounds() || cur.GetState() != stored.GetState() {
			return errConflict
		}
		proto.Reset(cur)
		proto.Merge(cur, n)
		return nil
	})
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return out, nil
}

// openReceiver starts the receiving side on the first message.
func (s *Server) openReceiver(ctx context.Context, req *negotiatorv1.ReceiveNegotiationMessageRequest) (*negotiatorv1.Negotiation, error) {
	now := timestamppb.New(s.opts.Now())
	n := &negotiatorv1.Negotiation{
		Name:       negotiationPrefix + s.opts.NewID(),
		Agent:      req.GetAgent(),
		Peer:       req.GetPeer(),
		Role:       negotiatorv1.NegotiationRole_NEGOTIATION_ROLE_RECEIVER,
		State:      negotiatorv1.NegotiationState_NEGOTIATION_STATE_OPEN,
		MaxRounds:  int32(s.opts.MaxRounds),
		Tools:      req.GetTools(),
		CreateTime: now,
		UpdateTime: now,
	}
	var err error
	if negotiation.IsMetaMessage(req.GetBodyJson()) {
		n.Mode = negotiatorv1.NegotiationMode_NEGOTIATION_MODE_DETERMINISTIC
		err = s.metaTurn(ctx, n, req.GetBodyJson())
	} else {
		n.Mode = negotiatorv1.NegotiationMode_NEGOTIATION_MODE_REFERENCE
		err = s.referenceTurn(ctx, n, req.GetBodyJson())
	}
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	if err := s.store.CreateNegotiation(ctx, n); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return n, nil
}

func ourSide(n *negotiatorv1.Negotiation) negotiation.Side {
	if n.GetRole() == negotiatorv1.NegotiationRole_NEGOTIATION_ROLE_SENDER {
		return negotiation.Sender
	}
	return negotiation.Receiver
}

func otherSide(s negotiation.Side) negotiation.Side {
	if s == negotiation.Sender {
		return negotiation.Receiver
	}
	return negotiation.Sender
}

// machineOf rebuilds the state machine from a stored negotiation.
func machineOf(n *negotiatorv1.Negotiation) *negotiation.Machine {
	m := negotiation.NewMachine(int(n.GetMaxRounds()))
	m.Rounds = int(n.GetRounds())
	m.Proposal = string(n.GetProtocol())
	m.Task = taskOf(n.GetTask())
	if t := n.GetTranscript(); len(t) > 0 {
		last := otherSide(ourSide(n))
		if t[len(t)-1].GetSent() {
			last = ourSide(n)
		}
		m.Next = otherSide(last)
	}
	switch n.GetState() {
	case negotiatorv1.NegotiationState_NEGOTIATION_STATE_ACCEPTED:
		m.State = negotiation.Accepted
	case negotiatorv1.NegotiationState_NEGOTIATION_STATE_REJECTED:
		m.State = negotiation.Rejected
	case negotiatorv1.NegotiationState_NEGOTIATION_STATE_FAILED:
		m.State = negotiation.Failed
	}
	return m
}

// record appends a message to the transcript and copies the machine's state.
func (s *Server) record(n *negotiatorv1.Negotiation, m *negotiation.Machine, body []byte, sent bool) {
	n.Transcript = append(n.Transcript, &negotiatorv1.NegotiationMessage{Sent: sent, BodyJson: body, CreateTime: timestamppb.New(s.opts.Now())})
	n.Rounds = int32(m.Rounds)
	n.Protocol = []byte(m.Proposal)
	switch m.State {
	case negotiation.Open:
		n.State = negotiatorv1.NegotiationState_NEGOTIATION_STATE_OPEN
	case negotiation.Accepted:
		n.State = negotiatorv1.NegotiationState_NEGOTIATION_STATE_ACCEPTED
	case negotiation.Rejected:
		n.State = negotiatorv1.NegotiationState_NEGOTIATION_STATE_REJECTED
		n.FailureReason = m.Reason
	case negotiation.Failed:
		n.State = negotiatorv1.NegotiationState_NEGOTIATION_STATE_FAILED
		n.FailureReason = m.Reason
	}
	if m.Task != nil && n.Task == nil {
		n.Task = taskProto(m.Task)
	}
}

// metaTurn applies a peer's meta-protocol message and, while the
// negotiation stays open, this side's answer.
func (s *Server) metaTurn(ctx context.Context, n *negotiatorv1.Negotiation, body []byte) error {
	msg, err := negotiation.DecodeMessage(body)
	if err != nil {
		return err
	}
	m := machineOf(n)
	if err := m.Apply(otherSide(ourSide(n)), msg); err != nil {
		if errors.Is(err, negotiation.ErrMaxRounds) {
			s.record(n, m, body, false)
			n.OutboundMessageJson = nil
			return nil
		}
		return err
	}
	s.record(n, m, body, false)
	n.OutboundMessageJson = nil
	if m.State == negotiation.Open {
		var answer negotiation.Message
		if ourSide(n) == negotiation.Receiver {
			answer, err = s.receiverAnswer(ctx, n, m)
		} else {
			answer, err = s.senderAnswer(ctx, n, m)
		}
		if err != nil {
			return err
		}
		if answer.Type == negotiation.TypeAccept {
			answer.ProtocolHash = protocol.SHA1Hex([]byte(answer.Protocol))
		}
		if err := m.Apply(ourSide(n), answer); errors.Is(err, negotiation.ErrMaxRounds) {
			answer = negotiation.Message{Type: negotiation.TypeReject, Reason: "the negotiation reached its maximum rounds"}
			m = machineOf(n)
			err = m.Apply(ourSide(n), answer)
			if err != nil {
				return err
			}
		} else if err != nil {
			return fmt.Errorf("%w: %w", errOutputInvalid, err)
		}
		s.record(n, m, answer.Encode(), true)
		n.OutboundMessageJson = answer.Encode()
	}
	if m.State == negotiation.Accepted {
		return s.accepted(ctx, n)
	}
	return nil
}

// receiverAnswer decides the receiver's answer to a proposal or counter:
// accept when one of its tools serves the PD's schemas (deterministic),
// else let the LLM negotiate, else reject.
func (s *Server) receiverAnswer(ctx context.Context, n *negotiatorv1.Negotiation, m *negotiation.Machine) (negotiation.Message, error) {
	candidate := m.Proposal
	if candidate == "" && m.Task != nil && m.Task.HasSchemas() {
		if pd, err := negotiation.DeriveProtocol(*m.Task); err == nil {
			candidate = string(pd)
		}
	}
	var reasons []string
	if candidate != "" {
		doc, err := protocol.Parse([]byte(candidate))
		if err == nil && len(doc.RequestSchema) > 0 && len(doc.ResponseSchema) > 0 {
			for _, tool := range toolsOf(n.GetTools()) {
				src, check, err := s.deriveReceiver(doc, tool)
				if err == nil {
					n.Routine, n.RoutineCheck = src, check
					return negotiation.Message{Type: negotiation.TypeAccept, Protocol: candidate}, nil
				}
				reasons = append(reasons, err.Error())
			}
		} else if err != nil {
			reasons = append(reasons, err.Error())
		} else {
			reasons = append(reasons, "the protocol declares no request and response schemas")
		}
	}
	if s.ledger.Configured() {
		n.Mode = negotiatorv1.NegotiationMode_NEGOTIATION_MODE_LLM
		return s.llmTurn(ctx, n, negotiation.Receiver, m.Proposal)
	}
	if len(reasons) == 0 {
		reasons = append(reasons, "there is no protocol to accept")
	}
	return negotiation.Message{Type: negotiation.TypeReject, Reason: "no tool serves the proposal and no LLM is configured: " + strings.Join(reasons, "; ")}, nil
}

// senderAnswer decides the sender's answer to a counter-proposal.
func (s *Server) senderAnswer(ctx context.Context, n *negotiatorv1.Negotiation, m *negotiation.Machine) (negotiation.Message, error) {
	task := taskOf(n.GetTask())
	reason := "the counter-proposal cannot be checked without an LLM"
	if doc, err := protocol.Parse([]byte(m.Proposal)); err == nil && task != nil && task.HasSchemas() && len(doc.RequestSchema) > 0 {
		_, err := routine.DeriveSender(doc, task.Input, task.Output)
		if err == nil {
			return negotiation.Message{Type: negotiation.TypeAccept, Protocol: m.Proposal}, nil
		}
		reason = err.Error()
	}
	if s.ledger.Configured() {
		n.Mode = negotiatorv1.NegotiationMode_NEGOTIATION_MODE_LLM
		return s.llmTurn(ctx, n, negotiation.Sender, m.Proposal)
	}
	return negotiation.Message{Type: negotiation.TypeReject, Reason: reason}, nil
}

// llmTurn asks this side's LLM for its next message. An accept that does
// not repeat the last proposal exactly becomes a counter.
func (s *Server) llmTurn(ctx context.Context, n *negotiatorv1.Negotiation, side negotiation.Side, proposal string) (negotiation.Message, error) {
	req := negotiationPrompt(side, taskOf(n.GetTask()), toolsOf(n.GetTools()), n.GetTranscript())
	resp, err := s.complete(ctx, n.GetAgent(), n.GetPeer(), "Negotiate", req)
	if err != nil {
		return negotiation.Message{}, err
	}
	var turn struct {
		Action   string `json:"action"`
		Protocol string `json:"protocol"`
		Reason   string `json:"reason"`
	}
	if err := decodeAnswer(resp.Text, &turn); err != nil {
		return negotiation.Message{}, fmt.Errorf("%w: the negotiation turn is not a JSON object", errOutputInvalid)
	}
	msg := negotiation.Message{Type: turn.Action, Protocol: turn.Protocol, Reason: turn.Reason}
	first := len(n.GetTranscript()) == 0
	switch {
	case first:
		msg.Type = negotiation.TypePropose
	case msg.Type == negotiation.TypeAccept && msg.Protocol == "":
		msg.Protocol = proposal
	case msg.Type == negotiation.TypeAccept && msg.Protocol != proposal:
		msg.Type = negotiation.TypeCounter
	case msg.Type == negotiation.TypePropose:
		msg.Type = negotiation.TypeCounter
	}
	if msg.Type == negotiation.TypeCounter && msg.Protocol == "" {
		return negotiation.Message{Type: negotiation.TypeReject, Reason: "no agreement: " + msg.Reason}, nil
	}
	return msg, nil
}

// accepted finishes an agreement on this side: hashes, this side's derived
// routine when the schemas allow one, and the acceptance recorded as this
// agent's suitability verdict for the PD.
func (s *Server) accepted(ctx context.Context, n *negotiatorv1.Negotiation) error {
	pd := n.GetProtocol()
	n.ProtocolSha1Hex = protocol.SHA1Hex(pd)
	n.ProtocolSha256Hex = protocol.SHA256Hex(pd)
	n.OutboundMessageJson = nil
	if last := n.GetTranscript(); len(last) > 0 && last[len(last)-1].GetSent() {
		n.OutboundMessageJson = last[len(last)-1].GetBodyJson()
	}
	in := suitability.Input{Protocol: pd}
	if doc, err := protocol.Parse(pd); err == nil && len(doc.RequestSchema) > 0 {
		if ourSide(n) == negotiation.Sender {
			if src, check, err := s.deriveSender(doc, taskOf(n.GetTask())); err == nil {
				n.Routine, n.RoutineCheck = src, check
			}
		} else if n.Routine == "" {
			for _, tool := range toolsOf(n.GetTools()) {
				if src, check, err := s.deriveReceiver(doc, tool); err == nil {
					n.Routine, n.RoutineCheck = src, check
					break
				}
			}
		}
	}
	if n.Routine == "" && n.GetMode() == negotiatorv1.NegotiationMode_NEGOTIATION_MODE_LLM {
		n.Routine, n.RoutineCheck = s.synthesizeAgreed(ctx, n)
	}
	if ourSide(n) == negotiation.Sender {
		in.Task = taskOf(n.GetTask())
	} else {
		in.Tools = toolsOf(n.GetTools())
	}
	return s.store.PutVerdict(ctx, suitability.CacheKey(in), &negotiatorv1.SuitabilityVerdict{
		Fit:     true,
		Reasons: []string{"accepted in " + n.GetName()},
		Source:  negotiatorv1.VerdictSource_VERDICT_SOURCE_NEGOTIATION,
	})
}

// referenceTurn handles the reference library's free-text negotiation on
// the receiving side: a message carrying FINALPROTOCOL ends it, otherwise
// the LLM answers in text.
func (s *Server) referenceTurn(ctx context.Context, n *negotiatorv1.Negotiation, body []byte) error {
	text := string(body)
	var str string
	if json.Unmarshal(body, &str) == nil {
		text = str
	}
	n.Transcript = append(n.Transcript, &negotiatorv1.NegotiationMessage{Sent: false, BodyJson: body, CreateTime: timestamppb.New(s.opts.Now())})
	n.Rounds++
	n.OutboundMessageJson = nil
	if pd, ok := negotiation.ExtractFinalProtocol(text); ok {
		n.Protocol = []byte(pd)
		n.State = negotiatorv1.NegotiationState_NEGOTIATION_STATE_ACCEPTED
		return s.accepted(ctx, n)
	}
	if n.GetRounds() >= n.GetMaxRounds() {
		n.State = negotiatorv1.NegotiationState_NEGOTIATION_STATE_FAILED
		n.FailureReason = negotiation.ErrMaxRounds.Error()
		return nil
	}
	resp, err := s.complete(ctx, n.GetAgent(), n.GetPeer(), "Negotiate", referencePrompt(toolsOf(n.GetTools()), n.GetTranscript()))
	if err != nil {
		return err
	}
	reply := bodyString(resp.Text)
	n.Transcript = append(n.Transcript, &negotiatorv1.NegotiationMessage{Sent: true, BodyJson: reply, CreateTime: timestamppb.New(s.opts.Now())})
	n.Rounds++
	n.OutboundMessageJson = reply
	if pd, ok := negotiation.ExtractFinalProtocol(resp.Text); ok {
		n.Protocol = []byte(pd)
		n.State = negotiatorv1.NegotiationState_NEGOTIATION_STATE_ACCEPTED
		return s.accepted(ctx, n)
	}
	return nil
}

// synthesizeAgreed has the programming LLM write this side's routine for a
// PD agreed through the LLMs (no schemas to derive one from), with its
// check, which the dispatcher runs before it uses the routine. It returns
// the source only when the candidate is promoted at once
// (--routine-shadow-calls 0); otherwise the candidate waits for its shadow
// calls and "" is returned. A failure leaves the agreement standing, with
// no routine: messages then go through the LLM.
func (s *Server) synthesizeAgreed(ctx context.Context, n *negotiatorv1.Negotiation) (string, *negotiatorv1.RoutineCheck) {
	req := &negotiatorv1.SynthesizeRoutineRequest{Agent: n.GetAgent(), Peer: n.GetPeer(), Protocol: n.GetProtocol(), Task: n.GetTask()}
	if ourSide(n) == negotiation.Sender {
		req.Side = negotiatorv1.RoutineSide_ROUTINE_SIDE_SENDER
	} else {
		req.Side, req.Tools = negotiatorv1.RoutineSide_ROUTINE_SIDE_RECEIVER, n.GetTools()
		if len(req.Tools) == 0 {
			return "", nil
		}
	}
	c, err := s.synthesize(ctx, req)
	if err != nil {
		s.logger.InfoContext(ctx, "no routine for the agreed protocol", slog.String("negotiation", n.GetName()), slog.Any("err", err))
		return "", nil
	}
	if c.GetState() != negotiatorv1.RoutineCandidateState_ROUTINE_CANDIDATE_STATE_PROMOTED {
		return "", nil
	}
	return c.GetSource(), c.GetCheck()
}
