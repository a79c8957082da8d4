// Package llm is the dispatcher's view of a language model: one Complete
// call per purpose, with the agent's tools. The production implementation
// (through the negotiator) is an adapter in internal/server; the dispatcher
// counts every call it makes with Counted.
package llm

import (
	"context"
	"encoding/json"
	"errors"
	"strings"

	"github.com/parleyhq/parley/services/dispatcher/internal/metrics"
)

// ErrNoLLM is returned by an LLM that is not configured.
var ErrNoLLM = errors.New("no LLM is configured")

// ErrLLMBudget wraps the error of an LLM call refused because the agent's or
// the peer's LLM budget is spent. Routines keep working.
var ErrLLMBudget = errors.New("the LLM budget is exhausted")

// Purpose says what an LLM call is for.
type Purpose string

// LLM purposes.
const (
	PurposeReply     Purpose = "reply"     // answer an inbound envelope (PD or natural language)
	PurposeNegotiate Purpose = "negotiate" // answer the reference library's "negotiation" exchange
	PurposeSend      Purpose = "send"      // build an outgoing body for a PD or text
	PurposeParse     Purpose = "parse"     // read a peer's reply
	PurposeJudge     Purpose = "judge"     // decide whether a PD fits a task; output true or false
	PurposeStep      Purpose = "step"      // execute an Agent Protocol step
)

// Request is one LLM call. Protocol and Input are untrusted text: the
// implementation must keep them out of its instructions.
type Request struct {
	Agent    string // clients/{c}/agents/{a}
	Purpose  Purpose
	Protocol []byte          // the PD's bytes; nil for natural language
	Task     string          // the task name, when sending
	Input    json.RawMessage // the body, task data or step input

	// Peer is the other side: the caller's address when receiving, the
	// target URL when sending. Budgets and the ledger are kept per peer.
	Peer string
	// TaskDescription, InputSchema and OutputSchema describe the task when
	// the sender declared them (JSON Schemas, raw JSON).
	TaskDescription           string
	InputSchema, OutputSchema json.RawMessage
	// Tools are the agent's tools the model may ask for when replying;
	// CallTool runs one (JSON argument in, JSON result out).
	Tools    []Tool
	CallTool func(ctx context.Context, name string, arg json.RawMessage) (json.RawMessage, error)
}

// Tool describes one of the agent's tools to the model.
type Tool struct {
	Name, Description         string
	InputSchema, OutputSchema json.RawMessage
}

// Result is an LLM's answer.
type Result struct {
	Output       json.RawMessage // JSON; for PurposeJudge a boolean
	InputTokens  int64           // 0 when unknown
	OutputTokens int64
	Model        string
}

// LLM is how the dispatcher reaches a language model: in production through
// the negotiator service.
type LLM interface {
	Complete(ctx context.Context, req Request) (Result, error)
}

// NoLLM is the LLM of a dispatcher without one: every call fails with
// ErrNoLLM.
type NoLLM struct{}

// Complete implements LLM.
func (NoLLM) Complete(context.Context, Request) (Result, error) { return Result{}, ErrNoLLM }

// Failure is the Agora failure text for a failed LLM call.
func Failure(err error) string {
	if errors.Is(err, ErrLLMBudget) {
		return "This agent's LLM budget is exhausted, so it cannot answer messages that need a language model now; messages following a protocol it has a routine for still work. " + strings.TrimPrefix(err.Error(), ErrLLMBudget.Error()+": ")
	}
	return "The language model could not answer: " + err.Error()
}

// Counted wraps an LLM: it counts every call made and its tokens, and
// checks that the output is JSON.
type Counted struct {
	LLM     LLM
	Metrics *metrics.Metrics
}

// Complete calls the LLM and counts the call and its tokens.
func (c Counted) Complete(ctx context.Context, req Request) (json.RawMessage, error) {
	res, err := c.LLM.Complete(ctx, req)
	if errors.Is(err, ErrNoLLM) || errors.Is(err, ErrLLMBudget) {
		return nil, err // no call was made
	}
	c.Metrics.LLMCalls.WithLabelValues(string(req.Purpose)).Inc()
	if res.InputTokens > 0 {
		c.Metrics.LLMTokens.WithLabelValues("input").Add(float64(res.InputTokens))
	}
	if res.OutputTokens > 0 {
		c.Metrics.LLMTokens.WithLabelValues("output").Add(float64(res.OutputTokens))
	}
	if err != nil {
		return nil, err
	}
	if len(res.Output) == 0 || !json.Valid(res.Output) {
		return nil, errors.New("the model's output is not JSON")
	}
	return res.Output, nil
}
