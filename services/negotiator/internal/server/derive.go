package server

import (
	"context"
	"errors"
	"fmt"

	negotiatorv1 "github.com/parleyhq/parley/gen/parley/negotiator/v1"
	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/services/negotiator/internal/negotiation"
	"github.com/parleyhq/parley/services/negotiator/internal/protocol"
	"github.com/parleyhq/parley/services/negotiator/internal/routine"
)

// DeriveProtocol implements NegotiatorService. It needs no LLM.
func (s *Server) DeriveProtocol(ctx context.Context, req *negotiatorv1.DeriveProtocolRequest) (*negotiatorv1.DeriveProtocolResponse, error) {
	var v grpcerr.Violations
	checkTask(&v, req.GetTask(), true)
	if t := req.GetTask(); t != nil {
		checkJSON(&v, "task.input_schema_json", t.GetInputSchemaJson())
		checkJSON(&v, "task.output_schema_json", t.GetOutputSchemaJson())
	}
	if req.GetTool() != nil {
		checkTools(&v, "tool", []*negotiatorv1.ToolSpec{req.GetTool()})
	}
	if err := invalid(v); err != nil {
		return nil, err
	}
	task := taskOf(req.GetTask())
	pd, err := negotiation.DeriveProtocol(*task)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	doc, err := protocol.Parse(pd)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	resp := &negotiatorv1.DeriveProtocolResponse{Protocol: pd, ProtocolSha1Hex: protocol.SHA1Hex(pd), ProtocolSha256Hex: protocol.SHA256Hex(pd)}
	if resp.SenderRoutine, err = s.deriveSender(ctx, doc, task); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	if req.GetTool() != nil {
		tool := toolsOf([]*negotiatorv1.ToolSpec{req.GetTool()})[0]
		if resp.ReceiverRoutine, err = s.deriveReceiver(ctx, doc, tool); err != nil {
			return nil, s.toStatus(ctx, err)
		}
	}
	return resp, nil
}

// deriveSender derives and tests the sender's routine.
func (s *Server) deriveSender(ctx context.Context, doc protocol.Document, task *negotiation.Task) (string, error) {
	var in, out []byte
	if task != nil {
		in, out = task.Input, task.Output
	}
	src, err := routine.DeriveSender(doc, in, out)
	if err != nil {
		return "", err
	}
	if _, err := routine.VerifySender(ctx, s.opts.Tester, src, doc, in, out); err != nil {
		return "", verifyErr(err)
	}
	return src, nil
}

// deriveReceiver derives and tests the receiver's routine for one tool.
func (s *Server) deriveReceiver(ctx context.Context, doc protocol.Document, tool routine.Tool) (string, error) {
	src, err := routine.DeriveReceiver(doc, tool)
	if err != nil {
		return "", err
	}
	if _, err := routine.VerifyReceiver(ctx, s.opts.Tester, src, doc, []routine.Tool{tool}); err != nil {
		return "", verifyErr(err)
	}
	return src, nil
}

// GetNegotiationProtocol implements NegotiatorService.
func (s *Server) GetNegotiationProtocol(context.Context, *negotiatorv1.GetNegotiationProtocolRequest) (*negotiatorv1.GetNegotiationProtocolResponse, error) {
	return &negotiatorv1.GetNegotiationProtocolResponse{
		Protocol:          []byte(negotiation.PD),
		ProtocolSha1Hex:   negotiation.PDSHA1,
		ProtocolSha256Hex: negotiation.PDSHA256,
	}, nil
}

// verifyErr marks a routine that failed its test; an untested one (no
// dispatcher, or TestRoutine failed) keeps its own error.
func verifyErr(err error) error {
	if errors.Is(err, routine.ErrRoutine) {
		return fmt.Errorf("%w: %w", errRoutineFailed, err)
	}
	return err
}

// untested reports whether err means a routine could not be tested at all,
// which no retry or LLM rewrite fixes.
func untested(err error) bool {
	return errors.Is(err, routine.ErrNoTester) || errors.Is(err, routine.ErrTester)
}
