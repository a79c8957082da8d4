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
//	      sender: buyer
//	      receiver: seller       # optional
//	      schema: {type: object} # optional JSON Schema for this type's bodies
//	  initial: [task]            # optional; defaults to the first message type
//	  transitions:
//	    - message: task
//	      next: [proposal]
//	      deadline: 5m           # optional Go duration
//	  terminal: [order]
type StateMachine struct {
	Roles       []string
	TypeField   string
	Messages    []MessageType
	Initial     []string
	Transitions []Transition
	Terminal    []string
}

// MessageType is one message type of a StateMachine.
type MessageType struct {
	Type       string
	Sender     string
	Receiver   string
	SchemaJSON string
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
		Type     string `yaml:"type"`
		Sender   string `yaml:"sender"`
		Receiver string `yaml:"receiver"`
		Schema   any    `yaml:"schema"`
	} `yaml:"messages"`
	Initial     []string `yaml:"initial"`
	Transitions []struct {
		Message  string   `yaml:"message"`
		Next     []string `yaml:"next"`
		Deadline string   `yaml:"deadline"`
	} `yaml:"transitions"`
	Terminal []string `yaml:"terminal"`
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
	sm := &StateMachine{Roles: y.Roles, TypeField: y.TypeField, Initial: y.Initial, Terminal: y.Terminal}
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
		if !roles[m.Sender] {
			bad("messages[%d].sender: %q is not one of roles", i, m.Sender)
		}
		if m.Receiver != "" && !roles[m.Receiver] {
			bad("messages[%d].receiver: %q is not one of roles", i, m.Receiver)
		}
		mt := MessageType{Type: m.Type, Sender: m.Sender, Receiver: m.Receiver}
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
