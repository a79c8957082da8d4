package serviceprotocol

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/services/dispatcher/internal/protocolcontrol"
)

// The fixtures in testdata are the registry's parse of each PD
// (e2e/serviceprotocols_test.go keeps them equal to it), so these tests run
// the engine on exactly what it gets in production.
func fixture(t *testing.T, name string) *registryv1.StateMachine {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	sm := &registryv1.StateMachine{}
	if err := protojson.Unmarshal(raw, sm); err != nil {
		t.Fatalf("fixture %s: %v", name, err)
	}
	return sm
}

func machine(t *testing.T, name string) *protocolcontrol.Machine {
	t.Helper()
	m, err := protocolcontrol.Compile(fixture(t, name))
	if err != nil {
		t.Fatalf("Compile(%s) error = %v", name, err)
	}
	return m
}

var t0 = time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)

// body satisfies every schema of the built-in PDs.
const body = `{"task":{"what":"x"},"proposal":{"price":5},"offer":{"price":5},"item":"x","price":5}`

// oracle says, from the PD alone, whether sender may send typ answering
// answers when the pair is at state, and if not which rule it breaks. It is
// written from the format's definition (docs/state-machines.md), not from
// the engine.
func oracle(sm *registryv1.StateMachine, state string, sender protocolcontrol.Party, typ, answers string) protocolcontrol.Rule {
	var msg *registryv1.StateMachineMessage
	for _, m := range sm.GetMessages() {
		if m.GetType() == typ {
			msg = m
		}
	}
	if msg == nil {
		return protocolcontrol.RuleUnknownType
	}
	role := "supplier"
	if sm.GetRoles()[0] == "buyer" {
		role = "seller"
	}
	if sender == protocolcontrol.Initiator {
		role = sm.GetRoles()[0]
	}
	if !slices.Contains(msg.GetSenderRoles(), role) {
		return protocolcontrol.RuleWrongRole
	}
	if slices.Contains(sm.GetAlwaysAllowed(), typ) {
		return ""
	}
	var next []string
	for _, tr := range sm.GetTransitions() {
		if tr.GetMessage() == state {
			next = tr.GetNext()
		}
	}
	if !slices.Contains(next, typ) {
		return protocolcontrol.RuleNotAllowedAfter
	}
	allowed := msg.GetAnswers()
	if len(allowed) == 0 {
		for _, tr := range sm.GetTransitions() {
			if slices.Contains(tr.GetNext(), typ) {
				allowed = append(allowed, tr.GetMessage())
			}
		}
	}
	if !slices.Contains(allowed, answers) {
		return protocolcontrol.RuleNotAnAnswer
	}
	return ""
}

// TestEveryEdge walks every state each PD can reach and tries every message
// type, from both sides, answering every type: the edges of the PD pass and
// everything else is refused with the rule the oracle names. The refusals
// are generated from the PD, so no edge is missed.
func TestEveryEdge(t *testing.T) {
	for _, name := range []string{"delegate", "allocate", "transact", "haggle"} {
		t.Run(name, func(t *testing.T) {
			sm := fixture(t, name)
			m := machine(t, name)
			types := append(m.Types(), "not_a_type")
			opener := sm.GetMessages()[0].GetType()
			res, err := m.Check(nil, protocolcontrol.Input{Sender: protocolcontrol.Initiator, Type: opener, Body: []byte(body), Now: t0})
			if err != nil {
				t.Fatalf("Check(opener %s) error = %v", opener, err)
			}
			// Breadth first over the states reachable by accepted messages.
			seen := map[string][]byte{opener: res.State}
			queue := []string{opener}
			edges, refusals := 0, 0
			for len(queue) > 0 {
				state := queue[0]
				queue = queue[1:]
				pair := seen[state]
				for _, typ := range types {
					for _, sender := range []protocolcontrol.Party{protocolcontrol.Initiator, protocolcontrol.Counterpart} {
						for _, answers := range append(slices.Clone(types[:len(types)-1]), "") {
							want := oracle(sm, state, sender, typ, answers)
							res, err := m.Check(pair, protocolcontrol.Input{Sender: sender, Type: typ, AnswersType: answers, Body: []byte(body), Now: t0})
							var v *protocolcontrol.Violation
							switch {
							case want == "" && err != nil:
								t.Errorf("at %s, %s from %v answering %q: error = %v, want accepted", state, typ, sender, answers, err)
							case want != "" && (!errors.As(err, &v) || v.Rule != want):
								t.Errorf("at %s, %s from %v answering %q: error = %v, want violation %s", state, typ, sender, answers, err, want)
							case want == "":
								edges++
								if _, ok := seen[typ]; !ok && !res.Pair.Ended {
									seen[typ] = res.State
									queue = append(queue, typ)
								}
							default:
								refusals++
							}
						}
					}
				}
			}
			// Every non-terminal type of the PD was reached.
			for _, tr := range sm.GetTransitions() {
				if _, ok := seen[tr.GetMessage()]; !ok {
					t.Errorf("state %s was never reached", tr.GetMessage())
				}
			}
			t.Logf("%s: %d states, %d accepted edges, %d refusals", name, len(seen), edges, refusals)
		})
	}
}

