// Package negotiation is the dispatcher's side of protocol negotiation:
// the negotiator service (which writes and reads the messages, with an LLM
// or deterministically) sits behind the Negotiator interface, and Install
// makes an agreed protocol usable: registered, the agent's routine
// installed, and on the receiving side the protocol supported. The inbound
// pipeline answers negotiation messages through it, and outbound drives
// the sending side.
//
// This is also where the agent network's protocol control belongs when it
// lands (see docs/architecture.md): dialogues and mailboxes get their own
// packages beside inbound and outbound, and what they agree on is
// installed here.
package negotiation

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"

	"github.com/parleyhq/parley/services/dispatcher/internal/hosted"
	"github.com/parleyhq/parley/services/dispatcher/internal/llm"
	"github.com/parleyhq/parley/services/dispatcher/internal/routine"
)

// PDHash is the SHA-1 of Parley's negotiation PD, the meta-protocol
// (propose, counter, accept, reject) negotiations run under as multiround
// Agora conversations. The negotiator owns its text; the dispatcher
// recognises the hash so that every hosted agent answers negotiations
// through its negotiator with no registry lookup.
const PDHash = "9ec699d26addfb295aeb7c7b7b014102cab38c6c"

// State is a negotiation's state.
type State int

// Negotiation states.
const (
	StateOther State = iota // failed, rejected or expired
	StateOpen
	StateAccepted
)

// Negotiation is one negotiation as the negotiator reports it.
type Negotiation struct {
	Name  string
	State State
	// Outbound is the message to send to the other side next, if any.
	Outbound json.RawMessage
	// Protocol, ProtocolHash and Routine are set once accepted: the agreed
	// PD and this side's routine for it (when one was derived), with the
	// check it must pass before it is installed.
	Protocol      []byte
	ProtocolHash  string
	Routine       string
	Check         hosted.Check
	FailureReason string
}

// Task describes what a Send wants, for the negotiator.
type Task struct {
	Name, Description         string
	InputSchema, OutputSchema json.RawMessage
}

// Negotiator is what the dispatcher needs of the negotiator service. Its
// errors are llm.ErrNoLLM, errors wrapping llm.ErrLLMBudget, or errors
// whose text is fit for the peer.
type Negotiator interface {
	// Start opens the sending side of a negotiation.
	Start(ctx context.Context, agent, peer string, task Task) (Negotiation, error)
	// Receive hands the negotiator the other side's message. For a new
	// negotiation (name ""), agent, peer and tools describe the receiver.
	Receive(ctx context.Context, name string, body json.RawMessage, agent, peer string, tools []llm.Tool) (Negotiation, error)
	// NegotiateAfter is how many sends of a task to a target go before a
	// negotiation through the LLMs.
	NegotiateAfter(ctx context.Context, task, target string) (int, error)
	// Protocol returns the negotiation PD's bytes.
	Protocol(ctx context.Context) ([]byte, error)
}

// Failure is the peer's sentence for a failed negotiator call.
func Failure(err error) string {
	switch {
	case errors.Is(err, llm.ErrNoLLM):
		return "it needs a language model and none is configured"
	case errors.Is(err, llm.ErrLLMBudget):
		return llm.Failure(err)
	}
	return err.Error()
}

// Registry is what Install needs of the protocol directory.
type Registry interface {
	Register(ctx context.Context, content []byte) error
	AddSupported(ctx context.Context, agent, hexHash string) error
}

// Install makes an agreed PD usable on this side: the registry stores it,
// this side's routine (when the negotiator derived one) is installed, and
// on the receiving side the PD joins the agent's supported protocols.
func Install(ctx context.Context, reg Registry, routines *hosted.Set, logger *slog.Logger, agent string, n Negotiation, receiver bool) error {
	ctx = context.WithoutCancel(ctx) // half an installation helps nobody
	if err := reg.Register(ctx, n.Protocol); err != nil {
		return err
	}
	src := n.Routine
	if src != "" {
		// The negotiator wrote the routine but runs nothing: it is checked
		// here, in the runtime that will serve it, in the share of the
		// workers of the agent it is for (not the dry runs' shared one, which
		// anyone's runaways may hold). One that fails is left out and the
		// LLM answers instead, as with no routine at all.
		err := routines.Check(routine.WithAgent(ctx, agent), src, n.Check)
		if errors.Is(err, hosted.ErrCheckFailed) {
			logger.WarnContext(ctx, "negotiated routine not installed: it failed its check", slog.String("agent", agent),
				slog.String("protocol", n.ProtocolHash), slog.String("negotiation", n.Name), slog.Any("err", err))
			src = ""
		} else if err != nil {
			return fmt.Errorf("check the routine: %w", err)
		}
	}
	if src != "" {
		if _, err := routines.Install(ctx, hosted.Name(agent, n.ProtocolHash), src); err != nil {
			return fmt.Errorf("install the routine: %w", err)
		}
	}
	if receiver {
		if err := reg.AddSupported(ctx, agent, n.ProtocolHash); err != nil {
			return err
		}
	}
	logger.InfoContext(ctx, "negotiated protocol installed", slog.String("agent", agent), slog.String("protocol", n.ProtocolHash),
		slog.String("negotiation", n.Name), slog.Bool("routine", src != ""))
	return nil
}
