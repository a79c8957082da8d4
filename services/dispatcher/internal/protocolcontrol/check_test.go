package protocolcontrol

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
)

var t0 = time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)

// shopMachine is a small service protocol using every part of the format:
// a deadline from a body field, answers, two senders, outcomes, a fixed
// transition deadline and an always-allowed type.
func shopMachine(t *testing.T) *Machine {
	t.Helper()
	sm := &registryv1.StateMachine{
		Roles: []string{"consumer", "supplier"},
		Messages: []*registryv1.StateMachineMessage{
			{Type: "request", SenderRoles: []string{"consumer"}, Deadlines: []*registryv1.StateMachineDeadline{
				{Name: "offer_timeout", Guards: []string{"offer", "decline"}, Max: durationpb.New(time.Hour)},
			}},
			{Type: "offer", SenderRoles: []string{"supplier"}, SchemaJson: `{"type":"object","required":["price"],"properties":{"price":{"type":"number","minimum":0}}}`},
			{Type: "decline", SenderRoles: []string{"supplier"}, Outcome: registryv1.StateMachineOutcome_STATE_MACHINE_OUTCOME_FAILURE},
			{Type: "accept", SenderRoles: []string{"consumer"}, Answers: []string{"offer"}, OpensOrder: true},
			{Type: "chat", SenderRoles: []string{"consumer", "supplier"}, Answers: []string{"accept", "offer", "chat"}},
			{Type: "done", SenderRole: "supplier", Outcome: registryv1.StateMachineOutcome_STATE_MACHINE_OUTCOME_SUCCESS},
			{Type: "confirm_fail", SenderRoles: []string{"consumer"}, Outcome: registryv1.StateMachineOutcome_STATE_MACHINE_OUTCOME_FAILURE},
			{Type: "withdrawn", SenderRoles: []string{"consumer"}, Outcome: registryv1.StateMachineOutcome_STATE_MACHINE_OUTCOME_FAILURE},
		},
		Transitions: []*registryv1.StateMachineTransition{
			{Message: "request", Next: []string{"offer", "decline"}},
			{Message: "offer", Next: []string{"accept"}},
			{Message: "accept", Next: []string{"chat", "done"}},
			{Message: "chat", Next: []string{"chat", "done"}},
			{Message: "done", Next: []string{"confirm_fail"}, Deadline: durationpb.New(time.Minute)},
		},
		AlwaysAllowed: []string{"withdrawn"},
	}
	m, err := Compile(sm)
	if err != nil {
		t.Fatalf("Compile() error = %v", err)
	}
	return m
}

type step struct {
	from    Party
	typ     string
	answers string
	body    string
	at      time.Duration // after t0
}

// run feeds steps to m from an empty pair and returns the final state.
func run(t *testing.T, m *Machine, steps ...step) []byte {
	t.Helper()
	var state []byte
	for _, s := range steps {
		body := s.body
		if body == "" {
			body = "{}"
		}
		res, err := m.Check(state, Input{Sender: s.from, Type: s.typ, AnswersType: s.answers, Body: []byte(body), Now: t0.Add(s.at)})
		if err != nil {
			t.Fatalf("Check(%s answering %q) error = %v", s.typ, s.answers, err)
		}
		state = res.State
	}
	return state
}

func violation(t *testing.T, err error, want Rule) *Violation {
	t.Helper()
	var v *Violation
	if !errors.As(err, &v) {
		t.Fatalf("Check() error = %v, want a *Violation %s", err, want)
	}
	if v.Rule != want {
		t.Fatalf("Check() violation = %s (%v), want %s", v.Rule, v, want)
	}
	return v
}

func TestCheck_happyPathEndsInSuccess(t *testing.T) {
	m := shopMachine(t)
	state := run(t, m,
		step{Initiator, "request", "", `{"offer_timeout": 30}`, 0},
		step{Counterpart, "offer", "request", `{"price": 5}`, 10 * time.Second},
		step{Initiator, "accept", "offer", "", 11 * time.Second},
		step{Counterpart, "chat", "accept", "", 12 * time.Second},
		step{Initiator, "chat", "chat", "", 13 * time.Second},
		step{Counterpart, "done", "chat", "", 14 * time.Second},
	)
	p, err := Inspect(state)
	if err != nil {
		t.Fatal(err)
	}
	if p.InitiatorRole != "consumer" || p.CounterpartRole != "supplier" || p.State != "done" || p.Outcome != OutcomeSuccess || p.Ended {
		t.Errorf("pair = %+v, want consumer/supplier at done, success, not ended", p)
	}
	// done carries the old format's fixed deadline for what follows it.
	if len(p.Deadlines) != 1 || p.Deadlines[0].Name != "done_deadline" || !p.Deadlines[0].At.Equal(t0.Add(14*time.Second+time.Minute)) {
		t.Errorf("deadlines = %+v, want done_deadline at t0+1m14s", p.Deadlines)
	}
}

