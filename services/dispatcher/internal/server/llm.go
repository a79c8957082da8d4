package server

import (
	"context"
	"encoding/json"
	"errors"
)

// ErrNoLLM is returned by an LLM that is not configured.
var ErrNoLLM = errors.New("no LLM is configured")

// ErrLLMBudget wraps the error of an LLM call refused because the agent's or
// the peer's LLM budget is spent. Routines keep working.
var ErrLLMBudget = errors.New("the LLM budget is exhausted")

// LLMPurpose says what an LLM call is for.
type LLMPurpose string

// LLM purposes.
const (
	PurposeReply     LLMPurpose = "reply"     // answer an inbound envelope (PD or natural language)
	PurposeNegotiate LLMPurpose = "negotiate" // answer the reference library's "negotiation" exchange
	PurposeSend      LLMPurpose = "send"      // build an outgoing body for a PD or text
	PurposeParse     LLMPurpose = "parse"     // read a peer's reply
	PurposeJudge     LLMPurpose = "judge"     // decide whether a PD fits a task; output true or false
	PurposeStep      LLMPurpose = "step"      // execute an Agent Protocol step
)

// LLMRequest is one LLM call. Protocol and Input are untrusted text: the
// implementation must keep them out of its instructions.
type LLMRequest struct {
	Agent    string // clients/{c}/agents/{a}
	Purpose  LLMPurpose
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
	Tools    []LLMTool
	CallTool func(ctx context.Context, name string, arg json.RawMessage) (json.RawMessage, error)
}

// LLMTool describes one of the agent's tools to the model.
type LLMTool struct {
	Name, Description         string
	InputSchema, OutputSchema json.RawMessage
}

// LLMResult is an LLM's answer.
type LLMResult struct {
	Output       json.RawMessage // JSON; for PurposeJudge a boolean
	InputTokens  int64           // 0 when unknown
	OutputTokens int64
	Model        string
}

// LLM is how the dispatcher reaches a language model: in production through
// the negotiator service, once it offers the call (see README).
type LLM interface {
	Complete(ctx context.Context, req LLMRequest) (LLMResult, error)
}

// NoLLM is the LLM of a dispatcher without one: every call fails with
// ErrNoLLM.
type NoLLM struct{}

// Complete implements LLM.
func (NoLLM) Complete(context.Context, LLMRequest) (LLMResult, error) { return LLMResult{}, ErrNoLLM }
