package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"google.golang.org/protobuf/types/known/timestamppb"

	negotiatorv1 "github.com/parleyhq/parley/gen/parley/negotiator/v1"
	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/services/negotiator/internal/negotiation"
	"github.com/parleyhq/parley/services/negotiator/internal/protocol"
	"github.com/parleyhq/parley/services/negotiator/internal/routine"
)

const candidatePrefix = "routineCandidates/"

// maxShadowDetail bounds ReportShadowResult's detail, kept as the
// candidate's rejection reason.
const maxShadowDetail = 8 << 10

func candidateName(agent, sha1 string, side negotiatorv1.RoutineSide) string {
	h := sha256.Sum256([]byte(agent + "\x00" + sha1 + "\x00" + side.String()))
	return candidatePrefix + hex.EncodeToString(h[:16])
}

// SynthesizeRoutine implements NegotiatorService.
func (s *Server) SynthesizeRoutine(ctx context.Context, req *negotiatorv1.SynthesizeRoutineRequest) (*negotiatorv1.RoutineCandidate, error) {
	return s.synthesize(ctx, req)
}

// synthesize validates req and makes its routine candidate: the work of
// SynthesizeRoutine, which an agreed negotiation does too. Errors are gRPC
// statuses.
func (s *Server) synthesize(ctx context.Context, req *negotiatorv1.SynthesizeRoutineRequest) (*negotiatorv1.RoutineCandidate, error) {
	var v grpcerr.Violations
	checkAgent(&v, req.GetAgent(), true)
	checkPeer(&v, req.GetPeer(), false)
	checkProtocol(&v, req.GetProtocol(), true)
	switch req.GetSide() {
	case negotiatorv1.RoutineSide_ROUTINE_SIDE_SENDER:
	case negotiatorv1.RoutineSide_ROUTINE_SIDE_RECEIVER:
		if len(req.GetTools()) == 0 {
			v.Add("tools", "a receiver routine needs at least one tool")
		}
	default:
		v.Add("side", "must be ROUTINE_SIDE_SENDER or ROUTINE_SIDE_RECEIVER")
	}
	checkTools(&v, "tools", req.GetTools())
	checkTask(&v, req.GetTask(), false)
	if err := invalid(v); err != nil {
		return nil, err
	}
	pd := req.GetProtocol()
	doc, err := protocol.Parse(pd)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	now := timestamppb.New(s.opts.Now())
	c := &negotiatorv1.RoutineCandidate{
		Name:            candidateName(req.GetAgent(), protocol.SHA1Hex(pd), req.GetSide()),
		Agent:           req.GetAgent(),
		ProtocolSha1Hex: protocol.SHA1Hex(pd),
		Side:            req.GetSide(),
		CreateTime:      now,
		UpdateTime:      now,
	}
	tools := toolsOf(req.GetTools())
	task := taskOf(req.GetTask())
	var in, out []byte
	if task != nil {
		in, out = task.Input, task.Output
	}
	if c.Check, err = routine.Check(doc, req.GetSide(), tools, in, out); err != nil {
		// A schema that does not compile: no example can be made.
		return nil, s.toStatus(ctx, fmt.Errorf("%w: %w", errRoutineFailed, err))
	}
	// Derivation first: it needs no LLM and is correct by construction,
	// so a derived routine is promoted at once (the dispatcher still runs
	// its check before installing it).
	if src, ok := s.tryDerive(doc, req.GetSide(), tools, task); ok {
		c.Source = src
		c.Origin = negotiatorv1.RoutineOrigin_ROUTINE_ORIGIN_DERIVED
		c.State = negotiatorv1.RoutineCandidateState_ROUTINE_CANDIDATE_STATE_PROMOTED
		return c, s.toStatus(ctx, s.store.PutRoutineCandidate(ctx, c))
	}
	var lastErr string
	for attempt := 0; attempt < 2; attempt++ {
		resp, err := s.complete(ctx, req.GetAgent(), req.GetPeer(), "SynthesizeRoutine", routinePrompt(req.GetSide(), pd, tools, task, lastErr))
		if err != nil {
			return nil, s.toStatus(ctx, err)
		}
		var out struct {
			Source string `json:"source"`
		}
		if err := decodeAnswer(resp.Text, &out); err != nil || strings.TrimSpace(out.Source) == "" {
			lastErr = "the answer was not a JSON object with a source"
			continue
		}
		// The negotiator runs no routine: it checks what it can without a
		// runtime, so the LLM hears at once what to fix; the dispatcher
		// runs the check's examples before it shadows the routine.
		if err := routine.Parses(out.Source, c.GetCheck().GetFunctions()...); err != nil {
			lastErr = err.Error()
			continue
		}
		c.Source = out.Source
		c.Origin = negotiatorv1.RoutineOrigin_ROUTINE_ORIGIN_LLM
		c.ShadowCallsRequired = int32(s.opts.ShadowCalls)
		c.State = negotiatorv1.RoutineCandidateState_ROUTINE_CANDIDATE_STATE_SHADOW
		if c.ShadowCallsRequired <= 0 {
			c.State = negotiatorv1.RoutineCandidateState_ROUTINE_CANDIDATE_STATE_PROMOTED
		}
		return c, s.toStatus(ctx, s.store.PutRoutineCandidate(ctx, c))
	}
	return nil, s.toStatus(ctx, fmt.Errorf("%w: %s", errRoutineFailed, lastErr))
}