// confirm_fail after a success outcome must read as a failure: the original
// reported it on the success queue.
func TestCheck_confirmFailOverridesSuccess(t *testing.T) {
	m := shopMachine(t)
	state := run(t, m,
		step{Initiator, "request", "", "", 0},
		step{Counterpart, "offer", "request", `{"price": 5}`, 0},
		step{Initiator, "accept", "offer", "", 0},
		step{Counterpart, "done", "accept", "", 0},
		step{Initiator, "confirm_fail", "done", "", 0},
	)
	p, _ := Inspect(state)
	if p.Outcome != OutcomeFailure || !p.Ended {
		t.Errorf("pair = %+v, want ended in failure", p)
	}
}

func TestCheck_opensOrderOnce(t *testing.T) {
	m := shopMachine(t)
	state := run(t, m, step{Initiator, "request", "", "", 0}, step{Counterpart, "offer", "request", `{"price":1}`, 0})
	res, err := m.Check(state, Input{Sender: Initiator, Type: "accept", AnswersType: "offer", Body: []byte("{}"), Now: t0})
	if err != nil {
		t.Fatal(err)
	}
	if !res.OpensOrder || !res.Pair.Order {
		t.Errorf("Check(accept) = OpensOrder %v, Pair.Order %v; want both true", res.OpensOrder, res.Pair.Order)
	}
	res, err = m.Check(res.State, Input{Sender: Counterpart, Type: "chat", AnswersType: "accept", Body: []byte("{}"), Now: t0})
	if err != nil {
		t.Fatal(err)
	}
	if res.OpensOrder || !res.Pair.Order {
		t.Errorf("Check(chat) = OpensOrder %v, Pair.Order %v; want false, true", res.OpensOrder, res.Pair.Order)
	}
}

func TestCheck_refusals(t *testing.T) {
	m := shopMachine(t)
	opened := run(t, m, step{Initiator, "request", "", `{"offer_timeout": 30}`, 0})
	offered := run(t, m, step{Initiator, "request", "", "", 0}, step{Counterpart, "offer", "request", `{"price":1}`, 0})
	declined := run(t, m, step{Initiator, "request", "", "", 0}, step{Counterpart, "decline", "request", "", 0})
	tests := []struct {
		name  string
		state []byte
		in    Input
		want  Rule
		check func(*Violation) bool
	}{
		{"unknown type", opened, Input{Sender: Counterpart, Type: "bribe", AnswersType: "request"}, RuleUnknownType, nil},
		{"opener not initial", nil, Input{Sender: Initiator, Type: "offer"}, RuleNotInitial, nil},
		{"opener by the counterpart", nil, Input{Sender: Counterpart, Type: "request"}, RuleNotInitial, nil},
		{"opener answering something", nil, Input{Sender: Initiator, Type: "request", AnswersType: "offer"}, RuleNotInitial, nil},
		{"wrong role", opened, Input{Sender: Initiator, Type: "offer", AnswersType: "request"}, RuleWrongRole,
			func(v *Violation) bool { return v.Role == "consumer" && v.Allowed[0] == "supplier" }},
		{"not allowed after", opened, Input{Sender: Initiator, Type: "accept", AnswersType: "offer"}, RuleNotAllowedAfter,
			func(v *Violation) bool { return v.State == "request" }},
		{"not an answer", offered, Input{Sender: Initiator, Type: "accept", AnswersType: "request"}, RuleNotAnAnswer,
			func(v *Violation) bool { return v.Answers == "request" }},
		{"schema", opened, Input{Sender: Counterpart, Type: "offer", AnswersType: "request", Body: []byte(`{"price": -1}`)}, RuleSchema,
			func(v *Violation) bool { return v.Path == "/price" }},
		{"schema missing field", opened, Input{Sender: Counterpart, Type: "offer", AnswersType: "request", Body: []byte(`{}`)}, RuleSchema,
			func(v *Violation) bool { return v.Path == "" && strings.Contains(v.Detail, "price") }},
		{"deadline passed", opened, Input{Sender: Counterpart, Type: "offer", AnswersType: "request", Body: []byte(`{"price":1}`), Now: t0.Add(30 * time.Second)}, RuleDeadlinePassed,
			func(v *Violation) bool {
				return v.Deadline == "offer_timeout" && v.DeadlineAt.Equal(t0.Add(30*time.Second))
			}},
		{"pair ended", declined, Input{Sender: Initiator, Type: "withdrawn", AnswersType: "decline"}, RulePairEnded,
			func(v *Violation) bool { return v.State == "decline" && v.Outcome == OutcomeFailure }},
		{"deadline field not a number", nil, Input{Sender: Initiator, Type: "request", Body: []byte(`{"offer_timeout": "soon"}`)}, RuleSchema,
			func(v *Violation) bool { return v.Path == "/offer_timeout" }},
		{"deadline field over max", nil, Input{Sender: Initiator, Type: "request", Body: []byte(`{"offer_timeout": 3601}`)}, RuleSchema,
			func(v *Violation) bool { return v.Path == "/offer_timeout" }},
		{"deadline field zero", nil, Input{Sender: Initiator, Type: "request", Body: []byte(`{"offer_timeout": 0}`)}, RuleSchema, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.in.Body == nil {
				tt.in.Body = []byte("{}")
			}
			if tt.in.Now.IsZero() {
				tt.in.Now = t0
			}
			_, err := m.Check(tt.state, tt.in)
			v := violation(t, err, tt.want)
			if tt.check != nil && !tt.check(v) {
				t.Errorf("Check() violation = %+v (%v), not the one wanted", v, v)
			}
			if v.Error() == "" || !strings.Contains(v.Error(), tt.in.Type) {
				t.Errorf("Violation.Error() = %q, want it to name %q", v.Error(), tt.in.Type)
			}
		})
	}
}

