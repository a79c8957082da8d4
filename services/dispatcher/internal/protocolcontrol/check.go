package protocolcontrol

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// Party says which side of a pair sent a message.
type Party int

// The two sides of a pair.
const (
	// Initiator is the agent that opened the dialogue (the consumer of a
	// service protocol).
	Initiator Party = iota + 1
	// Counterpart is the other agent of the pair (a supplier).
	Counterpart
)

// Input is one message to check.
type Input struct {
	Sender      Party
	Type        string
	AnswersType string // the type of the message named by in_reply_to; "" for an opener
	Body        []byte // one JSON value
	Now         time.Time
}

// Deadline is a pending deadline of a pair.
type Deadline struct {
	Name   string    `json:"name"`
	At     time.Time `json:"at"`
	Guards []string  `json:"guards"`
	SetBy  string    `json:"setBy"` // the type of the message that set it
}

// Pair is a pair's state as Inspect reads it. Callers treat the stored form
// (encodePair) as opaque bytes and never build one.
type Pair struct {
	InitiatorRole   string     `json:"initiatorRole"`
	CounterpartRole string     `json:"counterpartRole"`
	State           string     `json:"state"` // the type of the last accepted message
	Outcome         Outcome    `json:"outcome,omitempty"`
	Ended           bool       `json:"ended,omitempty"`
	Expired         string     `json:"expired,omitempty"` // the deadline whose expiry ended the pair
	Order           bool       `json:"order,omitempty"`   // an opensOrder message was accepted
	Deadlines       []Deadline `json:"deadlines,omitempty"`
}

// Result is what an accepted message or a fired deadline does to its pair.
type Result struct {
	State []byte // the pair's new state, to store
	Pair  Pair   // the same, decoded
	// Body is the message body to deliver: deadline fields the message set
	// hold absolute times (Unix seconds) instead of durations. It is the
	// input body when nothing was rewritten.
	Body []byte
	// Role is the sender's role.
	Role string
	// OpensOrder is true when this message formed the pair's order (its
	// type is opensOrder and the pair had none).
	OpensOrder bool
}

// Inspect decodes a stored pair state; nil gives the zero Pair.
func Inspect(state []byte) (Pair, error) {
	var p Pair
	if len(state) == 0 {
		return p, nil
	}
	p, err := decodePair(state)
	if err != nil {
		return Pair{}, fmt.Errorf("pair state: %w", err)
	}
	return p, nil
}

// Check checks one message against the pair's state. It returns the new
// state, or a *Violation naming the rule broken; any other error means the
// stored state is corrupt.
func (m *Machine) Check(state []byte, in Input) (Result, error) {
	p, err := Inspect(state)
	if err != nil {
		return Result{}, err
	}
	mt := m.types[in.Type]
	if mt == nil {
		return Result{}, &Violation{Rule: RuleUnknownType, Type: in.Type}
	}
	opener := len(state) == 0
	var role string
	if opener {
		if !m.initial[in.Type] || in.Sender != Initiator || in.AnswersType != "" {
			return Result{}, &Violation{Rule: RuleNotInitial, Type: in.Type, Answers: in.AnswersType}
		}
		p.InitiatorRole = mt.senders[0]
		p.CounterpartRole, _ = m.counterpartRole(mt) // checked by Compile
		role = p.InitiatorRole
	} else {
		// A deadline that passed unmet ended the pair at that instant,
		// whether or not its timer has fired (and written nothing) yet.
		if d, ok := lapsed(p, in.Now); ok && !p.Ended {
			if slices.Contains(d.Guards, in.Type) {
				return Result{}, &Violation{Rule: RuleDeadlinePassed, Type: in.Type, Deadline: d.Name, DeadlineAt: d.At}
			}
			expire(&p, d.Name)
		}
		if p.Ended {
			return Result{}, &Violation{Rule: RulePairEnded, Type: in.Type, State: p.State, Outcome: p.Outcome, Expired: p.Expired}
		}
		role = p.CounterpartRole
		if in.Sender == Initiator {
			role = p.InitiatorRole
		}
		if !slices.Contains(mt.senders, role) {
			return Result{}, &Violation{Rule: RuleWrongRole, Type: in.Type, Role: role, Allowed: mt.senders}
		}
		if !m.always[in.Type] {
			if !slices.Contains(m.next[p.State], in.Type) {
				return Result{}, &Violation{Rule: RuleNotAllowedAfter, Type: in.Type, State: p.State, Allowed: m.next[p.State]}
			}
			if !slices.Contains(mt.answers, in.AnswersType) {
				return Result{}, &Violation{Rule: RuleNotAnAnswer, Type: in.Type, Answers: in.AnswersType, Allowed: mt.answers}
			}
		}
	}
	if err := validate(mt, in.Body); err != nil {
		return Result{}, err
	}
	body, set, err := deadlines(mt, in.Body, in.Now)
	if err != nil {
		return Result{}, err
	}

	// Accept: meet the deadlines this type guards, set its own, move.
	p.Deadlines = slices.DeleteFunc(p.Deadlines, func(d Deadline) bool {
		if slices.Contains(d.Guards, in.Type) {
			return true
		}
		return slices.ContainsFunc(set, func(n Deadline) bool { return n.Name == d.Name })
	})
	p.Deadlines = append(p.Deadlines, set...)
	p.State = in.Type
	opens := mt.opens && !p.Order
	p.Order = p.Order || mt.opens
	if mt.outcome != OutcomeNone {
		p.Outcome = mt.outcome
	}
	if len(m.next[in.Type]) == 0 {
		p.Ended = true
		p.Deadlines = nil
	}
	return Result{State: encodePair(p), Pair: p, Body: body, Role: role, OpensOrder: opens}, nil
}