// tryDerive derives a routine of side from the schemas, when they allow
// one.
func (s *Server) tryDerive(doc protocol.Document, side negotiatorv1.RoutineSide, tools []routine.Tool, task *negotiation.Task) (string, bool) {
	if len(doc.RequestSchema) == 0 || len(doc.ResponseSchema) == 0 {
		return "", false
	}
	if side == negotiatorv1.RoutineSide_ROUTINE_SIDE_SENDER {
		src, _, err := s.deriveSender(doc, task)
		return src, err == nil
	}
	for _, t := range tools {
		if src, _, err := s.deriveReceiver(doc, t); err == nil {
			return src, true
		}
	}
	return "", false
}

func checkCandidateName(name string) error {
	var v grpcerr.Violations
	id, ok := strings.CutPrefix(name, candidatePrefix)
	if !ok || id == "" || strings.Contains(id, "/") {
		v.Add("name", "must look like routineCandidates/{routine_candidate}")
	}
	return invalid(v)
}

// GetRoutineCandidate implements NegotiatorService.
func (s *Server) GetRoutineCandidate(ctx context.Context, req *negotiatorv1.GetRoutineCandidateRequest) (*negotiatorv1.RoutineCandidate, error) {
	if err := checkCandidateName(req.GetName()); err != nil {
		return nil, err
	}
	c, err := s.store.GetRoutineCandidate(ctx, req.GetName())
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return c, nil
}

// ReportShadowResult implements NegotiatorService.
func (s *Server) ReportShadowResult(ctx context.Context, req *negotiatorv1.ReportShadowResultRequest) (*negotiatorv1.RoutineCandidate, error) {
	if err := checkCandidateName(req.GetName()); err != nil {
		return nil, err
	}
	if len(req.GetDetail()) > maxShadowDetail {
		var v grpcerr.Violations
		v.Add("detail", fmt.Sprintf("must be at most %d bytes", maxShadowDetail))
		return nil, invalid(v)
	}
	c, err := s.store.UpdateRoutineCandidate(ctx, req.GetName(), func(c *negotiatorv1.RoutineCandidate) error {
		if req.GetCheckFailed() {
			c.UpdateTime = timestamppb.New(s.opts.Now())
			c.State = negotiatorv1.RoutineCandidateState_ROUTINE_CANDIDATE_STATE_REJECTED
			c.RejectionReason = "failed its check on the dispatcher: " + req.GetDetail()
			return nil
		}
		if c.GetState() != negotiatorv1.RoutineCandidateState_ROUTINE_CANDIDATE_STATE_SHADOW {
			return fmt.Errorf("%w: it is %s", errNotInShadow, c.GetState())
		}
		c.UpdateTime = timestamppb.New(s.opts.Now())
		if !req.GetAgreed() {
			c.State = negotiatorv1.RoutineCandidateState_ROUTINE_CANDIDATE_STATE_REJECTED
			c.RejectionReason = "disagreed with the LLM: " + req.GetDetail()
			return nil
		}
		c.Agreements++
		if c.GetAgreements() >= c.GetShadowCallsRequired() {
			c.State = negotiatorv1.RoutineCandidateState_ROUTINE_CANDIDATE_STATE_PROMOTED
		}
		return nil
	})
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return c, nil
}
