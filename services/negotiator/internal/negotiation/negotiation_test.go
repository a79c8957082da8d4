package negotiation_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/parleyhq/parley/services/negotiator/internal/negotiation"
	"github.com/parleyhq/parley/services/negotiator/internal/protocol"
)

func TestPD_hashIsPinned(t *testing.T) {
	pd := []byte(negotiation.PD)
	if got := protocol.SHA1Hex(pd); got != negotiation.PDSHA1 {
		t.Errorf("SHA-1 of the negotiation PD = %s, want %s (a changed PD is a new protocol: update the constant deliberately)", got, negotiation.PDSHA1)
	}
	if got := protocol.SHA256Hex(pd); got != negotiation.PDSHA256 {
		t.Errorf("SHA-256 of the negotiation PD = %s, want %s", got, negotiation.PDSHA256)
	}
	d, err := protocol.Parse(pd)
	if err != nil || !d.Multiround || d.Name != "Parley Protocol Negotiation" || len(d.RequestSchema) == 0 || len(d.ResponseSchema) == 0 {
		t.Errorf("Parse(negotiation PD) = %+v, %v", d, err)
	}
}

var (
	inA  = `{"type":"object","required":["date","location"],"properties":{"date":{"type":"string","format":"date"},"location":{"type":"string"}}}`
	inB  = `{ "properties": { "location": {"type": "string"}, "date": {"format": "date", "type": "string"} }, "required": ["date", "location"], "type": "object" }`
	outA = `{"type":"object","required":["temperature"],"properties":{"temperature":{"type":"number"}}}`
)

func TestDeriveProtocol_deterministic(t *testing.T) {
	a, err := negotiation.DeriveProtocol(negotiation.Task{Name: "weather", Description: "Weather <today> & tomorrow", Input: json.RawMessage(inA), Output: json.RawMessage(outA)})
	if err != nil {
		t.Fatal(err)
	}
	b, err := negotiation.DeriveProtocol(negotiation.Task{Name: "weather", Description: "Weather <today> & tomorrow", Input: json.RawMessage(inB), Output: json.RawMessage(outA)})
	if err != nil {
		t.Fatal(err)
	}
	if string(a) != string(b) {
		t.Errorf("equal schemas written differently gave different PDs:\n%s\n---\n%s", a, b)
	}
	d, err := protocol.Parse(a)
	if err != nil {
		t.Fatal(err)
	}
	if d.Name != "weather" || d.Description != "Weather <today> & tomorrow" || d.Multiround {
		t.Errorf("derived PD metadata = %+v", d)
	}
	canon := `{"properties":{"date":{"format":"date","type":"string"},"location":{"type":"string"}},"required":["date","location"],"type":"object"}`
	var got, want any
	_ = json.Unmarshal(d.RequestSchema, &got)
	_ = json.Unmarshal([]byte(canon), &want)
	if gb, _ := json.Marshal(got); string(gb) != canon {
		t.Errorf("requestSchema = %s, want %s", gb, canon)
	}
}

func TestDeriveProtocol_errors(t *testing.T) {
	tests := []struct {
		name string
		task negotiation.Task
		want error
	}{
		{"no schemas", negotiation.Task{Name: "x"}, negotiation.ErrNoSchemas},
		{"no name", negotiation.Task{Input: json.RawMessage(inA), Output: json.RawMessage(outA)}, negotiation.ErrInvalidTask},
		{"not an object", negotiation.Task{Name: "x", Input: json.RawMessage(`{"type":"string"}`), Output: json.RawMessage(outA)}, negotiation.ErrInvalidTask},
		{"malformed", negotiation.Task{Name: "x", Input: json.RawMessage(`{`), Output: json.RawMessage(outA)}, negotiation.ErrInvalidTask},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := negotiation.DeriveProtocol(tt.task); !errors.Is(err, tt.want) {
				t.Errorf("DeriveProtocol() = %v, want %v", err, tt.want)
			}
		})
	}
}

