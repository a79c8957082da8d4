package server

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	negotiatorv1 "github.com/parleyhq/parley/gen/parley/negotiator/v1"
	"github.com/parleyhq/parley/platform/jsondepth"
	"github.com/parleyhq/parley/services/dispatcher/internal/agora"
	"github.com/parleyhq/parley/services/dispatcher/internal/pdschema"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

// DeliverEnvelope implements DispatcherServiceServer: one Agora HTTP request
// in, the HTTP reply out. It follows the reference's handling flowchart
// (specs/agora.md, section 9): no protocol → natural-language handler;
// unsupported → the dialect's rejection; supported → routine, else connected
// handler, else LLM; a failed routine falls back to the LLM.
func (s *Server) DeliverEnvelope(ctx context.Context, req *dispatcherv1.DeliverEnvelopeRequest) (*dispatcherv1.DeliverEnvelopeResponse, error) {
	start := time.Now()
	path, reply := s.deliver(ctx, req)
	if path != "" {
		s.metrics.envelopes.WithLabelValues(path).Inc()
		s.metrics.envelopeSeconds.WithLabelValues(path).Observe(time.Since(start).Seconds())
	}
	return &dispatcherv1.DeliverEnvelopeResponse{HttpStatus: int32(reply.Status), ReplyJson: reply.Body}, nil
}