type msg struct {
	from    protocolcontrol.Party
	typ     string
	answers string
	body    string        // "" means the all-purpose body
	at      time.Duration // after t0
}

const (
	c = protocolcontrol.Initiator
	s = protocolcontrol.Counterpart
)

func play(t *testing.T, m *protocolcontrol.Machine, msgs []msg) ([]byte, error) {
	t.Helper()
	var state []byte
	for i, x := range msgs {
		b := x.body
		if b == "" {
			b = body
		}
		res, err := m.Check(state, protocolcontrol.Input{Sender: x.from, Type: x.typ, AnswersType: x.answers, Body: []byte(b), Now: t0.Add(x.at)})
		if err != nil {
			if i == len(msgs)-1 {
				return state, err
			}
			t.Fatalf("message %d (%s) error = %v", i, x.typ, err)
		}
		state = res.State
	}
	return state, nil
}

func withDeadline(field string, secs int) string {
	var o map[string]any
	_ = json.Unmarshal([]byte(body), &o)
	o[field] = secs
	b, _ := json.Marshal(o)
	return string(b)
}

// Full conversations through each protocol, ending where the spec says.
func TestConversations(t *testing.T) {
	tests := []struct {
		name     string
		protocol string
		msgs     []msg
		outcome  protocolcontrol.Outcome
		ended    bool
	}{
		{"delegate accepted and completed", "delegate", []msg{
			{c, "new_task_request", "", withDeadline("offer_timeout", 60), 0},
			{s, "accept_offer", "new_task_request", "", time.Second},
			{c, "request_message", "accept_offer", "", 2 * time.Second},
			{s, "request_message", "request_message", "", 3 * time.Second},
			{s, "order_complete", "new_task_request", "", 4 * time.Second},
		}, protocolcontrol.OutcomeSuccess, true},
		{"delegate rejected", "delegate", []msg{
			{c, "new_task_request", "", "", 0},
			{s, "reject_offer", "new_task_request", "", 0},
		}, protocolcontrol.OutcomeFailure, true},
		{"allocate to confirm_success", "allocate", []msg{
			{c, "new_task_request", "", withDeadline("invite_offer_timeout", 30), 0},
			{s, "offer", "new_task_request", withDeadline("offer_timeout", 60), 10 * time.Second},
			{c, "accept_offer", "offer", "", 20 * time.Second},
			{s, "order_complete", "accept_offer", "", 30 * time.Second},
			{c, "confirm_success", "order_complete", "", 31 * time.Second},
		}, protocolcontrol.OutcomeSuccess, true},
		// The original reported confirm_fail as a success.
		{"allocate confirm_fail is a failure", "allocate", []msg{
			{c, "new_task_request", "", "", 0},
			{s, "offer", "new_task_request", "", 0},
			{c, "accept_offer", "offer", "", 0},
			{s, "order_complete", "accept_offer", "", 0},
			{c, "confirm_fail", "order_complete", "", 0},
		}, protocolcontrol.OutcomeFailure, true},
		{"allocate order complete awaits sign-off", "allocate", []msg{
			{c, "new_task_request", "", "", 0},
			{s, "offer", "new_task_request", "", 0},
			{c, "accept_offer", "offer", "", 0},
			{s, "order_complete", "accept_offer", "", 0},
		}, protocolcontrol.OutcomeSuccess, false},
		{"transact paid after a payment error", "transact", []msg{
			{c, "new_task_request", "", withDeadline("proposal_timeout", 30), 0},
			{s, "proposal", "new_task_request", "", time.Second},
			{c, "invite_offer", "proposal", withDeadline("invite_offer_timeout", 30), 2 * time.Second},
			{s, "offer", "invite_offer", withDeadline("offer_timeout", 30), 3 * time.Second},
			{c, "accept_offer", "offer", "", 4 * time.Second},
			{s, "payment_error", "accept_offer", withDeadline("offer_timeout", 30), 5 * time.Second},
			{c, "accept_offer", "payment_error", "", 6 * time.Second},
			{s, "payment_confirmed", "accept_offer", "", 7 * time.Second},
			// The template gap: the consumer's request after payment_confirmed answers it.
			{c, "request_message", "payment_confirmed", "", 8 * time.Second},
			{s, "order_complete", "request_message", "", 9 * time.Second},
			{c, "confirm_success", "order_complete", "", 10 * time.Second},
		}, protocolcontrol.OutcomeSuccess, true},
		{"transact cancel right after payment_confirmed", "transact", []msg{
			{c, "new_task_request", "", "", 0},
			{s, "proposal", "new_task_request", "", 0},
			{c, "invite_offer", "proposal", "", 0},
			{s, "offer", "invite_offer", "", 0},
			{c, "accept_offer", "offer", "", 0},
			{s, "payment_confirmed", "accept_offer", "", 0},
			{c, "cancel_order", "payment_confirmed", "", 0},
		}, protocolcontrol.OutcomeFailure, true},
		{"transact revoked before acceptance", "transact", []msg{
			{c, "new_task_request", "", "", 0},
			{s, "proposal", "new_task_request", "", 0},
			{c, "invite_offer", "proposal", "", 0},
			{s, "offer", "invite_offer", "", 0},
			{s, "revoke_offer", "invite_offer", "", 0},
		}, protocolcontrol.OutcomeFailure, true},
		{"transact withdrawn mid-way", "transact", []msg{
			{c, "new_task_request", "", "", 0},
			{s, "proposal", "new_task_request", "", 0},
			{c, "task_withdrawn", "proposal", "", 0},
		}, protocolcontrol.OutcomeFailure, true},
		{"haggle with a counter", "haggle", []msg{
			{c, "request_quote", "", withDeadline("quote_timeout", 60), 0},
			{s, "quote", "request_quote", withDeadline("quote_valid", 60), time.Second},
			{c, "counter", "quote", "", 2 * time.Second},
			{s, "quote", "counter", "", 3 * time.Second},
			{c, "accept", "quote", "", 4 * time.Second},
			{s, "deliver", "accept", "", 5 * time.Second},
		}, protocolcontrol.OutcomeSuccess, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			state, err := play(t, machine(t, tt.protocol), tt.msgs)
			if err != nil {
				t.Fatalf("last message error = %v", err)
			}
			p, _ := protocolcontrol.Inspect(state)
			if p.Outcome != tt.outcome || p.Ended != tt.ended {
				t.Errorf("pair = %+v, want outcome %q ended %v", p, tt.outcome, tt.ended)
			}
		})
	}
}