func TestCheck_deadlineSentAsSecondsReceivedAsTime(t *testing.T) {
	m := shopMachine(t)
	now := t0.Add(300 * time.Millisecond)
	res, err := m.Check(nil, Input{Sender: Initiator, Type: "request", Body: []byte(`{"task":"x","offer_timeout":30}`), Now: now})
	if err != nil {
		t.Fatal(err)
	}
	// Rounded up to the second, so the receiver reads what is enforced.
	want := t0.Add(31 * time.Second)
	var body struct {
		Task         string `json:"task"`
		OfferTimeout int64  `json:"offer_timeout"`
	}
	if err := json.Unmarshal(res.Body, &body); err != nil {
		t.Fatal(err)
	}
	if body.Task != "x" || body.OfferTimeout != want.Unix() {
		t.Errorf("Check().Body = %s, want task kept and offer_timeout %d", res.Body, want.Unix())
	}
	if len(res.Pair.Deadlines) != 1 || !res.Pair.Deadlines[0].At.Equal(want) {
		t.Errorf("Check().Pair.Deadlines = %+v, want offer_timeout at %v", res.Pair.Deadlines, want)
	}
	// Just before the deadline an offer passes and meets it.
	res2, err := m.Check(res.State, Input{Sender: Counterpart, Type: "offer", AnswersType: "request", Body: []byte(`{"price":1}`), Now: want.Add(-time.Nanosecond)})
	if err != nil {
		t.Fatalf("Check(offer before the deadline) error = %v", err)
	}
	if len(res2.Pair.Deadlines) != 0 {
		t.Errorf("deadlines after the offer = %+v, want none", res2.Pair.Deadlines)
	}
	if _, fired, _ := m.Expire(res2.State, "offer_timeout", want.Add(time.Hour)); fired {
		t.Error("Expire(met deadline) fired")
	}
}

func TestExpire_firesOnceAndEndsThePair(t *testing.T) {
	m := shopMachine(t)
	state := run(t, m, step{Initiator, "request", "", `{"offer_timeout": 30}`, 0})
	at := t0.Add(30 * time.Second)

	if _, fired, _ := m.Expire(state, "offer_timeout", at.Add(-time.Nanosecond)); fired {
		t.Fatal("Expire() before the deadline fired")
	}
	res, fired, err := m.Expire(state, "offer_timeout", at)
	if err != nil || !fired {
		t.Fatalf("Expire() = fired %v, err %v; want fired", fired, err)
	}
	if !res.Pair.Ended || res.Pair.Outcome != OutcomeFailure || res.Pair.Expired != "offer_timeout" {
		t.Errorf("pair after expiry = %+v, want ended in failure by offer_timeout", res.Pair)
	}
	if _, again, _ := m.Expire(res.State, "offer_timeout", at.Add(time.Hour)); again {
		t.Error("Expire() fired a second time")
	}
	_, err = m.Check(res.State, Input{Sender: Counterpart, Type: "offer", AnswersType: "request", Body: []byte(`{"price":1}`), Now: at})
	v := violation(t, err, RulePairEnded)
	if !strings.Contains(v.Error(), "offer_timeout") {
		t.Errorf("Violation.Error() = %q, want it to name offer_timeout", v.Error())
	}
}

