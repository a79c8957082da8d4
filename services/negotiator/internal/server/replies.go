package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"

	negotiatorv1 "github.com/parleyhq/parley/gen/parley/negotiator/v1"
	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/platform/jsondepth"
	"github.com/parleyhq/parley/services/negotiator/internal/protocol"
	"github.com/parleyhq/parley/services/negotiator/internal/routine"
	"github.com/parleyhq/parley/services/negotiator/internal/schema"
)

// bodyString encodes text as an Agora body: a JSON string.
func bodyString(text string) []byte {
	b, _ := json.Marshal(text)
	return b
}

// unwrapBody returns the JSON a body carries: a string's content when it
// holds JSON, else the body itself.
func unwrapBody(raw []byte) []byte {
	raw = bytes.TrimSpace(raw)
	var s string
	if len(raw) > 0 && raw[0] == '"' && json.Unmarshal(raw, &s) == nil && json.Valid([]byte(s)) {
		return []byte(s)
	}
	return raw
}

// decodeAnswer decodes a model's JSON answer (in a code fence or not) into
// v, refusing one nested past jsondepth.Max.
func decodeAnswer(text string, v any) error {
	text = stripFence(text)
	if err := jsondepth.CheckString(text, jsondepth.Max); err != nil {
		return err
	}
	return json.Unmarshal([]byte(text), v)
}

// stripFence removes one Markdown code fence around a JSON answer.
func stripFence(text string) string {
	t := strings.TrimSpace(text)
	if rest, ok := strings.CutPrefix(t, "```"); ok {
		rest = strings.TrimPrefix(rest, "json")
		if body, ok := strings.CutSuffix(strings.TrimSpace(rest), "```"); ok {
			return strings.TrimSpace(body)
		}
	}
	return t
}

// validateAgainst checks a JSON answer against a schema, as errOutputInvalid.
func validateAgainst(what string, raw json.RawMessage, text []byte) error {
	sch, err := schema.Compile(raw)
	if err != nil {
		return fmt.Errorf("%w: %s schema: %w", errOutputInvalid, what, err)
	}
	if err := sch.Validate(text); err != nil {
		return fmt.Errorf("%w: it does not match the %s schema", errOutputInvalid, what)
	}
	return nil
}

// ComposeQuery implements NegotiatorService.
func (s *Server) ComposeQuery(ctx context.Context, req *negotiatorv1.ComposeQueryRequest) (*negotiatorv1.ComposeQueryResponse, error) {
	var v grpcerr.Violations
	checkAgent(&v, req.GetAgent(), true)
	checkPeer(&v, req.GetPeer(), true)
	checkTask(&v, req.GetTask(), true)
	checkJSON(&v, "task_input_json", req.GetTaskInputJson())
	checkProtocol(&v, req.GetProtocol(), false)
	if err := invalid(v); err != nil {
		return nil, err
	}
	var reqSchema json.RawMessage
	if len(req.GetProtocol()) > 0 {
		doc, err := protocol.Parse(req.GetProtocol())
		if err != nil {
			return nil, s.toStatus(ctx, err)
		}
		reqSchema = doc.RequestSchema
	}
	resp, err := s.complete(ctx, req.GetAgent(), req.GetPeer(), "ComposeQuery", composePrompt(taskOf(req.GetTask()), req.GetTaskInputJson(), req.GetProtocol(), reqSchema))
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	text := resp.Text
	if len(reqSchema) > 0 {
		text = stripFence(text)
		if err := validateAgainst("request", reqSchema, []byte(text)); err != nil {
			return nil, s.toStatus(ctx, err)
		}
	}
	return &negotiatorv1.ComposeQueryResponse{Body: bodyString(text)}, nil
}

// ReplyNaturalLanguage implements NegotiatorService.
func (s *Server) ReplyNaturalLanguage(ctx context.Context, req *negotiatorv1.ReplyNaturalLanguageRequest) (*negotiatorv1.ReplyResponse, error) {
	var v grpcerr.Violations
	checkAgent(&v, req.GetAgent(), true)
	checkPeer(&v, req.GetPeer(), true)
	checkJSON(&v, "query", req.GetQuery())
	checkTools(&v, "tools", req.GetTools())
	if err := invalid(v); err != nil {
		return nil, err
	}
	return s.reply(ctx, "ReplyNaturalLanguage", req.GetAgent(), req.GetPeer(), req.GetInstructions(), req.GetQuery(), nil, req.GetTools(), req.GetToolResults())
}