// Each deadline of each PD refuses the message it guards once passed,
// naming itself, and its expiry ends the pair.
func TestDeadlines(t *testing.T) {
	tests := []struct {
		name     string
		protocol string
		msgs     []msg // the last one is late
		deadline string
	}{
		{"delegate accept after offer_timeout", "delegate", []msg{
			{c, "new_task_request", "", withDeadline("offer_timeout", 10), 0},
			{s, "accept_offer", "new_task_request", "", 10 * time.Second},
		}, "offer_timeout"},
		{"allocate offer after invite_offer_timeout", "allocate", []msg{
			{c, "new_task_request", "", withDeadline("invite_offer_timeout", 10), 0},
			{s, "offer", "new_task_request", "", 11 * time.Second},
		}, "invite_offer_timeout"},
		{"allocate accept after offer_timeout", "allocate", []msg{
			{c, "new_task_request", "", withDeadline("invite_offer_timeout", 10), 0},
			{s, "offer", "new_task_request", withDeadline("offer_timeout", 5), 9 * time.Second},
			{c, "accept_offer", "offer", "", 14 * time.Second},
		}, "offer_timeout"},
		{"transact proposal after proposal_timeout", "transact", []msg{
			{c, "new_task_request", "", withDeadline("proposal_timeout", 10), 0},
			{s, "proposal", "new_task_request", "", time.Minute},
		}, "proposal_timeout"},
		{"transact offer after invite_offer_timeout", "transact", []msg{
			{c, "new_task_request", "", "", 0},
			{s, "proposal", "new_task_request", "", 0},
			{c, "invite_offer", "proposal", withDeadline("invite_offer_timeout", 10), 0},
			{s, "reject_invite_offer", "invite_offer", "", 10 * time.Second},
		}, "invite_offer_timeout"},
		{"transact re-accept after payment_error's new offer_timeout", "transact", []msg{
			{c, "new_task_request", "", "", 0},
			{s, "proposal", "new_task_request", "", 0},
			{c, "invite_offer", "proposal", "", 0},
			{s, "offer", "invite_offer", withDeadline("offer_timeout", 10), 0},
			{c, "accept_offer", "offer", "", 5 * time.Second},
			{s, "payment_error", "accept_offer", withDeadline("offer_timeout", 100), 6 * time.Second},
			{c, "accept_offer", "payment_error", "", 106 * time.Second},
		}, "offer_timeout"},
		{"haggle accept after quote_valid", "haggle", []msg{
			{c, "request_quote", "", "", 0},
			{s, "quote", "request_quote", withDeadline("quote_valid", 10), 0},
			{c, "accept", "quote", "", 10 * time.Second},
		}, "quote_valid"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := machine(t, tt.protocol)
			before, err := play(t, m, tt.msgs)
			var v *protocolcontrol.Violation
			if !errors.As(err, &v) || v.Rule != protocolcontrol.RuleDeadlinePassed || v.Deadline != tt.deadline {
				t.Fatalf("late %s error = %v, want DEADLINE_PASSED naming %s", tt.msgs[len(tt.msgs)-1].typ, err, tt.deadline)
			}
			if !strings.Contains(v.Error(), tt.deadline) {
				t.Errorf("Violation.Error() = %q, want it to name %s", v.Error(), tt.deadline)
			}
			res, fired, err := m.Expire(before, tt.deadline, t0.Add(time.Hour))
			if err != nil || !fired || !res.Pair.Ended || res.Pair.Outcome != protocolcontrol.OutcomeFailure {
				t.Errorf("Expire(%s) = %+v, fired %v, %v; want the pair ended in failure", tt.deadline, res.Pair, fired, err)
			}
		})
	}
}