func TestMachine(t *testing.T) {
	task := &negotiation.Task{Name: "t"}
	propose := negotiation.Message{Type: negotiation.TypePropose, Task: task, Protocol: "pd1"}
	type step struct {
		from negotiation.Side
		msg  negotiation.Message
		want error
	}
	tests := []struct {
		name      string
		max       int
		steps     []step
		wantState negotiation.State
		wantPD    string
	}{
		{
			name:      "propose accept",
			steps:     []step{{negotiation.Sender, propose, nil}, {negotiation.Receiver, negotiation.Message{Type: "accept", Protocol: "pd1", ProtocolHash: protocol.SHA1Hex([]byte("pd1"))}, nil}},
			wantState: negotiation.Accepted, wantPD: "pd1",
		},
		{
			name: "counter then accept",
			steps: []step{
				{negotiation.Sender, propose, nil},
				{negotiation.Receiver, negotiation.Message{Type: "counter", Protocol: "pd2"}, nil},
				{negotiation.Sender, negotiation.Message{Type: "accept", Protocol: "pd1"}, negotiation.ErrHashDiffer},
				{negotiation.Sender, negotiation.Message{Type: "accept", Protocol: "pd2"}, nil},
			},
			wantState: negotiation.Accepted, wantPD: "pd2",
		},
		{
			name: "task-only proposal accepted with a derived PD",
			steps: []step{
				{negotiation.Sender, negotiation.Message{Type: "propose", Task: task}, nil},
				{negotiation.Receiver, negotiation.Message{Type: "accept", Protocol: "derived"}, nil},
			},
			wantState: negotiation.Accepted, wantPD: "derived",
		},
		{
			name: "out of turn and closed",
			steps: []step{
				{negotiation.Receiver, propose, negotiation.ErrOutOfTurn},
				{negotiation.Sender, negotiation.Message{Type: "counter", Protocol: "x"}, negotiation.ErrOutOfTurn},
				{negotiation.Sender, propose, nil},
				{negotiation.Sender, negotiation.Message{Type: "counter", Protocol: "x"}, negotiation.ErrOutOfTurn},
				{negotiation.Receiver, negotiation.Message{Type: "reject", Reason: "no"}, nil},
				{negotiation.Sender, negotiation.Message{Type: "counter", Protocol: "x"}, negotiation.ErrClosed},
			},
			wantState: negotiation.Rejected, wantPD: "pd1",
		},
		{
			name: "max rounds",
			max:  2,
			steps: []step{
				{negotiation.Sender, propose, nil},
				{negotiation.Receiver, negotiation.Message{Type: "counter", Protocol: "a"}, nil},
				{negotiation.Sender, negotiation.Message{Type: "counter", Protocol: "b"}, negotiation.ErrMaxRounds},
			},
			wantState: negotiation.Failed, wantPD: "a",
		},
		{
			name: "empty accept after a task-only proposal",
			steps: []step{
				{negotiation.Sender, negotiation.Message{Type: "propose", Task: task}, nil},
				{negotiation.Receiver, negotiation.Message{Type: "accept"}, negotiation.ErrMalformed},
			},
			wantState: negotiation.Open, wantPD: "",
		},
		{
			name: "bad hash",
			steps: []step{
				{negotiation.Sender, propose, nil},
				{negotiation.Receiver, negotiation.Message{Type: "accept", Protocol: "pd1", ProtocolHash: "00"}, negotiation.ErrMalformed},
			},
			wantState: negotiation.Open, wantPD: "pd1",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.max == 0 {
				tt.max = 10 // the --negotiation-max-rounds default
			}
			m := negotiation.NewMachine(tt.max)
			for i, s := range tt.steps {
				if err := m.Apply(s.from, s.msg); !errors.Is(err, s.want) || (s.want == nil && err != nil) {
					t.Fatalf("step %d Apply(%v, %s) = %v, want %v", i, s.from, s.msg.Type, err, s.want)
				}
			}
			if m.State != tt.wantState || m.Proposal != tt.wantPD {
				t.Errorf("state %v proposal %q, want %v %q", m.State, m.Proposal, tt.wantState, tt.wantPD)
			}
		})
	}
}