// A deadline that passed unmet has ended the pair at its instant, before
// any timer fires and with nothing stored: a message it does not guard is
// refused as after the end (naming it), Expire fires it once with the
// state unchanged, and InspectAt reads the pair as ended.
func TestCheck_passedDeadlineEndsThePairWithoutAWrite(t *testing.T) {
	m := shopMachine(t)
	state := run(t, m, step{Initiator, "request", "", `{"offer_timeout": 30}`, 0})
	at := t0.Add(30 * time.Second)
	if _, err := m.Check(state, Input{Sender: Initiator, Type: "withdrawn", AnswersType: "request", Body: []byte("{}"), Now: at.Add(-time.Nanosecond)}); err != nil {
		t.Fatalf("withdrawn before the deadline: %v", err)
	}
	_, err := m.Check(state, Input{Sender: Initiator, Type: "withdrawn", AnswersType: "request", Body: []byte("{}"), Now: at})
	if v := violation(t, err, RulePairEnded); v.Expired != "offer_timeout" || !strings.Contains(v.Error(), "offer_timeout") {
		t.Errorf("withdrawn after the deadline: %+v, want PAIR_ENDED naming offer_timeout", v)
	}
	p, err := InspectAt(state, at)
	if err != nil || !p.Ended || p.Expired != "offer_timeout" || p.Outcome != OutcomeFailure {
		t.Errorf("InspectAt(deadline) = %+v, %v; want ended in failure by offer_timeout", p, err)
	}
	if p, _ := InspectAt(state, at.Add(-time.Nanosecond)); p.Ended {
		t.Errorf("InspectAt(before) = %+v, want open", p)
	}
	// The stored state, never rewritten, still fires once per timer.
	if _, fired, _ := m.Expire(state, "offer_timeout", at.Add(time.Hour)); !fired {
		t.Error("Expire() of the passed deadline did not fire")
	}
	if _, fired, _ := m.Expire(state, "other_timeout", at.Add(time.Hour)); fired {
		t.Error("Expire() of a deadline the pair does not hold fired")
	}
}

func TestCheck_alwaysAllowedPassesInAnyOpenState(t *testing.T) {
	m := shopMachine(t)
	for _, prefix := range [][]step{
		{{Initiator, "request", "", "", 0}},
		{{Initiator, "request", "", "", 0}, {Counterpart, "offer", "request", `{"price":1}`, 0}},
		{{Initiator, "request", "", "", 0}, {Counterpart, "offer", "request", `{"price":1}`, 0}, {Initiator, "accept", "offer", "", 0}, {Counterpart, "chat", "accept", "", 0}},
	} {
		state := run(t, m, prefix...)
		last := prefix[len(prefix)-1].typ
		res, err := m.Check(state, Input{Sender: Initiator, Type: "withdrawn", AnswersType: last, Body: []byte("{}"), Now: t0})
		if err != nil {
			t.Fatalf("Check(withdrawn after %s) error = %v", last, err)
		}
		if !res.Pair.Ended || res.Pair.Outcome != OutcomeFailure {
			t.Errorf("pair after withdrawn = %+v, want ended in failure", res.Pair)
		}
	}
	// It still checks the role.
	state := run(t, m, step{Initiator, "request", "", "", 0})
	_, err := m.Check(state, Input{Sender: Counterpart, Type: "withdrawn", AnswersType: "request", Body: []byte("{}"), Now: t0})
	if v := violation(t, err, RuleWrongRole); v.Role != "supplier" {
		t.Errorf("Violation.Role = %q, want supplier", v.Role)
	}
}

func TestCompile_rejectsAmbiguousCounterpart(t *testing.T) {
	_, err := Compile(&registryv1.StateMachine{
		Roles:    []string{"a", "b", "c"},
		Messages: []*registryv1.StateMachineMessage{{Type: "m", SenderRole: "a"}},
	})
	if err == nil || !strings.Contains(err.Error(), "receiver") {
		t.Errorf("Compile(three roles, no receiver) error = %v, want one about the receiver", err)
	}
}

func TestCheck_corruptStateIsNotAViolation(t *testing.T) {
	m := shopMachine(t)
	_, err := m.Check([]byte("{"), Input{Sender: Initiator, Type: "request", Body: []byte("{}"), Now: t0})
	var v *Violation
	if err == nil || errors.As(err, &v) {
		t.Errorf("Check(corrupt state) error = %v, want a plain error", err)
	}
}
