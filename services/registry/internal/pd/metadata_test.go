package pd

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestParse_layouts(t *testing.T) {
	tests := []struct {
		name    string
		content string
		want    Metadata
	}{
		{
			name:    "front matter (canonical weather PD)",
			content: weatherPD,
			want:    Metadata{Layout: LayoutFrontMatter, Name: "Weather Forecast Query Protocol", Description: "Query the weather forecast for a given date and location."},
		},
		{
			name:    "standard layout",
			content: "name: Std\ndescription: Standard layout.\nmultiround: true\ntags: [a, b]\n---\nText.",
			want:    Metadata{Layout: LayoutStandard, Name: "Std", Description: "Standard layout.", Multiround: true, Tags: []string{"a", "b"}},
		},
		{
			name:    "CRLF front matter",
			content: "---\r\nname: Crlf\r\n---\r\nText.",
			want:    Metadata{Layout: LayoutFrontMatter, Name: "Crlf", Description: DefaultDescription},
		},
		{
			name:    "no metadata",
			content: "Just text, no rules at all.",
			want:    Metadata{Layout: LayoutNone, Name: DefaultName, Description: DefaultDescription},
		},
		{
			name:    "prose before a rule is not metadata",
			content: "Send a greeting.\n---\nMore text.",
			want:    Metadata{Layout: LayoutNone, Name: DefaultName, Description: DefaultDescription},
		},
		{
			name:    "unclosed front matter",
			content: "---\nname: Open\nText.",
			want:    Metadata{Layout: LayoutNone, Name: DefaultName, Description: DefaultDescription},
		},
		{
			name:    "empty front matter",
			content: "---\n---\nText.",
			want:    Metadata{Layout: LayoutFrontMatter, Name: DefaultName, Description: DefaultDescription},
		},
		{
			name:    "non-ASCII values and a single tag",
			content: "---\nname: Météo °C\ntags: weather\nother: ignored\n---\nTempérature.",
			want:    Metadata{Layout: LayoutFrontMatter, Name: "Météo °C", Description: DefaultDescription, Tags: []string{"weather"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse([]byte(tt.content), Options{})
			if err != nil {
				t.Fatalf("Parse() error = %v", err)
			}
			if diff := cmp.Diff(&tt.want, got); diff != "" {
				t.Errorf("Parse() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

const smPD = `---
name: Order
requestSchema:
  type: object
  required: [item]
  properties:
    item: {type: string}
responseSchema: '{"type": "object"}'
stateMachine:
  roles: [buyer, seller]
  messages:
    - type: task
      sender: buyer
      receiver: seller
      schema: {type: object, required: [deadline]}
    - type: proposal
      sender: seller
    - type: order
      sender: buyer
  transitions:
    - message: task
      next: [proposal]
      deadline: 5m
    - message: proposal
      next: [order]
  terminal: [order]
---
Orders.`

func TestParse_machineReadableParts(t *testing.T) {
	got, err := Parse([]byte(smPD), Options{})
	if err != nil {
		t.Fatalf("Parse() error = %v", err)
	}
	want := &Metadata{
		Layout:             LayoutFrontMatter,
		Name:               "Order",
		Description:        DefaultDescription,
		RequestSchemaJSON:  `{"properties":{"item":{"type":"string"}},"required":["item"],"type":"object"}`,
		ResponseSchemaJSON: `{"type":"object"}`,
		StateMachine: &StateMachine{
			Roles:     []string{"buyer", "seller"},
			TypeField: "type",
			Messages: []MessageType{
				{Type: "task", Senders: []string{"buyer"}, Receiver: "seller", SchemaJSON: `{"required":["deadline"],"type":"object"}`},
				{Type: "proposal", Senders: []string{"seller"}},
				{Type: "order", Senders: []string{"buyer"}},
			},
			Initial: []string{"task"},
			Transitions: []Transition{
				{Message: "task", Next: []string{"proposal"}, Deadline: 5 * time.Minute},
				{Message: "proposal", Next: []string{"order"}},
			},
			Terminal: []string{"order"},
		},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Parse() mismatch (-want +got):\n%s", diff)
	}
}

// servicePD uses every key the service protocols need: several senders,
// answers, deadlines set from body fields, outcomes and alwaysAllowed.
const servicePD = `---
name: Mini service
stateMachine:
  roles: [consumer, supplier]
  messages:
    - type: new_task_request
      sender: consumer
      deadlines:
        - {name: offer_timeout, guards: [offer, reject_task], max: 1h}
    - type: offer
      sender: supplier
      opensOrder: true
    - type: reject_task
      sender: supplier
      outcome: failure
    - type: note
      sender: [consumer, supplier]
      answers: [offer, note]
    - type: done
      sender: supplier
      outcome: success
      deadlines:
        - {name: sign_off, field: sign_off_seconds, guards: [note]}
    - type: task_withdrawn
      sender: consumer
      outcome: failure
  alwaysAllowed: [task_withdrawn]
  transitions:
    - {message: new_task_request, next: [offer, reject_task]}
    - {message: offer, next: [note, done]}
    - {message: note, next: [note, done]}
---
A small service.`

func TestParse_serviceStateMachine(t *testing.T) {
	got, err := Parse([]byte(servicePD), Options{})
	if err != nil {
		t.Fatalf("Parse() error = %v", err)
	}
	want := &StateMachine{
		Roles:     []string{"consumer", "supplier"},
		TypeField: "type",
		Messages: []MessageType{
			{Type: "new_task_request", Senders: []string{"consumer"}, Deadlines: []Deadline{{Name: "offer_timeout", Field: "offer_timeout", Guards: []string{"offer", "reject_task"}, Max: time.Hour}}},
			{Type: "offer", Senders: []string{"supplier"}, OpensOrder: true},
			{Type: "reject_task", Senders: []string{"supplier"}, Outcome: OutcomeFailure},
			{Type: "note", Senders: []string{"consumer", "supplier"}, Answers: []string{"offer", "note"}},
			{Type: "done", Senders: []string{"supplier"}, Outcome: OutcomeSuccess, Deadlines: []Deadline{{Name: "sign_off", Field: "sign_off_seconds", Guards: []string{"note"}}}},
			{Type: "task_withdrawn", Senders: []string{"consumer"}, Outcome: OutcomeFailure},
		},
		Initial: []string{"new_task_request"},
		Transitions: []Transition{
			{Message: "new_task_request", Next: []string{"offer", "reject_task"}},
			{Message: "offer", Next: []string{"note", "done"}},
			{Message: "note", Next: []string{"note", "done"}},
		},
		AlwaysAllowed: []string{"task_withdrawn"},
	}
	if diff := cmp.Diff(want, got.StateMachine); diff != "" {
		t.Errorf("Parse().StateMachine mismatch (-want +got):\n%s", diff)
	}
}

func TestParse_rejectsInvalidMetadata(t *testing.T) {
	tests := []struct {
		name, content string
		opts          Options
		wantInMsg     string
	}{
		{"bad YAML in front matter", "---\nname: [unclosed\n---\nx", Options{}, "not valid YAML"},
		{"front matter not a mapping", "---\n- a\n- b\n---\nx", Options{}, "YAML mapping"},
		{"multiround not a bool", "---\nmultiround: sometimes\n---\nx", Options{}, "multiround"},
		{"name is a list", "---\nname: [a]\n---\nx", Options{}, "metadata key name"},
		{"schema wrong type", "---\nrequestSchema: {type: 12}\n---\nx", Options{}, "requestSchema"},
		{"schema string not JSON", "---\nresponseSchema: '{nope'\n---\nx", Options{}, "responseSchema"},
		{"schema external ref", "---\nrequestSchema: {$ref: 'https://example.com/s.json'}\n---\nx", Options{}, "requestSchema"},
		{"schema file ref", "---\nrequestSchema: {$ref: 'file:///etc/passwd'}\n---\nx", Options{}, "requestSchema"},
		{"state machine unknown key", "---\nstateMachine: {roles: [a], messages: [{type: m, sender: a}], transitons: []}\n---\nx", Options{}, "transitons"}, //nolint:misspell // the typo is the unknown key under test
		{"state machine undeclared role", "---\nstateMachine: {roles: [a], messages: [{type: m, sender: b}]}\n---\nx", Options{}, `messages[0].sender: "b" is not one of roles`},
		{"state machine undeclared next", "---\nstateMachine: {roles: [a], messages: [{type: m, sender: a}], transitions: [{message: m, next: [z]}]}\n---\nx", Options{}, `transitions[0].next[0]: "z"`},
		{"state machine bad deadline", "---\nstateMachine: {roles: [a], messages: [{type: m, sender: a}, {type: n, sender: a}], transitions: [{message: m, next: [n], deadline: soon}]}\n---\nx", Options{}, "deadline"},
		{"state machine sender list undeclared", "---\nstateMachine: {roles: [a], messages: [{type: m, sender: [a, b]}]}\n---\nx", Options{}, `messages[0].sender[1]: "b" is not one of roles`},
		{"state machine answers undeclared", "---\nstateMachine: {roles: [a], messages: [{type: m, sender: a, answers: [z]}]}\n---\nx", Options{}, `messages[0].answers[0]: "z" is not a declared message type`},
		{"state machine bad outcome", "---\nstateMachine: {roles: [a], messages: [{type: m, sender: a, outcome: maybe}]}\n---\nx", Options{}, `messages[0].outcome: "maybe" is not success or failure`},
		{"state machine deadline without guards", "---\nstateMachine: {roles: [a], messages: [{type: m, sender: a, deadlines: [{name: t}]}]}\n---\nx", Options{}, "messages[0].deadlines[0].guards: must list"},
		{"state machine deadline guard undeclared", "---\nstateMachine: {roles: [a], messages: [{type: m, sender: a, deadlines: [{name: t, guards: [z]}]}]}\n---\nx", Options{}, `messages[0].deadlines[0].guards[0]: "z"`},
		{"state machine deadline twice", "---\nstateMachine: {roles: [a], messages: [{type: m, sender: a, deadlines: [{name: t, guards: [m]}, {name: t, guards: [m]}]}]}\n---\nx", Options{}, `messages[0].deadlines[1].name: "t" is declared twice`},
		{"state machine deadline bad max", "---\nstateMachine: {roles: [a], messages: [{type: m, sender: a, deadlines: [{name: t, guards: [m], max: long}]}]}\n---\nx", Options{}, "messages[0].deadlines[0].max"},
		{"state machine always allowed undeclared", "---\nstateMachine: {roles: [a], messages: [{type: m, sender: a}], alwaysAllowed: [z]}\n---\nx", Options{}, `alwaysAllowed[0]: "z"`},
		{"state machine empty", "---\nstateMachine: {}\n---\nx", Options{}, "roles: must list"},
		{"state machine message schema", "---\nstateMachine: {roles: [a], messages: [{type: m, sender: a, schema: {minimum: x}}]}\n---\nx", Options{}, "messages[0].schema"},
		{"front matter nested 65 levels", "---\nx: " + strings.Repeat("[", 65) + strings.Repeat("]", 65) + "\n---\nx", Options{}, "64 levels"},
		{"schema string nested 65 levels", "---\nresponseSchema: '" + strings.Repeat(`{"not":`, 65) + "{}" + strings.Repeat("}", 65) + "'\n---\nx", Options{}, "64 levels"},
		{"schema nested 65 levels through aliases", "---\nx: &a " + strings.Repeat("{not: ", 40) + "{}" + strings.Repeat("}", 40) + "\nrequestSchema: " + strings.Repeat("{not: ", 30) + "*a" + strings.Repeat("}", 30) + "\n---\nx", Options{}, "64 levels"},
		{"strict without metadata", "text", Options{Strict: true}, "strict"},
		{"strict missing key", "---\nname: a\ndescription: b\n---\nx", Options{Strict: true}, "multiround"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			md, err := Parse([]byte(tt.content), tt.opts)
			if !errors.Is(err, ErrInvalidMetadata) {
				t.Fatalf("Parse(%q) = %+v, %v; want ErrInvalidMetadata", tt.content, md, err)
			}
			if !strings.Contains(err.Error(), tt.wantInMsg) {
				t.Errorf("Parse(%q) error = %q, want it to mention %q", tt.content, err, tt.wantInMsg)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("Parse(%q) error spans lines: %q", tt.content, err)
			}
		})
	}
}

// TestParse_schemaRefOutsideDocumentIsRefused proves a $ref never loads
// anything: a file: ref to a file holding a secret is refused without the
// secret in the error, and so is an http: ref (to a server that counts
// requests) and a ref with an unknown scheme.
func TestParse_schemaRefOutsideDocumentIsRefused(t *testing.T) {
	const secret = "TOP-SECRET-BYTES"
	path := filepath.Join(t.TempDir(), "secret.json")
	if err := os.WriteFile(path, []byte(`{"type": "`+secret+`"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hits.Add(1)
		_, _ = io.WriteString(w, `{"title": "`+secret+`"}`)
	}))
	t.Cleanup(srv.Close)
	for _, ref := range []string{"file://" + path, path, srv.URL + "/schema.json", "gopher://example.com/x"} {
		t.Run(ref, func(t *testing.T) {
			content := "---\nname: Refs\nrequestSchema:\n  $ref: \"" + ref + "\"\n---\nText."
			_, err := Parse([]byte(content), Options{})
			if !errors.Is(err, ErrInvalidMetadata) {
				t.Fatalf("Parse(requestSchema $ref %s) error = %v; want ErrInvalidMetadata", ref, err)
			}
			if strings.Contains(err.Error(), secret) {
				t.Errorf("Parse(requestSchema $ref %s) error leaks the referenced content: %v", ref, err)
			}
			if !strings.Contains(err.Error(), "outside the schema") {
				t.Errorf("Parse(requestSchema $ref %s) error = %v; want it to say refs outside the schema are refused", ref, err)
			}
		})
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("the http $ref target was requested %d times, want 0", n)
	}
}
