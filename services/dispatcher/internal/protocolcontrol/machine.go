package protocolcontrol

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/services/dispatcher/internal/pdschema"
)

// DefaultMaxDeadline bounds a deadline whose declaration names no max.
const DefaultMaxDeadline = 30 * 24 * time.Hour

// Outcome is how a pair ended, or is ending, as far as its messages say.
type Outcome string

// The outcomes of a pair.
const (
	OutcomeNone    Outcome = ""
	OutcomeSuccess Outcome = "success"
	OutcomeFailure Outcome = "failure"
)

// Machine is a compiled state machine. It is immutable and safe for
// concurrent use.
type Machine struct {
	roles   []string
	types   map[string]*messageType
	order   []string // declared type order, for stable listings
	initial map[string]bool
	next    map[string][]string // type -> types that may follow it
	always  map[string]bool
}

type messageType struct {
	name      string
	senders   []string
	receiver  string
	schema    *jsonschema.Schema
	answers   []string // explicit, or every type it may follow
	explicit  bool     // answers came from the PD
	deadlines []deadlineSpec
	outcome   Outcome
	opens     bool // accepting it forms an order
}

type deadlineSpec struct {
	name   string
	field  string
	guards []string
	max    time.Duration
	fixed  time.Duration // set on every message, not from the body; field unused
}

// Compile checks sm and compiles it. The registry validated sm at
// registration; Compile re-checks what the engine relies on, so a machine
// from elsewhere cannot make Check misbehave.
func Compile(sm *registryv1.StateMachine) (*Machine, error) {
	if sm == nil {
		return nil, errors.New("no state machine")
	}
	m := &Machine{
		roles:   sm.GetRoles(),
		types:   map[string]*messageType{},
		initial: map[string]bool{},
		next:    map[string][]string{},
		always:  map[string]bool{},
	}
	var errs []string
	bad := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }
	isRole := func(r string) bool { return slices.Contains(m.roles, r) }

	for _, pm := range sm.GetMessages() {
		if pm.GetType() == "" || m.types[pm.GetType()] != nil {
			bad("message type %q is empty or declared twice", pm.GetType())
			continue
		}
		mt := &messageType{name: pm.GetType(), senders: pm.GetSenderRoles(), receiver: pm.GetReceiverRole(), opens: pm.GetOpensOrder()}
		if len(mt.senders) == 0 && pm.GetSenderRole() != "" {
			mt.senders = []string{pm.GetSenderRole()}
		}
		if len(mt.senders) == 0 {
			bad("message type %q names no sender role", mt.name)
		}
		for _, r := range mt.senders {
			if !isRole(r) {
				bad("message type %q: sender %q is not a role", mt.name, r)
			}
		}
		if mt.receiver != "" && !isRole(mt.receiver) {
			bad("message type %q: receiver %q is not a role", mt.name, mt.receiver)
		}
		switch pm.GetOutcome() {
		case registryv1.StateMachineOutcome_STATE_MACHINE_OUTCOME_SUCCESS:
			mt.outcome = OutcomeSuccess
		case registryv1.StateMachineOutcome_STATE_MACHINE_OUTCOME_FAILURE:
			mt.outcome = OutcomeFailure
		}
		if pm.GetSchemaJson() != "" {
			s, err := pdschema.CompileSchema(pm.GetSchemaJson(), "schema of "+mt.name)
			if err != nil {
				bad("message type %q: %v", mt.name, err)
			}
			mt.schema = s
		}
		m.types[mt.name] = mt
		m.order = append(m.order, mt.name)
	}
	declared := func(t string) bool { return m.types[t] != nil }

	for _, pm := range sm.GetMessages() {
		mt := m.types[pm.GetType()]
		if mt == nil {
			continue
		}
		mt.answers = pm.GetAnswers()
		mt.explicit = len(mt.answers) > 0
		for _, a := range mt.answers {
			if !declared(a) {
				bad("message type %q answers undeclared type %q", mt.name, a)
			}
		}
		for _, d := range pm.GetDeadlines() {
			ds := deadlineSpec{name: d.GetName(), field: d.GetField(), guards: d.GetGuards(), max: d.GetMax().AsDuration()}
			if ds.field == "" {
				ds.field = ds.name
			}
			if ds.max <= 0 {
				ds.max = DefaultMaxDeadline
			}
			if ds.name == "" || len(ds.guards) == 0 {
				bad("message type %q: a deadline needs a name and guards", mt.name)
			}
			for _, g := range ds.guards {
				if !declared(g) {
					bad("message type %q: deadline %q guards undeclared type %q", mt.name, ds.name, g)
				}
			}
			mt.deadlines = append(mt.deadlines, ds)
		}
	}

	for _, tr := range sm.GetTransitions() {
		if !declared(tr.GetMessage()) {
			bad("transition from undeclared type %q", tr.GetMessage())
			continue
		}
		for _, n := range tr.GetNext() {
			if !declared(n) {
				bad("transition from %q to undeclared type %q", tr.GetMessage(), n)
			}
		}
		m.next[tr.GetMessage()] = append(m.next[tr.GetMessage()], tr.GetNext()...)
		if d := tr.GetDeadline().AsDuration(); tr.GetDeadline() != nil && d > 0 {
			// The original format's fixed deadline: the next message must come
			// within d. It is a deadline like any other, named after the type.
			mt := m.types[tr.GetMessage()]
			mt.deadlines = append(mt.deadlines, deadlineSpec{name: tr.GetMessage() + "_deadline", guards: tr.GetNext(), max: d, fixed: d})
		}
	}
	// A type with no explicit answers may answer any type it may follow.
	for _, from := range m.order {
		for _, n := range m.next[from] {
			if mt := m.types[n]; mt != nil && !mt.explicit && !slices.Contains(mt.answers, from) {
				mt.answers = append(mt.answers, from)
			}
		}
	}

	initial := sm.GetInitial()
	if len(initial) == 0 && len(m.order) > 0 {
		initial = []string{m.order[0]}
	}
	for _, t := range initial {
		mt := m.types[t]
		if mt == nil {
			bad("initial type %q is not declared", t)
			continue
		}
		if len(mt.senders) > 0 {
			if _, err := m.counterpartRole(mt); err != nil {
				bad("initial type %q: %v", t, err)
			}
		}
		m.initial[t] = true
	}
	for _, t := range sm.GetAlwaysAllowed() {
		if !declared(t) {
			bad("alwaysAllowed type %q is not declared", t)
		}
		m.always[t] = true
	}
	if len(errs) > 0 {
		return nil, errors.New(strings.Join(errs, "; "))
	}
	return m, nil
}