// ReplyWithProtocol implements NegotiatorService.
func (s *Server) ReplyWithProtocol(ctx context.Context, req *negotiatorv1.ReplyWithProtocolRequest) (*negotiatorv1.ReplyResponse, error) {
	var v grpcerr.Violations
	checkAgent(&v, req.GetAgent(), true)
	checkPeer(&v, req.GetPeer(), true)
	checkJSON(&v, "query", req.GetQuery())
	checkProtocol(&v, req.GetProtocol(), true)
	checkTools(&v, "tools", req.GetTools())
	if err := invalid(v); err != nil {
		return nil, err
	}
	return s.reply(ctx, "ReplyWithProtocol", req.GetAgent(), req.GetPeer(), req.GetInstructions(), req.GetQuery(), req.GetProtocol(), req.GetTools(), req.GetToolResults())
}

func (s *Server) reply(ctx context.Context, op, agent, peer, instructions string, query, pd []byte, toolSpecs []*negotiatorv1.ToolSpec, results []*negotiatorv1.ToolResult) (*negotiatorv1.ReplyResponse, error) {
	var bodySchema json.RawMessage
	if len(pd) > 0 {
		doc, err := protocol.Parse(pd)
		if err != nil {
			return nil, s.toStatus(ctx, err)
		}
		bodySchema = doc.ResponseSchema
	}
	tools := toolsOf(toolSpecs)
	resp, err := s.complete(ctx, agent, peer, op, replyPrompt(instructions, query, pd, tools, results, bodySchema))
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	out, err := parseReplyAction(resp.Text, tools, len(results) < maxToolResults, bodySchema)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return out, nil
}

// parseReplyAction reads the LLM's structured reply: a tool call for a
// declared tool (while allowed), or a body (valid against bodySchema when
// the PD declares one).
func parseReplyAction(text string, tools []routine.Tool, allowTools bool, bodySchema json.RawMessage) (*negotiatorv1.ReplyResponse, error) {
	var a struct {
		Action    string          `json:"action"`
		Body      json.RawMessage `json:"body"`
		Tool      string          `json:"tool"`
		Arguments json.RawMessage `json:"arguments"`
	}
	if err := decodeAnswer(text, &a); err != nil {
		return nil, fmt.Errorf("%w: the reply is not a JSON object: %w", errOutputInvalid, err)
	}
	switch a.Action {
	case "call_tool":
		known := false
		for _, t := range tools {
			known = known || t.Name == a.Tool
		}
		if !allowTools || !known {
			return nil, fmt.Errorf("%w: it asked for tool %q, which is not available", errOutputInvalid, a.Tool)
		}
		args := a.Arguments
		if len(args) == 0 || string(args) == "null" {
			args = json.RawMessage(`{}`)
		}
		return &negotiatorv1.ReplyResponse{ToolCall: &negotiatorv1.ToolCall{Name: a.Tool, ArgumentsJson: args}}, nil
	case "reply":
	default:
		return nil, fmt.Errorf("%w: unknown action %q", errOutputInvalid, a.Action)
	}
	if len(bodySchema) > 0 {
		body := unwrapBody(a.Body)
		if err := validateAgainst("protocol response", bodySchema, body); err != nil {
			return nil, err
		}
		return &negotiatorv1.ReplyResponse{Body: bodyString(string(body))}, nil
	}
	var text2 string
	if json.Unmarshal(a.Body, &text2) == nil {
		return &negotiatorv1.ReplyResponse{Body: bodyString(text2)}, nil
	}
	if len(a.Body) == 0 {
		return nil, fmt.Errorf("%w: the reply has no body", errOutputInvalid)
	}
	return &negotiatorv1.ReplyResponse{Body: bodyString(string(a.Body))}, nil
}

// ParseReply implements NegotiatorService.
func (s *Server) ParseReply(ctx context.Context, req *negotiatorv1.ParseReplyRequest) (*negotiatorv1.ParseReplyResponse, error) {
	var v grpcerr.Violations
	checkAgent(&v, req.GetAgent(), true)
	checkPeer(&v, req.GetPeer(), true)
	checkTask(&v, req.GetTask(), true)
	if t := req.GetTask(); t != nil && len(t.GetOutputSchemaJson()) == 0 {
		v.Add("task.output_schema_json", "is required to parse a reply")
	}
	checkJSON(&v, "reply", req.GetReply())
	checkProtocol(&v, req.GetProtocol(), false)
	if err := invalid(v); err != nil {
		return nil, err
	}
	task := taskOf(req.GetTask())
	resp, err := s.complete(ctx, req.GetAgent(), req.GetPeer(), "ParseReply", parsePrompt(task, req.GetReply(), req.GetProtocol()))
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	out := []byte(stripFence(resp.Text))
	if err := validateAgainst("task output", task.Output, out); err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return &negotiatorv1.ParseReplyResponse{OutputJson: out}, nil
}
