package inbound_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/parleyhq/parley/services/dispatcher/internal/agora"
	"github.com/parleyhq/parley/services/dispatcher/internal/directory"
	"github.com/parleyhq/parley/services/dispatcher/internal/hosted"
	"github.com/parleyhq/parley/services/dispatcher/internal/hub"
	"github.com/parleyhq/parley/services/dispatcher/internal/inbound"
	"github.com/parleyhq/parley/services/dispatcher/internal/llm"
	"github.com/parleyhq/parley/services/dispatcher/internal/metrics"
	"github.com/parleyhq/parley/services/dispatcher/internal/routine"
	"github.com/parleyhq/parley/services/dispatcher/internal/routine/routinetest"
	"github.com/parleyhq/parley/services/dispatcher/internal/store/boltstore"
)

const (
	agent = "clients/acme/agents/calc"
	hash  = "00112233445566778899aabbccddeeff00112233"
	other = "ffeeddccbbaa99887766554433221100ffeeddcc"
)

// fakeRegistry holds one agent supporting one protocol with schemas.
type fakeRegistry struct{}

func (fakeRegistry) GetAgent(_ context.Context, name string) (directory.Agent, error) {
	if name != agent {
		return directory.Agent{}, directory.ErrNotFound
	}
	return directory.Agent{Name: agent, Supported: map[string]bool{hash: true}, Unsupported: map[string]bool{}, Dialect: agora.Std}, nil
}

func (fakeRegistry) ResolveProtocol(_ context.Context, h string, _ []string) (directory.Document, error) {
	if h != hash {
		return directory.Document{}, directory.ErrNotFound
	}
	return directory.Document{Hash: hash, Content: []byte("Add a and b."),
		RequestSchema:  `{"type":"object","required":["a","b"],"properties":{"a":{"type":"integer"},"b":{"type":"integer"}}}`,
		ResponseSchema: `{"type":"integer"}`}, nil
}

func (fakeRegistry) CreateProtocol(context.Context, []byte) error               { return nil }
func (fakeRegistry) AddSupportedProtocol(context.Context, string, string) error { return nil }

type agents struct{ dir *directory.Directory }

func (a agents) Exists(ctx context.Context, name string) error {
	_, err := a.dir.Agent(ctx, name)
	return err
}

func newPipeline(t *testing.T) (*inbound.Pipeline, *hosted.Set) {
	t.Helper()
	st, err := boltstore.Open(t.TempDir(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	m := metrics.New(nil)
	dir := directory.New(fakeRegistry{}, directory.Options{CacheTTL: time.Minute, Now: time.Now})
	routines := hosted.New(st, agents{dir}, hosted.Options{QuarantineAfter: 2, Metrics: m, Limits: routinetest.Limits(routine.Limits{Pool: routine.InProcessForTests()})})
	p := inbound.New(st, dir, routines, hub.New(hub.Options{Queue: 64, Timeout: 10 * time.Second, Metrics: m}), llm.Counted{LLM: llm.NoLLM{}, Metrics: m}, nil, nil, inbound.Options{ConversationTTL: 5 * time.Minute, MaxConversationsPerPeer: 100, Metrics: m})
	return p, routines
}

func deliver(t *testing.T, p *inbound.Pipeline, envelope string) (inbound.Reply, map[string]any) {
	t.Helper()
	r := p.Deliver(t.Context(), inbound.Envelope{Agent: agent, Peer: "10.0.0.9", JSON: []byte(envelope)})
	var m map[string]any
	if err := json.Unmarshal(r.Body, &m); err != nil {
		t.Fatalf("Deliver(%s) body %q is not JSON", envelope, r.Body)
	}
	return r, m
}

func TestDeliver_paths(t *testing.T) {
	p, routines := newPipeline(t)
	if _, err := routines.Install(t.Context(), hosted.Name(agent, hash), "def reply(q, m):\n    if q['a'] == 0:\n        return 'zero'\n    return q['a'] + q['b']\n"); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, envelope string
		status         int
		path, want     string
	}{
		{"routine", `{"protocolHash":"` + hash + `","body":{"a":2,"b":3}}`, 200, "routine", `"body":5`},
		{"request off schema", `{"protocolHash":"` + hash + `","body":{"a":"two"}}`, 200, "failure", `schema`},
		{"output off schema", `{"protocolHash":"` + hash + `","body":{"a":0,"b":1}}`, 200, "failure", `does not fit the protocol`},
		{"unsupported", `{"protocolHash":"` + other + `","body":{}}`, 200, "rejected", `Unsupported protocol`},
		{"no LLM for natural language", `{"body":"hi"}`, 200, "failure", `no LLM is configured`},
		{"malformed", `[1]`, 400, "failure", `failure`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r, _ := deliver(t, p, tt.envelope)
			if r.Status != tt.status || r.Path != tt.path || !strings.Contains(string(r.Body), tt.want) {
				t.Errorf("Deliver(%s) = %d %s via %q; want %d via %q containing %s", tt.envelope, r.Status, r.Body, r.Path, tt.status, tt.path, tt.want)
			}
		})
	}
	r := p.Deliver(t.Context(), inbound.Envelope{Agent: "clients/acme/agents/ghost", JSON: []byte(`{"body":"hi"}`)})
	if r.Status != 404 {
		t.Errorf("Deliver(unknown agent) = %d %s, want 404", r.Status, r.Body)
	}
}
