package pd

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// StateMachine is a document's machine-readable conversation shape, from the
// stateMachine key of its metadata block:
//
//	stateMachine:
//	  roles: [buyer, seller]
//	  typeField: type            # body field holding the message type
//	  messages:
//	    - type: task
//	      sender: buyer          # or a list: [buyer, seller]
//	      receiver: seller       # optional
//	      schema: {type: object} # optional JSON Schema for this type's bodies
//	      answers: [proposal]    # optional; types it may answer (in_reply_to)
//	      outcome: failure       # optional; success or failure
//	      opensOrder: true       # optional; accepting it forms an order
//	      deadlines:             # optional; set from a body field in seconds
//	        - name: offer_timeout
//	          field: offer_timeout # optional; defaults to name
//	          guards: [offer]    # types that must arrive before it
//	          max: 24h           # optional; defaults to 30 days
//	  initial: [task]            # optional; defaults to the first message type
//	  transitions:
//	    - message: task
//	      next: [proposal]
//	      deadline: 5m           # optional Go duration
//	  terminal: [order]
//	  alwaysAllowed: [withdraw]  # optional; pass in any state not ended
//
// docs/state-machines.md describes how the dispatcher enforces it.
type StateMachine struct {
	Roles         []string
	TypeField     string
	Messages      []MessageType
	Initial       []string
	Transitions   []Transition
	Terminal      []string
	AlwaysAllowed []string
}

// MessageType is one message type of a StateMachine.
type MessageType struct {
	Type       string
	Senders    []string // never empty
	Receiver   string
	SchemaJSON string
	Answers    []string
	Deadlines  []Deadline
	Outcome    Outcome
	OpensOrder bool
}

// Outcome is how a message type ends its pair, if it says.
type Outcome string

// The outcomes a message type may declare.
const (
	OutcomeNone    Outcome = ""
	OutcomeSuccess Outcome = "success"
	OutcomeFailure Outcome = "failure"
)

// Deadline is a deadline a message type sets on its pair from a body field
// holding seconds.
type Deadline struct {
	Name   string
	Field  string // defaults to Name
	Guards []string
	Max    time.Duration // 0: the dispatcher's default
}

// Transition lists the message types allowed after Message.
type Transition struct {
	Message  string
	Next     []string
	Deadline time.Duration
}

// DefaultTypeField is the body field that carries the message type when a
// state machine does not name one.
const DefaultTypeField = "type"

type yamlStateMachine struct {
	Roles     []string `yaml:"roles"`
	TypeField string   `yaml:"typeField"`
	Messages  []struct {
		Type      string    `yaml:"type"`
		Sender    yaml.Node `yaml:"sender"`
		Receiver  string    `yaml:"receiver"`
		Schema    any       `yaml:"schema"`
		Answers   []string  `yaml:"answers"`
		Outcome   string    `yaml:"outcome"`
		Opens     bool      `yaml:"opensOrder"`
		Deadlines []struct {
			Name   string   `yaml:"name"`
			Field  string   `yaml:"field"`
			Guards []string `yaml:"guards"`
			Max    string   `yaml:"max"`
		} `yaml:"deadlines"`
	} `yaml:"messages"`
	Initial     []string `yaml:"initial"`
	Transitions []struct {
		Message  string   `yaml:"message"`
		Next     []string `yaml:"next"`
		Deadline string   `yaml:"deadline"`
	} `yaml:"transitions"`
	Terminal      []string `yaml:"terminal"`
	AlwaysAllowed []string `yaml:"alwaysAllowed"`
}

