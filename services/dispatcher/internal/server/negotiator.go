package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	negotiatorv1 "github.com/parleyhq/parley/gen/parley/negotiator/v1"
	"github.com/parleyhq/parley/platform/grpcerr"
)

// maxToolRounds bounds the tool calls one LLM reply may ask for; the
// negotiator makes the model answer after as many results.
const maxToolRounds = 5

// NegotiatorLLM is the production LLM: each purpose maps to a negotiator
// RPC, which talks to the configured model and records the call in its
// ledger under the agent and the peer.
//
//	reply (no PD)  ReplyNaturalLanguage, with the agent's tools
//	reply (PD)     ReplyWithProtocol, with the agent's tools
//	step           ReplyNaturalLanguage
//	send           ComposeQuery
//	parse          ParseReply
//	judge          CheckSuitability (its structured verdict: true or false)
//
// Tool calls the model asks for are run here with CallTool, at most
// maxToolRounds per reply. LLM_NOT_CONFIGURED becomes ErrNoLLM and
// LLM_BUDGET_EXHAUSTED wraps ErrLLMBudget.
type NegotiatorLLM struct {
	C negotiatorv1.NegotiatorServiceClient
}

// Complete implements LLM.
func (n NegotiatorLLM) Complete(ctx context.Context, req LLMRequest) (LLMResult, error) {
	peer := req.Peer
	if peer == "" {
		peer = "unknown"
	}
	task := &negotiatorv1.TaskSpec{Name: req.Task, Description: req.TaskDescription, InputSchemaJson: req.InputSchema, OutputSchemaJson: req.OutputSchema}
	if task.Name == "" {
		task.Name = "message"
	}
	input := req.Input
	if len(input) == 0 {
		input = json.RawMessage("null")
	}
	switch req.Purpose {
	case PurposeReply, PurposeStep, PurposeNegotiate:
		return n.reply(ctx, req, peer, input)
	case PurposeSend:
		r, err := n.C.ComposeQuery(ctx, &negotiatorv1.ComposeQueryRequest{Agent: req.Agent, Peer: peer, Task: task, TaskInputJson: input, Protocol: req.Protocol})
		if err != nil {
			return LLMResult{}, llmError(err)
		}
		return LLMResult{Output: r.GetBody()}, nil
	case PurposeParse:
		r, err := n.C.ParseReply(ctx, &negotiatorv1.ParseReplyRequest{Agent: req.Agent, Peer: peer, Task: task, Reply: input, Protocol: req.Protocol})
		if err != nil {
			return LLMResult{}, llmError(err)
		}
		return LLMResult{Output: r.GetOutputJson()}, nil
	case PurposeJudge:
		r, err := n.C.CheckSuitability(ctx, &negotiatorv1.CheckSuitabilityRequest{Agent: req.Agent, Peer: peer, Protocol: req.Protocol, Task: task})
		if err != nil {
			return LLMResult{}, llmError(err)
		}
		if r.GetFit() {
			return LLMResult{Output: json.RawMessage("true")}, nil
		}
		return LLMResult{Output: json.RawMessage("false")}, nil
	}
	return LLMResult{}, fmt.Errorf("unknown LLM purpose %q", req.Purpose)
}

func (n NegotiatorLLM) reply(ctx context.Context, req LLMRequest, peer string, input json.RawMessage) (LLMResult, error) {
	tools := make([]*negotiatorv1.ToolSpec, 0, len(req.Tools))
	for _, t := range req.Tools {
		tools = append(tools, &negotiatorv1.ToolSpec{Name: t.Name, Description: t.Description, InputSchemaJson: t.InputSchema, OutputSchemaJson: t.OutputSchema})
	}
	var results []*negotiatorv1.ToolResult
	for {
		var r *negotiatorv1.ReplyResponse
		var err error
		if len(req.Protocol) == 0 {
			r, err = n.C.ReplyNaturalLanguage(ctx, &negotiatorv1.ReplyNaturalLanguageRequest{Agent: req.Agent, Peer: peer, Query: input, Tools: tools, ToolResults: results})
		} else {
			r, err = n.C.ReplyWithProtocol(ctx, &negotiatorv1.ReplyWithProtocolRequest{Agent: req.Agent, Peer: peer, Query: input, Protocol: req.Protocol, Tools: tools, ToolResults: results})
		}
		if err != nil {
			return LLMResult{}, llmError(err)
		}
		call := r.GetToolCall()
		if call == nil {
			return LLMResult{Output: r.GetBody()}, nil
		}
		if len(results) >= maxToolRounds {
			return LLMResult{}, fmt.Errorf("the model asked for more than %d tool calls", maxToolRounds)
		}
		out := json.RawMessage(`{"error":"no such tool"}`)
		if req.CallTool != nil {
			res, err := req.CallTool(ctx, call.GetName(), call.GetArgumentsJson())
			switch {
			case err != nil:
				out, _ = json.Marshal(map[string]string{"error": err.Error()})
			case res == nil:
				out = json.RawMessage("null")
			default:
				out = res
			}
		}
		args := call.GetArgumentsJson()
		if len(args) == 0 {
			args = []byte("{}")
		}
		results = append(results, &negotiatorv1.ToolResult{Name: call.GetName(), ArgumentsJson: args, ResultJson: out})
	}
}

// llmError turns any negotiator error into the core's (LLM calls and
// negotiation alike): the LLM sentinels, one sentence for an unreachable
// negotiator, or an error carrying the status message only (the
// negotiator writes its messages for callers).
func llmError(err error) error {
	switch reason := grpcerr.Reason(err); {
	case reason == "LLM_NOT_CONFIGURED":
		return ErrNoLLM
	case reason == "LLM_BUDGET_EXHAUSTED":
		return fmt.Errorf("%w: %s", ErrLLMBudget, status.Convert(err).Message())
	case status.Code(err) == codes.Unavailable && reason == "":
		// The transport's own text names our addresses and resolver, and
		// this error reaches Agora peers (llm.Failure): one sentence only.
		return errors.New("the negotiator is unavailable; retry later")
	}
	return errors.New(status.Convert(err).Message())
}
