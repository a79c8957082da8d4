package directory_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/parleyhq/parley/platform/resource"
	"github.com/parleyhq/parley/services/dispatcher/internal/directory"
)

type fakeRegistry struct {
	agents      map[string]directory.Agent
	docs        map[string]directory.Document
	getAgent    atomic.Int64
	resolve     atomic.Int64
	created     [][]byte
	supported   []string
	unavailable bool
}

func (f *fakeRegistry) GetAgent(_ context.Context, name string) (directory.Agent, error) {
	f.getAgent.Add(1)
	if f.unavailable {
		return directory.Agent{}, directory.ErrUnavailable
	}
	a, ok := f.agents[name]
	if !ok {
		return directory.Agent{}, directory.ErrNotFound
	}
	return a, nil
}

func (f *fakeRegistry) ResolveProtocol(_ context.Context, hash string, _ []string) (directory.Document, error) {
	f.resolve.Add(1)
	d, ok := f.docs[hash]
	if !ok {
		return directory.Document{}, directory.ErrNotFound
	}
	return d, nil
}

func (f *fakeRegistry) CreateProtocol(_ context.Context, content []byte) error {
	f.created = append(f.created, content)
	return nil
}

func (f *fakeRegistry) AddSupportedProtocol(_ context.Context, agent, hash string) error {
	f.supported = append(f.supported, agent+" "+hash)
	return nil
}

const agent = "clients/acme/agents/weather"

func TestDirectory(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	reg := &fakeRegistry{
		agents: map[string]directory.Agent{agent: {Name: agent}},
		docs: map[string]directory.Document{
			"aa": {Hash: "aa", Content: []byte("pd"), RequestSchema: `{"type":"object"}`},
			"bb": {Hash: "bb", Content: []byte("broken"), RequestSchema: `{"type":5}`},
		},
	}
	d := directory.New(reg, directory.Options{CacheTTL: time.Minute, NegativeTTL: time.Minute, Now: func() time.Time { return now }})
	ctx := t.Context()

	for range 3 {
		if a, err := d.Agent(ctx, agent); err != nil || a.Name != agent {
			t.Fatalf("Agent = %v, %v", a, err)
		}
	}
	if n := reg.getAgent.Load(); n != 1 {
		t.Errorf("registry GetAgent calls = %d, want 1 (cached)", n)
	}
	_, err := d.Agent(ctx, "clients/acme/agents/ghost")
	var nf *resource.Error
	if !errors.Is(err, directory.ErrNotFound) || !errors.As(err, &nf) || nf.Kind != "agent" || nf.Name != "clients/acme/agents/ghost" {
		t.Errorf("Agent(ghost) = %v, want a resource error of kind agent", err)
	}
	_, _ = d.Agent(ctx, "clients/acme/agents/ghost")
	if n := reg.getAgent.Load(); n != 2 {
		t.Errorf("registry GetAgent calls = %d, want 2 (the unknown agent is cached negatively)", n)
	}
	if _, err := d.RefreshAgent(ctx, agent); err != nil || reg.getAgent.Load() != 3 {
		t.Errorf("RefreshAgent = %v after %d calls; want a registry read", err, reg.getAgent.Load())
	}

	p, err := d.Protocol(ctx, "aa", nil)
	if err != nil || p.Schemas.Request == nil || p.SchemaErr != nil {
		t.Fatalf("Protocol(aa) = %+v, %v; want compiled schemas", p, err)
	}
	if _, ok := d.PeekProtocol("aa"); !ok {
		t.Error("PeekProtocol(aa) after Protocol = not cached")
	}
	if p, err := d.Protocol(ctx, "bb", nil); err != nil || p.SchemaErr == nil {
		t.Errorf("Protocol(bb) = %+v, %v; want a SchemaErr", p, err)
	}
	if _, err := d.Protocol(ctx, "cc", nil); !errors.Is(err, directory.ErrNotFound) {
		t.Errorf("Protocol(cc) = %v, want ErrNotFound", err)
	}

	if err := d.AddSupported(ctx, agent, "aa"); err != nil || len(reg.supported) != 1 {
		t.Fatalf("AddSupported = %v, registry saw %v", err, reg.supported)
	}
	before := reg.getAgent.Load()
	_, _ = d.Agent(ctx, agent)
	if reg.getAgent.Load() != before+1 {
		t.Error("Agent after AddSupported served the stale cached agent")
	}
}

func TestValidAgentName(t *testing.T) {
	for name, want := range map[string]bool{
		agent:                         true,
		"clients/acme/agents/w-1":     true,
		"clients/Acme/agents/weather": false,
		"clients/acme/agents/1w":      false,
		"clients/acme/agent/weather":  false,
		"clients/acme/agents/":        false,
	} {
		if got := directory.ValidAgentName(name); got != want {
			t.Errorf("ValidAgentName(%q) = %v, want %v", name, got, want)
		}
	}
}

// gatedRegistry is a fake registry whose first GetAgent answers NotFound
// only once gate closes, as a lookup that read the registry just before
// the agent was created and is slow to return; later calls find the agent.
type gatedRegistry struct {
	directory.Registry // nil: other methods panic
	calls              atomic.Int64
	read, gate         chan struct{}
}

func (g *gatedRegistry) GetAgent(_ context.Context, name string) (directory.Agent, error) {
	if g.calls.Add(1) > 1 {
		return directory.Agent{Name: name}, nil
	}
	close(g.read)
	select {
	case <-g.gate:
	case <-time.After(5 * time.Second): // a RefreshAgent sharing this lookup waits on it: fail, don't hang
	}
	return directory.Agent{}, directory.ErrNotFound
}

// RefreshAgent right after the agent was created finds it, even while a
// lookup begun before the creation is still on its way with NotFound, and
// that late NotFound is not cached.
func TestDirectory_refreshAgentDuringAnOlderLookup(t *testing.T) {
	reg := &gatedRegistry{read: make(chan struct{}), gate: make(chan struct{})}
	d := directory.New(reg, directory.Options{CacheTTL: time.Minute, NegativeTTL: time.Minute, Now: time.Now})
	ctx := t.Context()
	older := make(chan error, 1)
	go func() {
		_, err := d.Agent(ctx, agent) // a step's lookup, before the agent exists
		older <- err
	}()
	<-reg.read
	a, err := d.RefreshAgent(ctx, agent) // installing a routine, after CreateAgent
	close(reg.gate)
	if err != nil || a.Name != agent {
		t.Fatalf("RefreshAgent(%q) while an older lookup runs = %v, %v; want the agent", agent, a, err)
	}
	if err := <-older; !errors.Is(err, directory.ErrNotFound) {
		t.Errorf("the older Agent(%q) = %v, want ErrNotFound (it asked before the creation)", agent, err)
	}
	if a, err := d.Agent(ctx, agent); err != nil || a.Name != agent {
		t.Errorf("Agent(%q) once both lookups ended = %v, %v; want the agent (the late NotFound must not be cached)", agent, a, err)
	}
}