// A revoke after acceptance is refused, and so is an acceptance after a
// revoke: whichever the dialogue's order puts first wins.
func TestAcceptVersusRevoke(t *testing.T) {
	m := machine(t, "transact")
	offered := []msg{
		{c, "new_task_request", "", "", 0},
		{s, "proposal", "new_task_request", "", 0},
		{c, "invite_offer", "proposal", "", 0},
		{s, "offer", "invite_offer", "", 0},
	}
	_, err := play(t, m, append(slices.Clone(offered), msg{c, "accept_offer", "offer", "", 0}, msg{s, "revoke_offer", "invite_offer", "", 0}))
	var v *protocolcontrol.Violation
	if !errors.As(err, &v) || v.Rule != protocolcontrol.RuleNotAllowedAfter || v.State != "accept_offer" {
		t.Errorf("revoke after accept: error = %v, want NOT_ALLOWED_AFTER accept_offer", err)
	}
	_, err = play(t, m, append(slices.Clone(offered), msg{s, "revoke_offer", "invite_offer", "", 0}, msg{c, "accept_offer", "offer", "", 0}))
	if !errors.As(err, &v) || v.Rule != protocolcontrol.RulePairEnded || v.State != "revoke_offer" {
		t.Errorf("accept after revoke: error = %v, want PAIR_ENDED after revoke_offer", err)
	}
}

func TestBuiltins(t *testing.T) {
	seen := map[string]bool{}
	for _, p := range Builtins() {
		if len(p.Content) == 0 || len(p.Hash) != 40 || seen[p.Hash] {
			t.Errorf("builtin %s = %d bytes, hash %q; want content and a unique 40-hex hash", p.Name, len(p.Content), p.Hash)
		}
		seen[p.Hash] = true
		if got, ok := ByHash(p.Hash); !ok || got.Name != p.Name {
			t.Errorf("ByHash(%s) = %v, %v; want %s", p.Hash, got.Name, ok, p.Name)
		}
	}
	if _, ok := ByName("barter"); ok {
		t.Error("ByName(barter) found a protocol")
	}
}

// Every SendMessage asks ByHash whether its protocol is a built-in one,
// most with none: a hash that cannot be a PD's answers without hashing
// the built-in PDs, so without allocating.
func TestByHash_notAHashCostsNothing(t *testing.T) {
	for _, h := range []string{"", "abc", strings.Repeat("g", 40)} {
		if _, ok := ByHash(h); ok {
			t.Errorf("ByHash(%q) found a protocol", h)
		}
		if n := testing.AllocsPerRun(10, func() { ByHash(h) }); n != 0 {
			t.Errorf("ByHash(%q) allocated %v times, want 0", h, n)
		}
	}
}

type fakeRegistrar struct {
	stored [][]byte
	fail   error
}

func (f *fakeRegistrar) RegisterProtocol(_ context.Context, content []byte) error {
	if f.fail != nil {
		return f.fail
	}
	f.stored = append(f.stored, content)
	return nil
}

func TestRegister(t *testing.T) {
	f := &fakeRegistrar{}
	if err := Register(t.Context(), f); err != nil || len(f.stored) != 3 {
		t.Fatalf("Register() = %v, stored %d; want nil, 3", err, len(f.stored))
	}
	f = &fakeRegistrar{fail: errors.New("registry down")}
	err := Register(t.Context(), f)
	for _, n := range Names {
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("protocol %s", n)) {
			t.Errorf("Register(failing) error = %v, want it to name %s", err, n)
		}
	}
}
