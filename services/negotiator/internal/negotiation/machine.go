package negotiation

import (
	"errors"
	"fmt"

	"github.com/parleyhq/parley/services/negotiator/internal/protocol"
)

// Sentinel errors of the state machine.
var (
	ErrClosed     = errors.New("negotiation is closed")
	ErrOutOfTurn  = errors.New("message out of turn")
	ErrMaxRounds  = errors.New("negotiation exceeded its maximum rounds")
	ErrHashDiffer = errors.New("accepted protocol differs from the last proposal")
)

// Side is a party to a negotiation.
type Side int

// The sides.
const (
	Sender Side = iota + 1
	Receiver
)

func (s Side) other() Side {
	if s == Sender {
		return Receiver
	}
	return Sender
}

// State is where a negotiation stands.
type State int

// The states.
const (
	Open State = iota + 1
	Accepted
	Rejected
	Failed
)

// Machine is the state of one negotiation, replayed from its messages. The
// zero value is not usable; use NewMachine.
type Machine struct {
	State     State
	Rounds    int
	MaxRounds int
	// Next is the side whose turn it is.
	Next Side
	// Proposal is the PD last proposed or countered, "" if none yet.
	Proposal string
	// Task is the task of the opening proposal.
	Task *Task
	// Reason is the last reject reason or failure.
	Reason string
}

// NewMachine starts a negotiation allowing maxRounds messages, both
// directions. The caller passes the config's cap for a new negotiation and
// the stored one when replaying; there is no default, and with zero the
// first message fails with ErrMaxRounds.
func NewMachine(maxRounds int) *Machine {
	return &Machine{State: Open, MaxRounds: maxRounds, Next: Sender}
}

// Apply records msg sent by from. It fails without changing the state when
// the message is not allowed; when it exceeds MaxRounds the negotiation
// becomes Failed and ErrMaxRounds is returned.
func (m *Machine) Apply(from Side, msg Message) error {
	if m.State != Open {
		return ErrClosed
	}
	if from != m.Next {
		return ErrOutOfTurn
	}
	first := m.Rounds == 0
	switch {
	case first && msg.Type != TypePropose:
		return fmt.Errorf("%w: the sender must open with propose", ErrOutOfTurn)
	case !first && msg.Type == TypePropose:
		return fmt.Errorf("%w: propose only opens a negotiation", ErrOutOfTurn)
	}
	if (msg.Type == TypeAccept || msg.Type == TypeCounter) && msg.Protocol == "" {
		return fmt.Errorf("%w: %s needs a protocol", ErrMalformed, msg.Type)
	}
	if msg.Type == TypeAccept {
		if m.Proposal != "" && msg.Protocol != m.Proposal {
			return ErrHashDiffer
		}
		// After a task-only proposal the receiver may accept with the
		// document it derived: that is its proposal and acceptance at once.
		if m.Proposal == "" && from == Sender {
			return fmt.Errorf("%w: nothing to accept", ErrOutOfTurn)
		}
		if msg.ProtocolHash != "" && msg.ProtocolHash != protocol.SHA1Hex([]byte(msg.Protocol)) {
			return fmt.Errorf("%w: protocolHash does not match protocol", ErrMalformed)
		}
	}
	if m.Rounds+1 > m.MaxRounds && msg.Type != TypeReject {
		m.State = Failed
		m.Reason = ErrMaxRounds.Error()
		return ErrMaxRounds
	}
	m.Rounds++
	m.Next = from.other()
	switch msg.Type {
	case TypePropose:
		m.Task = msg.Task
		m.Proposal = msg.Protocol
	case TypeCounter:
		m.Proposal = msg.Protocol
	case TypeAccept:
		m.Proposal = msg.Protocol
		m.State = Accepted
	case TypeReject:
		m.State = Rejected
		m.Reason = msg.Reason
	}
	return nil
}