// Expire fires deadline name of the pair at now. When it is the pending
// deadline that ended the pair (the earliest that passed unmet), fired is
// true and res holds the pair as that ended it: with a failure, naming the
// deadline. Otherwise (met, replaced, not yet due, the pair ended by
// another) nothing changes and fired is false, so a timer that fires twice,
// or late, does no harm. The ended state need not be stored: Check and
// InspectAt read a passed deadline as the end it is.
func (m *Machine) Expire(state []byte, name string, now time.Time) (res Result, fired bool, err error) {
	p, err := Inspect(state)
	if err != nil {
		return Result{}, false, err
	}
	d, ok := lapsed(p, now)
	if p.Ended || !ok || d.Name != name {
		return Result{State: state, Pair: p}, false, nil
	}
	expire(&p, name)
	return Result{State: encodePair(p), Pair: p}, true, nil
}

// InspectAt decodes a stored pair state as it stands at now: a pending
// deadline that has passed unmet has ended it (Check's view).
func InspectAt(state []byte, now time.Time) (Pair, error) {
	p, err := Inspect(state)
	if err != nil {
		return Pair{}, err
	}
	if d, ok := lapsed(p, now); ok && !p.Ended {
		expire(&p, d.Name)
	}
	return p, nil
}

// lapsed returns the pending deadline of p that ended it by now: the
// first (Pair.FirstDeadline), once passed.
func lapsed(p Pair, now time.Time) (Deadline, bool) {
	d, ok := p.FirstDeadline()
	if !ok || now.Before(d.At) {
		return Deadline{}, false
	}
	return d, true
}

// FirstDeadline returns the pending deadline that ends p, with a failure
// at its instant, unless a message meets it first: the earliest (the
// first declared among equals).
func (p Pair) FirstDeadline() (Deadline, bool) {
	var (
		out Deadline
		ok  bool
	)
	if p.Ended {
		return out, false
	}
	for _, d := range p.Deadlines {
		if !ok || d.At.Before(out.At) {
			out, ok = d, true
		}
	}
	return out, ok
}

// expire ends p by its deadline name, with a failure.
func expire(p *Pair, name string) {
	p.Ended, p.Outcome, p.Expired, p.Deadlines = true, OutcomeFailure, name, nil
}

func validate(mt *messageType, body []byte) error {
	if mt.schema == nil {
		return nil
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		return &Violation{Rule: RuleSchema, Type: mt.name, Detail: "the body is not JSON"}
	}
	err = mt.schema.Validate(v)
	var ve *jsonschema.ValidationError
	if errors.As(err, &ve) {
		leaf := ve
		for len(leaf.Causes) > 0 {
			leaf = leaf.Causes[0]
		}
		return &Violation{Rule: RuleSchema, Type: mt.name, Path: pointer(leaf.InstanceLocation), Detail: detail(leaf)}
	}
	if err != nil {
		return &Violation{Rule: RuleSchema, Type: mt.name, Detail: err.Error()}
	}
	return nil
}

// detail is the leaf error's message without its "at '/path':" prefix.
func detail(e *jsonschema.ValidationError) string {
	s := strings.Join(strings.Fields(e.Error()), " ")
	if _, after, ok := strings.Cut(s, "': "); ok && strings.HasPrefix(s, "at '") {
		return after
	}
	return s
}

func pointer(loc []string) string {
	var b strings.Builder
	for _, t := range loc {
		b.WriteByte('/')
		b.WriteString(strings.NewReplacer("~", "~0", "/", "~1").Replace(t))
	}
	return b.String()
}

// deadlines reads the deadline fields mt declares from body, returns the
// deadlines they set, and the body with each such field rewritten to the
// deadline's absolute time in Unix seconds. Deadlines are rounded up to the
// whole second, so what the receiver reads is exactly what is enforced.
func deadlines(mt *messageType, body []byte, now time.Time) ([]byte, []Deadline, error) {
	if len(mt.deadlines) == 0 {
		return body, nil, nil
	}
	var obj map[string]json.RawMessage
	isObject := json.Unmarshal(body, &obj) == nil && obj != nil
	var set []Deadline
	rewritten := false
	for _, ds := range mt.deadlines {
		d := ds.fixed
		if d == 0 {
			raw, ok := obj[ds.field]
			if !isObject || !ok {
				continue
			}
			secs, err := strconv.ParseFloat(string(raw), 64)
			if err != nil || math.IsNaN(secs) || secs <= 0 || secs > ds.max.Seconds() {
				return nil, nil, &Violation{Rule: RuleSchema, Type: mt.name, Path: pointer([]string{ds.field}),
					Detail: fmt.Sprintf("%s must be a number of seconds above 0 and at most %d", ds.field, int64(ds.max/time.Second))}
			}
			d = time.Duration(secs * float64(time.Second))
		}
		at := now.Add(d)
		if t := at.Truncate(time.Second); !t.Equal(at) {
			at = t.Add(time.Second)
		}
		at = at.UTC()
		set = append(set, Deadline{Name: ds.name, At: at, Guards: ds.guards, SetBy: mt.name})
		if ds.fixed == 0 {
			obj[ds.field] = json.RawMessage(strconv.FormatInt(at.Unix(), 10))
			rewritten = true
		}
	}
	if !rewritten {
		return body, set, nil
	}
	out, err := json.Marshal(obj)
	if err != nil {
		return nil, nil, err
	}
	return out, set, nil
}