func (s *Server) deliver(ctx context.Context, req *dispatcherv1.DeliverEnvelopeRequest) (string, agora.Reply) {
	peerDialect, peerFixed := s.opts.PeerDialects[req.GetPeer()]
	followUp := req.GetConversationId() != ""
	if !validAgentName(req.GetAgent()) {
		return pathFailure, peerDialect.UnknownAgent()
	}
	agent, err := s.agent(ctx, req.GetAgent())
	if err != nil {
		if status.Code(err) == codes.NotFound {
			return pathFailure, peerDialect.UnknownAgent()
		}
		s.logger.WarnContext(ctx, "agent lookup failed; answering with a fault", slog.String("agent", req.GetAgent()), slog.Any("err", err))
		return pathFailure, peerDialect.Fault("the agent directory is unavailable; retry later", followUp)
	}
	d := agent.dialect
	if peerFixed {
		d = peerDialect
	}

	if req.GetEndConversation() {
		return "", s.endConversation(ctx, req, d)
	}

	env, err := agora.Parse(req.GetEnvelopeJson())
	if err != nil {
		return pathFailure, d.Malformed(err.Error())
	}
	if env.Form == agora.HashBase64 && !peerFixed {
		d = agora.Pylib
	}

	var conv *store.Conversation
	hexHash := env.HexHash()
	negotiation := env.Form == agora.HashNegotiation
	if id := req.GetConversationId(); id != "" {
		c, err := s.store.GetConversation(ctx, id)
		if errors.Is(err, store.ErrNotFound) || err == nil && (c.Agent != req.GetAgent() || c.Peer != req.GetPeer()) {
			// Another caller's conversation is reported as unknown: ids are
			// bound to their participants and reveal nothing.
			return pathFailure, d.UnknownConversation()
		}
		if err != nil {
			s.logger.ErrorContext(ctx, "conversation lookup failed", slog.Any("err", err))
			return pathFailure, d.Fault("internal error", followUp)
		}
		if !s.now().Before(c.ExpireTime) {
			return pathFailure, d.Failure("Conversation expired", nil)
		}
		if negotiation && c.ProtocolHash != negotiationKey || env.Hash != nil && hexHash != c.ProtocolHash {
			return pathFailure, d.Malformed("a follow-up must not change the conversation's protocol")
		}
		hexHash = c.ProtocolHash
		if hexHash == negotiationKey {
			hexHash, negotiation = "", true
		}
		conv = &c
	}

	query, bodyWasString := agora.Query(env.Body)
	var memIn json.RawMessage
	if conv != nil {
		memIn = conv.Memory
	}
	// answer runs the paid or sandboxed part. It runs only after a new
	// conversation's slot is reserved, so a peer at its cap costs nothing.
	var answer func() (result, memory json.RawMessage, path, answerErr string)
	switch {
	case hexHash == "" && negotiation && s.neg != nil:
		// The reference library's "negotiation" exchange: the negotiator
		// answers; FINALPROTOCOL ends it.
		answer = func() (json.RawMessage, json.RawMessage, string, string) {
			return s.answerNegotiation(ctx, agent, req.GetPeer(), env.Body, memIn)
		}
	case hexHash == "":
		purpose := PurposeReply
		if negotiation {
			purpose = PurposeNegotiate
		}
		answer = func() (json.RawMessage, json.RawMessage, string, string) {
			result, path, answerErr := s.answerNL(ctx, req.GetAgent(), req.GetPeer(), purpose, env.Body, conv)
			return result, memIn, path, answerErr
		}
	case hexHash == NegotiationPDHash && s.neg != nil && !agent.unsupported[hexHash]:
		// Parley's negotiation PD: every hosted agent speaks it, through its
		// negotiator, with no registry lookup.
		answer = func() (json.RawMessage, json.RawMessage, string, string) {
			return s.answerNegotiation(ctx, agent, req.GetPeer(), query, memIn)
		}
	default:
		// Support is decided by hash alone, so check it before resolving:
		// a protocol this agent would reject is never fetched, which keeps
		// outsiders from making the registry fetch their URLs through it.
		if !s.supports(ctx, agent, hexHash) {
			return pathRejected, d.Unsupported(hashFor(env, hexHash))
		}
		pe, err := s.protocol(ctx, hexHash, env.Sources)
		if err != nil {
			switch status.Code(err) {
			case codes.NotFound, codes.InvalidArgument, codes.PermissionDenied, codes.ResourceExhausted, codes.FailedPrecondition:
				return pathRejected, d.Unsupported(hashFor(env, hexHash))
			}
			s.logger.WarnContext(ctx, "protocol resolution failed; answering with a fault", slog.String("protocol", hexHash), slog.Any("err", err))
			return pathFailure, d.Fault("the protocol registry is unavailable; retry later", followUp)
		}
		if pe.schemaErr != nil {
			return pathRejected, d.Unsupported(hashFor(env, hexHash))
		}
		if err := pdschema.Validate(pe.schemas.Request, query); err != nil {
			return pathFailure, d.Failure(err.Error(), convRef(conv))
		}
		answer = func() (json.RawMessage, json.RawMessage, string, string) {
			return s.answerPD(ctx, req.GetAgent(), req.GetPeer(), pe, query, memIn, conv)
		}
	}

	if conv == nil && env.Multiround {
		// Reserve the peer's conversation slot before answering.
		now := s.now()
		key := hexHash
		if negotiation {
			key = negotiationKey
		}
		c := store.Conversation{
			ID:           newConversationID(),
			Agent:        req.GetAgent(),
			Peer:         req.GetPeer(),
			ProtocolHash: key,
			CreateTime:   now,
			ExpireTime:   now.Add(s.opts.ConversationTTL),
		}
		err := s.store.CreateConversation(ctx, c, s.opts.MaxConversationsPerPeer, now)
		if errors.Is(err, store.ErrLimit) {
			return pathFailure, d.Failure(fmt.Sprintf("Too many open conversations: at most %d per peer; end some with DELETE", s.opts.MaxConversationsPerPeer), nil)
		}
		if err != nil {
			s.logger.ErrorContext(ctx, "conversation create failed", slog.Any("err", err))
			return pathFailure, d.Fault("internal error", followUp)
		}
		result, memory, path, answerErr := answer()
		if answerErr != "" {
			// The first answer failed: release the slot.
			if err := s.store.DeleteConversation(context.WithoutCancel(ctx), c.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
				s.logger.ErrorContext(ctx, "conversation release failed", slog.Any("err", err))
			}
			return pathFailure, d.Failure(answerErr, nil)
		}
		if memory != nil {
			err := s.store.UpdateConversation(ctx, c.ID, func(c *store.Conversation) error {
				c.Memory = memory
				return nil
			})
			if err != nil {
				s.logger.ErrorContext(ctx, "conversation update failed", slog.Any("err", err))
				return pathFailure, d.Fault("internal error", followUp)
			}
		}
		ref := &agora.Conversation{ID: c.ID, Expires: c.ExpireTime.Unix()}
		return path, d.Success(agora.BodyAs(result, bodyWasString || d == agora.Pylib), ref)
	}

	result, memory, path, answerErr := answer()
	var ref *agora.Conversation
	if conv != nil {
		exp := s.now().Add(s.opts.ConversationTTL)
		err := s.store.UpdateConversation(ctx, conv.ID, func(c *store.Conversation) error {
			c.ExpireTime = exp
			if memory != nil {
				c.Memory = memory
			}
			return nil
		})
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			s.logger.ErrorContext(ctx, "conversation update failed", slog.Any("err", err))
			return pathFailure, d.Fault("internal error", followUp)
		}
		ref = &agora.Conversation{ID: conv.ID, Expires: exp.Unix()}
	}
	if answerErr != "" {
		return pathFailure, d.Failure(answerErr, ref)
	}
	return path, d.Success(agora.BodyAs(result, bodyWasString || d == agora.Pylib), ref)
}

