package server

import (
	"context"

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
	if resp.SenderRoutine, resp.SenderRoutineCheck, err = s.deriveSender(doc, task); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	if req.GetTool() != nil {
		tool := toolsOf([]*negotiatorv1.ToolSpec{req.GetTool()})[0]
		if resp.ReceiverRoutine, resp.ReceiverRoutineCheck, err = s.deriveReceiver(doc, tool); err != nil {
			return nil, s.toStatus(ctx, err)
		}
	}
	return resp, nil
}

// deriveSender derives the sender's routine and its check.
func (s *Server) deriveSender(doc protocol.Document, task *negotiation.Task) (string, *negotiatorv1.RoutineCheck, error) {
	var in, out []byte
	if task != nil {
		in, out = task.Input, task.Output
	}
	src, err := routine.DeriveSender(doc, in, out)
	if err != nil {
		return "", nil, err
	}
	check, err := routine.SenderCheck(doc, in, out)
	if err != nil {
		return "", nil, err
	}
	return src, check, nil
}

// deriveReceiver derives the receiver's routine for one tool and its
// check.
func (s *Server) deriveReceiver(doc protocol.Document, tool routine.Tool) (string, *negotiatorv1.RoutineCheck, error) {
	src, err := routine.DeriveReceiver(doc, tool)
	if err != nil {
		return "", nil, err
	}
	check, err := routine.ReceiverCheck(doc, []routine.Tool{tool})
	if err != nil {
		return "", nil, err
	}
	return src, check, nil
}

// GetNegotiationProtocol implements NegotiatorService.
func (s *Server) GetNegotiationProtocol(context.Context, *negotiatorv1.GetNegotiationProtocolRequest) (*negotiatorv1.GetNegotiationProtocolResponse, error) {
	return &negotiatorv1.GetNegotiationProtocolResponse{
		Protocol:          []byte(negotiation.PD),
		ProtocolSha1Hex:   negotiation.PDSHA1,
		ProtocolSha256Hex: negotiation.PDSHA256,
	}, nil
}
