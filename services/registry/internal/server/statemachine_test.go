package server

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/durationpb"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/services/registry/internal/pd"
)

// The service protocols' keys reach Protocol.state_machine intact.
func TestStateMachineProto_serviceKeys(t *testing.T) {
	const doc = `---
stateMachine:
  roles: [consumer, supplier]
  messages:
    - type: ask
      sender: consumer
      deadlines: [{name: offer_timeout, guards: [accept], max: 1h}]
    - {type: accept, sender: supplier, answers: [ask], opensOrder: true}
    - {type: note, sender: [consumer, supplier]}
    - {type: done, sender: supplier, outcome: success}
    - {type: quit, sender: consumer, outcome: failure}
  alwaysAllowed: [quit]
  transitions:
    - {message: ask, next: [accept]}
    - {message: accept, next: [note, done]}
    - {message: note, next: [note, done]}
---
x`
	md, err := pd.Parse([]byte(doc), pd.Options{})
	if err != nil {
		t.Fatalf("Parse() error = %v", err)
	}
	want := &registryv1.StateMachine{
		Roles:     []string{"consumer", "supplier"},
		TypeField: "type",
		Initial:   []string{"ask"},
		Messages: []*registryv1.StateMachineMessage{
			{Type: "ask", SenderRole: "consumer", SenderRoles: []string{"consumer"}, Deadlines: []*registryv1.StateMachineDeadline{
				{Name: "offer_timeout", Field: "offer_timeout", Guards: []string{"accept"}, Max: durationpb.New(time.Hour)},
			}},
			{Type: "accept", SenderRole: "supplier", SenderRoles: []string{"supplier"}, Answers: []string{"ask"}, OpensOrder: true},
			{Type: "note", SenderRole: "consumer", SenderRoles: []string{"consumer", "supplier"}},
			{Type: "done", SenderRole: "supplier", SenderRoles: []string{"supplier"}, Outcome: registryv1.StateMachineOutcome_STATE_MACHINE_OUTCOME_SUCCESS},
			{Type: "quit", SenderRole: "consumer", SenderRoles: []string{"consumer"}, Outcome: registryv1.StateMachineOutcome_STATE_MACHINE_OUTCOME_FAILURE},
		},
		Transitions: []*registryv1.StateMachineTransition{
			{Message: "ask", Next: []string{"accept"}},
			{Message: "accept", Next: []string{"note", "done"}},
			{Message: "note", Next: []string{"note", "done"}},
		},
		AlwaysAllowed: []string{"quit"},
	}
	if diff := cmp.Diff(want, stateMachineProto(md.StateMachine), protocmp.Transform()); diff != "" {
		t.Errorf("stateMachineProto() mismatch (-want +got):\n%s", diff)
	}
}