func convRef(c *store.Conversation) *agora.Conversation {
	if c == nil {
		return nil
	}
	return &agora.Conversation{ID: c.ID, Expires: c.ExpireTime.Unix()}
}

// hashFor spells a hash the way the request did.
func hashFor(env *agora.Envelope, hexHash string) string {
	if env.Form == agora.HashBase64 {
		return base64.StdEncoding.EncodeToString(env.Hash)
	}
	return hexHash
}

func (s *Server) endConversation(ctx context.Context, req *dispatcherv1.DeliverEnvelopeRequest, d agora.Dialect) agora.Reply {
	c, err := s.store.GetConversation(ctx, req.GetConversationId())
	if err == nil && c.Agent == req.GetAgent() && c.Peer == req.GetPeer() {
		err = s.store.DeleteConversation(ctx, c.ID)
	} else if err == nil {
		err = store.ErrNotFound
	}
	switch {
	case err == nil:
		return d.Ended()
	case errors.Is(err, store.ErrNotFound):
		if d == agora.Pylib {
			return d.Ended() // pylib: DELETE always answers 200
		}
		return d.UnknownConversation()
	default:
		s.logger.ErrorContext(ctx, "conversation delete failed", slog.Any("err", err))
		return d.Fault("internal error", true)
	}
}

// answerNL answers a natural-language envelope: the connected agent's
// natural-language handler, else the LLM, else a failure.
func (s *Server) answerNL(ctx context.Context, agent, peer string, purpose LLMPurpose, body json.RawMessage, conv *store.Conversation) (json.RawMessage, string, string) {
	if c := s.hub.nlHandler(agent); c != nil {
		out, err := s.callHandler(ctx, c, "", nil, body, conv)
		if err != nil {
			return nil, pathFailure, err.Error()
		}
		return out, pathHandler, ""
	}
	out, err := s.complete(ctx, s.withTools(ctx, LLMRequest{Agent: agent, Peer: peer, Purpose: purpose, Input: body}))
	if errors.Is(err, ErrNoLLM) {
		return nil, pathFailure, "This agent cannot answer natural-language messages: it has no connected handler and no LLM is configured. Use a protocol it supports."
	}
	if err != nil {
		return nil, pathFailure, llmFailure(err)
	}
	return out, pathLLM, ""
}