// counterpartRole is the role the counterparts of a dialogue opened by mt
// hold: its receiver role, or the only other role of a two-role machine.
func (m *Machine) counterpartRole(mt *messageType) (string, error) {
	if mt.receiver != "" {
		return mt.receiver, nil
	}
	if len(m.roles) == 2 {
		if m.roles[0] == mt.senders[0] {
			return m.roles[1], nil
		}
		return m.roles[0], nil
	}
	return "", errors.New("with more than two roles, an initial type must name its receiver")
}

// Types lists the declared message types in the PD's order.
func (m *Machine) Types() []string { return slices.Clone(m.order) }

// Initial reports whether t may open a dialogue.
func (m *Machine) Initial(t string) bool { return m.initial[t] }

// Next lists the types that may follow t (alwaysAllowed types excepted).
func (m *Machine) Next(t string) []string { return slices.Clone(m.next[t]) }

// InitialTypes lists the types that may open a dialogue, in the PD's order.
func (m *Machine) InitialTypes() []string {
	var out []string
	for _, t := range m.order {
		if m.initial[t] {
			out = append(out, t)
		}
	}
	return out
}

// DeadlineFields lists the body fields from which a message of type t sets
// deadlines (seconds when sent, absolute Unix times when delivered), in the
// PD's order; fixed deadlines have none.
func (m *Machine) DeadlineFields(t string) []string {
	mt := m.types[t]
	if mt == nil {
		return nil
	}
	var out []string
	for _, d := range mt.deadlines {
		if d.fixed == 0 {
			out = append(out, d.field)
		}
	}
	return out
}

// OpensOrder reports whether t is declared opensOrder: accepting it forms
// the pair's order.
func (m *Machine) OpensOrder(t string) bool {
	mt := m.types[t]
	return mt != nil && mt.opens
}