// The cap comes from the caller (the config, or the stored negotiation
// being replayed), never from a default: zero allows no message at all.
func TestMachine_zeroMaxRoundsAllowsNoMessage(t *testing.T) {
	m := negotiation.NewMachine(0)
	err := m.Apply(negotiation.Sender, negotiation.Message{Type: negotiation.TypePropose, Task: &negotiation.Task{Name: "t"}, Protocol: "pd1"})
	if !errors.Is(err, negotiation.ErrMaxRounds) || m.State != negotiation.Failed {
		t.Errorf("first Apply = %v, state %v; want ErrMaxRounds and Failed", err, m.State)
	}
}

func TestDecodeMessage(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		wantErr bool
		meta    bool
	}{
		{name: "object", body: `{"type":"reject","reason":"no"}`, meta: true},
		{name: "string holding object", body: `"{\"type\":\"counter\",\"protocol\":\"p\"}"`, meta: true},
		{name: "unknown key", body: `{"type":"reject","extra":1}`, wantErr: true, meta: true},
		{name: "propose without task", body: `{"type":"propose"}`, wantErr: true, meta: true},
		{name: "unknown type", body: `{"type":"yes"}`, wantErr: true, meta: true},
		{name: "reference free text", body: `"Let us agree on a protocol."`, wantErr: true},
		{name: "nested past the limit", body: `{"type":"propose","task":{"name":"t","inputSchema":` + strings.Repeat(`{"a":`, 64) + `{}` + strings.Repeat(`}`, 64) + `}}`, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := negotiation.DecodeMessage([]byte(tt.body))
			if (err != nil) != tt.wantErr {
				t.Errorf("DecodeMessage(%s) = %v, wantErr %v", tt.body, err, tt.wantErr)
			}
			if got := negotiation.IsMetaMessage([]byte(tt.body)); got != tt.meta {
				t.Errorf("IsMetaMessage(%s) = %v, want %v", tt.body, got, tt.meta)
			}
		})
	}
}

func TestExtractFinalProtocol(t *testing.T) {
	tests := []struct {
		name, in, want string
		ok             bool
	}{
		{"tagged", "Agreed.\n<FINALPROTOCOL>\n---\nname: W\n---\nbody\n</FINALPROTOCOL>\nbye", "---\nname: W\n---\nbody", true},
		{"no tag", "Let's keep talking", "", false},
		{"unclosed", "<FINALPROTOCOL>abc", "", false},
		{"empty", "<FINALPROTOCOL>  </FINALPROTOCOL>", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := negotiation.ExtractFinalProtocol(tt.in)
			if got != tt.want || ok != tt.ok {
				t.Errorf("ExtractFinalProtocol(%q) = %q, %v; want %q, %v", tt.in, got, ok, tt.want, tt.ok)
			}
		})
	}
}

func TestThresholds(t *testing.T) {
	tab, err := negotiation.ParseThresholds("weather@bob=1/2/3; *@carol=4/5/6/7")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		task, target string
		want         negotiation.Thresholds
	}{
		{"weather", "bob", negotiation.Thresholds{1, 2, 3, 5}},
		{"other", "carol", negotiation.Thresholds{4, 5, 6, 7}},
		{"other", "bob", negotiation.Thresholds{3, 5, 10, 5}},
	}
	for _, tt := range tests {
		if got := tab.Lookup(tt.task, tt.target); got != tt.want {
			t.Errorf("Lookup(%q, %q) = %v, want %v", tt.task, tt.target, got, tt.want)
		}
	}
	// *@* matches everything the more specific keys do not.
	all, err := negotiation.ParseThresholds("*@*=1/1/1; weather@*=2/2/2")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := all.Lookup("other", "bob"), (negotiation.Thresholds{1, 1, 1, 5}); got != want {
		t.Errorf("Lookup(other, bob) under *@* = %v, want %v", got, want)
	}
	if got, want := all.Lookup("weather", "bob"), (negotiation.Thresholds{2, 2, 2, 5}); got != want {
		t.Errorf("Lookup(weather, bob) = %v, want %v", got, want)
	}
	for _, bad := range []string{"weather=1/2/3", "a@b=1/2", "a@b=1/x/3"} {
		if _, err := negotiation.ParseThresholds(bad); err == nil {
			t.Errorf("ParseThresholds(%q) succeeded", bad)
		}
	}
}