// answerPD answers a supported protocol: routine, else connected handler,
// else LLM reading the PD. A failed routine falls back to the handler and
// then the LLM.
//
// A reply may be the body's JSON value or a string holding a JSON object or
// list (what derived routines and the negotiator return); schemas check the
// JSON inside, and the dialect decides how it goes on the wire.
func (s *Server) answerPD(ctx context.Context, agent, peer string, pe *protocolEntry, query, memory json.RawMessage, conv *store.Conversation) (out, newMemory json.RawMessage, path, failure string) {
	hexHash := pe.pd.GetSha1Hex()
	check := func(out json.RawMessage) error {
		q, _ := agora.Query(out)
		return pdschema.Validate(pe.schemas.Response, q)
	}
	var routineErr error
	r, err := s.routines.get(ctx, agent, hexHash)
	if err != nil {
		s.logger.WarnContext(ctx, "routine lookup failed; trying the handler and LLM", slog.String("agent", agent), slog.Any("err", err))
	} else if r.usable() {
		mem := memory
		if mem == nil {
			mem = json.RawMessage("{}")
		}
		out, newMemory, routineErr = s.runRoutine(ctx, r, "reply", []json.RawMessage{query}, mem, check)
		if routineErr == nil {
			out, _ = agora.Query(out)
			return out, newMemory, pathRoutine, ""
		}
	}
	if c := s.hub.handlerFor(agent, hexHash); c != nil {
		out, err := s.callHandler(ctx, c, hexHash, pe.pd.GetContent(), query, conv)
		if err == nil {
			err = check(out)
		}
		if err != nil {
			return nil, memory, pathFailure, "The agent's handler failed: " + err.Error()
		}
		return out, memory, pathHandler, ""
	}
	out, err = s.complete(ctx, s.withTools(ctx, LLMRequest{Agent: agent, Peer: peer, Purpose: PurposeReply, Protocol: pe.pd.GetContent(), Input: query}))
	switch {
	case err == nil:
		if verr := check(out); verr != nil {
			return nil, memory, pathFailure, "The language model's reply does not fit the protocol: " + verr.Error()
		}
		out, _ = agora.Query(out)
		s.shadow(ctx, agent, hexHash, negotiatorv1.RoutineSide_ROUTINE_SIDE_RECEIVER, "reply", []json.RawMessage{query}, memory, out)
		return out, memory, pathLLM, ""
	case errors.Is(err, ErrNoLLM) && routineErr != nil:
		return nil, memory, pathFailure, "The routine for this protocol failed and no LLM is configured: " + routineErr.Error()
	case errors.Is(err, ErrNoLLM):
		return nil, memory, pathFailure, "This agent has no routine or connected handler for this protocol and no LLM is configured."
	case routineErr != nil:
		return nil, memory, pathFailure, "The routine for this protocol failed (" + routineErr.Error() + ") and the LLM fallback failed: " + llmFailure(err)
	default:
		return nil, memory, pathFailure, llmFailure(err)
	}
}

func (s *Server) callHandler(ctx context.Context, c *agentConn, hexHash string, pd []byte, body json.RawMessage, conv *store.Conversation) (json.RawMessage, error) {
	convID := ""
	if conv != nil {
		convID = conv.ID
	}
	r, err := c.call(ctx, s.opts.HandlerTimeout, func(id string, deadline *timestamppb.Timestamp) *dispatcherv1.ConnectResponse {
		return &dispatcherv1.ConnectResponse{Kind: &dispatcherv1.ConnectResponse_Envelope{Envelope: &dispatcherv1.EnvelopeRequest{
			RequestId: id, ProtocolHash: hexHash, BodyJson: body, ConversationId: convID, Deadline: deadline, ProtocolContent: pd,
		}}}
	})
	if err != nil {
		return nil, err
	}
	rep := r.GetEnvelopeReply()
	if rep.GetError() != "" {
		return nil, errors.New(rep.GetError())
	}
	out := json.RawMessage(rep.GetBodyJson())
	if len(out) == 0 {
		out = json.RawMessage("null")
	}
	if !json.Valid(out) {
		return nil, errors.New("the handler's body is not JSON")
	}
	if err := jsondepth.Check(out, jsondepth.Max); err != nil {
		return nil, fmt.Errorf("the handler's body: %w", err)
	}
	return out, nil
}

// complete calls the LLM and counts the call and its tokens.
func (s *Server) complete(ctx context.Context, req LLMRequest) (json.RawMessage, error) {
	res, err := s.llm.Complete(ctx, req)
	if errors.Is(err, ErrNoLLM) || errors.Is(err, ErrLLMBudget) {
		return nil, err // no call was made
	}
	s.metrics.llmCalls.WithLabelValues(string(req.Purpose)).Inc()
	if res.InputTokens > 0 {
		s.metrics.llmTokens.WithLabelValues("input").Add(float64(res.InputTokens))
	}
	if res.OutputTokens > 0 {
		s.metrics.llmTokens.WithLabelValues("output").Add(float64(res.OutputTokens))
	}
	if err != nil {
		return nil, err
	}
	if len(res.Output) == 0 || !json.Valid(res.Output) {
		return nil, errors.New("the model's output is not JSON")
	}
	return res.Output, nil
}

// newConversationID returns 128 random bits, URL-safe base64 (22 chars).
func newConversationID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// negotiationKey is the ProtocolHash of conversations running the reference
// library's "negotiation" exchange.
const negotiationKey = "negotiation"
