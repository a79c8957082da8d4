package scheduler

import (
	"context"
	"errors"
	"fmt"
)

// Agent-level failures: a Runner wraps one of these when nothing about
// the step itself failed. The step then waits on its agent's list and is
// retried when the agent's next probe succeeds.
var (
	// ErrNoExecutor: the agent exists but nothing can run its steps yet
	// (no SDK handler connected, no steps routine, no LLM).
	ErrNoExecutor = errors.New("no executor")
	// ErrAgentUnavailable: the dispatcher does not know the agent.
	ErrAgentUnavailable = errors.New("agent unavailable")
	// ErrDispatcherUnavailable: the dispatcher cannot be reached.
	ErrDispatcherUnavailable = errors.New("dispatcher unavailable")
	// ErrLLMUnavailable: the agent's language model provider failed or
	// cannot be reached.
	ErrLLMUnavailable = errors.New("language model unavailable")
	// ErrNotSupported: the dispatcher cannot execute steps at all yet.
	ErrNotSupported = errors.New("step execution not supported")
)

// agentLevel reports whether err says nothing about the step itself.
func agentLevel(err error) bool {
	for _, s := range []error{ErrNoExecutor, ErrAgentUnavailable, ErrDispatcherUnavailable, ErrLLMUnavailable, ErrNotSupported} {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

// StepError is a failure of the step itself (its handler failed or timed
// out, its input was refused, ...): the step alone is retried, and after
// Options.MaxStepAttempts it completes with the failure as its output.
type StepError struct {
	Code    string // a short classification, e.g. "Aborted"
	Reason  string // a stable UPPER_SNAKE reason, when known
	Message string // one sentence for the step's reader
}

// Error returns the message with its code and, when known, its reason.
func (e *StepError) Error() string {
	if e.Reason != "" {
		return fmt.Sprintf("%s (%s, %s)", e.Message, e.Code, e.Reason)
	}
	return fmt.Sprintf("%s (%s)", e.Message, e.Code)
}

// Request is one step for an agent to execute.
type Request struct {
	Agent           string // clients/{client}/agents/{agent}
	TaskID, StepID  string
	TaskInput       string
	Input           string
	AdditionalInput []byte // a JSON object, or empty
}

// File is a file the agent produced with a step.
type File struct {
	FileName, RelativePath string
	Content                []byte
}

// Result is what the agent answered.
type Result struct {
	Output           string
	AdditionalOutput []byte // a JSON object, or empty
	IsLast           bool
	StepName         string
	Files            []File
}

// Runner executes a step on its agent. Errors wrap one of the agent-level
// sentinels, or are (or wrap) a *StepError; anything else counts as a
// step-level failure.
type Runner interface {
	RunStep(ctx context.Context, req Request) (*Result, error)
}