// parseStateMachine decodes and validates a stateMachine value. Unknown keys
// are errors, so a misspelt key does not silently disable a rule.
func parseStateMachine(v *yaml.Node) (*StateMachine, error) {
	raw, err := yaml.Marshal(v)
	if err != nil {
		return nil, err
	}
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	var y yamlStateMachine
	if err := dec.Decode(&y); err != nil {
		return nil, fmt.Errorf("does not have the expected shape (%s)", oneLine(err.Error()))
	}
	sm := &StateMachine{Roles: y.Roles, TypeField: y.TypeField, Initial: y.Initial, Terminal: y.Terminal, AlwaysAllowed: y.AlwaysAllowed}
	if sm.TypeField == "" {
		sm.TypeField = DefaultTypeField
	}
	var errs []string
	bad := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }

	roles := map[string]bool{}
	if len(y.Roles) == 0 {
		bad("roles: must list at least one role")
	}
	for i, r := range y.Roles {
		switch {
		case r == "":
			bad("roles[%d]: must not be empty", i)
		case roles[r]:
			bad("roles[%d]: %q is listed twice", i, r)
		}
		roles[r] = true
	}

	types := map[string]bool{}
	if len(y.Messages) == 0 {
		bad("messages: must list at least one message type")
	}
	for i, m := range y.Messages {
		switch {
		case m.Type == "":
			bad("messages[%d].type: must not be empty", i)
		case types[m.Type]:
			bad("messages[%d].type: %q is declared twice", i, m.Type)
		}
		types[m.Type] = true
	}
	for i, m := range y.Messages {
		mt := MessageType{Type: m.Type, Receiver: m.Receiver, Answers: m.Answers, OpensOrder: m.Opens}
		switch m.Sender.Kind {
		case yaml.SequenceNode:
			if err := m.Sender.Decode(&mt.Senders); err != nil {
				bad("messages[%d].sender: must be a role or a list of roles", i)
			}
			if len(mt.Senders) == 0 {
				bad("messages[%d].sender: must name at least one role", i)
			}
			for j, r := range mt.Senders {
				if !roles[r] {
					bad("messages[%d].sender[%d]: %q is not one of roles", i, j, r)
				}
			}
		default:
			var r string
			if m.Sender.Kind != 0 {
				if err := m.Sender.Decode(&r); err != nil {
					bad("messages[%d].sender: must be a role or a list of roles", i)
				}
			}
			if !roles[r] {
				bad("messages[%d].sender: %q is not one of roles", i, r)
			}
			mt.Senders = []string{r}
		}
		if m.Receiver != "" && !roles[m.Receiver] {
			bad("messages[%d].receiver: %q is not one of roles", i, m.Receiver)
		}
		for j, a := range m.Answers {
			if !types[a] {
				bad("messages[%d].answers[%d]: %q is not a declared message type", i, j, a)
			}
		}
		switch Outcome(m.Outcome) {
		case OutcomeNone, OutcomeSuccess, OutcomeFailure:
			mt.Outcome = Outcome(m.Outcome)
		default:
			bad("messages[%d].outcome: %q is not success or failure", i, m.Outcome)
		}
		names := map[string]bool{}
		for j, d := range m.Deadlines {
			dl := Deadline{Name: d.Name, Field: d.Field, Guards: d.Guards}
			switch {
			case d.Name == "":
				bad("messages[%d].deadlines[%d].name: must not be empty", i, j)
			case names[d.Name]:
				bad("messages[%d].deadlines[%d].name: %q is declared twice", i, j, d.Name)
			}
			names[d.Name] = true
			if dl.Field == "" {
				dl.Field = d.Name
			}
			if len(d.Guards) == 0 {
				bad("messages[%d].deadlines[%d].guards: must list at least one message type", i, j)
			}
			for k, g := range d.Guards {
				if !types[g] {
					bad("messages[%d].deadlines[%d].guards[%d]: %q is not a declared message type", i, j, k, g)
				}
			}
			if d.Max != "" {
				mx, err := time.ParseDuration(d.Max)
				if err != nil || mx <= 0 {
					bad("messages[%d].deadlines[%d].max: %q is not a positive duration such as 30s or 5m", i, j, d.Max)
				}
				dl.Max = mx
			}
			mt.Deadlines = append(mt.Deadlines, dl)
		}
		if m.Schema != nil {
			var n yaml.Node
			if err := n.Encode(m.Schema); err != nil {
				bad("messages[%d].schema: %v", i, err)
			} else if s, err := schemaJSON(&n, fmt.Sprintf("stateMachine/messages/%d/schema", i)); err != nil {
				bad("messages[%d].schema: %v", i, err)
			} else {
				mt.SchemaJSON = s
			}
		}
		sm.Messages = append(sm.Messages, mt)
	}

	if len(sm.Initial) == 0 && len(y.Messages) > 0 {
		sm.Initial = []string{y.Messages[0].Type}
	}
	for i, t := range y.Initial {
		if !types[t] {
			bad("initial[%d]: %q is not a declared message type", i, t)
		}
	}
	for i, t := range y.AlwaysAllowed {
		if !types[t] {
			bad("alwaysAllowed[%d]: %q is not a declared message type", i, t)
		}
	}
	terminal := map[string]bool{}
	for i, t := range y.Terminal {
		if !types[t] {
			bad("terminal[%d]: %q is not a declared message type", i, t)
		}
		terminal[t] = true
	}
	from := map[string]bool{}
	for i, t := range y.Transitions {
		switch {
		case !types[t.Message]:
			bad("transitions[%d].message: %q is not a declared message type", i, t.Message)
		case from[t.Message]:
			bad("transitions[%d].message: %q has two transition entries; merge them", i, t.Message)
		case terminal[t.Message]:
			bad("transitions[%d].message: %q is terminal, so nothing may follow it", i, t.Message)
		}
		from[t.Message] = true
		if len(t.Next) == 0 {
			bad("transitions[%d].next: must list at least one message type", i)
		}
		for j, n := range t.Next {
			if !types[n] {
				bad("transitions[%d].next[%d]: %q is not a declared message type", i, j, n)
			}
		}
		tr := Transition{Message: t.Message, Next: t.Next}
		if t.Deadline != "" {
			d, err := time.ParseDuration(t.Deadline)
			if err != nil || d <= 0 {
				bad("transitions[%d].deadline: %q is not a positive duration such as 30s or 5m", i, t.Deadline)
			}
			tr.Deadline = d
		}
		sm.Transitions = append(sm.Transitions, tr)
	}
	if len(errs) > 0 {
		return nil, errors.New(strings.Join(errs, "; "))
	}
	return sm, nil
}
