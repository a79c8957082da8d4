// Package directory is the dispatcher's cached view of the registry: the
// hosted agents as the hot path needs them and the protocol documents they
// speak, resolved and with their schemas compiled. The registry itself sits
// behind the small Registry interface; internal/server adapts the gRPC
// client to it and maps its status codes onto this package's sentinels.
package directory

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/resource"
	"github.com/parleyhq/parley/services/dispatcher/internal/agora"
	"github.com/parleyhq/parley/services/dispatcher/internal/cache"
	"github.com/parleyhq/parley/services/dispatcher/internal/pdschema"
	"github.com/parleyhq/parley/services/dispatcher/internal/protocolcontrol"
)

// Errors a Registry reports, and so the Directory.
var (
	// ErrNotFound: the registry holds no such agent or protocol. The
	// Directory returns it as a *resource.Error naming the kind.
	ErrNotFound = resource.ErrNotFound
	// ErrRefused: the registry refused to resolve a protocol for a reason
	// of the caller's (sources that do not verify, refused, too large).
	ErrRefused = errors.New("refused by the registry")
	// ErrUnavailable: the registry could not be reached or timed out.
	ErrUnavailable = errors.New("the registry is unavailable")
)

// Agent is a hosted agent as the registry describes it.
type Agent struct {
	Name string // clients/{c}/agents/{a}
	// Supported and Unsupported are the agent's lists of protocols
	// (sha1 hex).
	Supported, Unsupported map[string]bool
	// Implemented is SUPPORT_POLICY_IMPLEMENTED: a protocol the agent has
	// a routine or connected handler for is supported too.
	Implemented bool
	Dialect     agora.Dialect
}

// Document is a protocol document as the registry returns it.
type Document struct {
	Hash                          string // sha1 hex
	Content                       []byte
	Title, Description            string
	Tags                          []string
	RequestSchema, ResponseSchema string // JSON Schemas from its metadata; "" when none
	// StateMachine is the PD's stateMachine as the registry parsed and
	// checked it; nil when it declares none.
	StateMachine *registryv1.StateMachine
}

// Protocol is a resolved protocol document with its compiled schemas.
type Protocol struct {
	Document
	Schemas pdschema.Schemas
	// SchemaErr is set when the document declares a schema that does not
	// compile; such a protocol cannot validate anything and is treated as
	// unsupported.
	SchemaErr error
	// Machine is the compiled StateMachine, nil when there is none;
	// MachineErr is set when it does not compile.
	Machine    *protocolcontrol.Machine
	MachineErr error
}

// Check unwraps a reply (agora.Query) and validates it against the
// protocol's response schema, parsing it once.
func (p *Protocol) Check(out json.RawMessage) (json.RawMessage, error) {
	q, _ := agora.Query(out)
	if p.Schemas.Response == nil {
		return q, nil
	}
	return q, pdschema.Validate(p.Schemas.Response, q)
}

// Registry is what the directory needs of the registry service.
type Registry interface {
	// GetAgent returns a hosted agent; ErrNotFound when unknown.
	GetAgent(ctx context.Context, name string) (Agent, error)
	// ResolveProtocol returns a protocol document, which the registry
	// fetches and verifies from sources when it does not hold it.
	ResolveProtocol(ctx context.Context, hash string, sources []string) (Document, error)
	// CreateProtocol stores a document; one already stored is no error.
	CreateProtocol(ctx context.Context, content []byte) error
	// AddSupportedProtocol adds a protocol to an agent's supported list.
	AddSupportedProtocol(ctx context.Context, agent, hash string) error
}

// Options configures a Directory.
type Options struct {
	// CacheTTL is how long agents are cached; protocols, being
	// immutable, for at least a minute.
	CacheTTL time.Duration
	// NegativeTTL is how long an agent the registry reports ErrNotFound
	// stays unknown without asking again; 0 asks every time.
	NegativeTTL time.Duration
	Now         func() time.Time
}

// Directory caches the registry's answers. It is safe for concurrent use.
type Directory struct {
	reg       Registry
	agents    *cache.Cache[*Agent]
	protocols *cache.Cache[*Protocol]
	schemas   *pdschema.Cache
}

// New returns a Directory over reg.
func New(reg Registry, opts Options) *Directory {
	return &Directory{
		reg: reg,
		agents: cache.New[*Agent](opts.CacheTTL, opts.Now).
			WithNegative(opts.NegativeTTL, func(err error) bool { return errors.Is(err, ErrNotFound) }),
		protocols: cache.New[*Protocol](max(opts.CacheTTL, time.Minute), opts.Now),
		schemas:   pdschema.NewCache(10_000),
	}
}

// Agent returns the hosted agent name; errors wrap ErrNotFound or
// ErrUnavailable.
func (d *Directory) Agent(ctx context.Context, name string) (*Agent, error) {
	if a, ok := d.agents.Peek(name); ok {
		return a, nil // the warm path: no loader closure to allocate
	}
	return d.agents.Get(ctx, name, func(ctx context.Context) (*Agent, error) {
		a, err := d.reg.GetAgent(ctx, name)
		if errors.Is(err, ErrNotFound) {
			return nil, resource.NotFound("agent", name)
		}
		if err != nil {
			return nil, fmt.Errorf("agent %s: %w", name, err)
		}
		return &a, nil
	})
}

// RefreshAgent reads agent name from the registry, bypassing and then
// refreshing the cache: for rare calls that must see the agent as it is
// now (installing a routine for it).
func (d *Directory) RefreshAgent(ctx context.Context, name string) (*Agent, error) {
	d.ForgetAgent(name)
	return d.Agent(ctx, name)
}

// ForgetAgent drops a cached agent, after it changed.
func (d *Directory) ForgetAgent(name string) { d.agents.Forget(name) }

// Protocol resolves a protocol document through the registry. Concurrent
// first lookups share a registry call only when they bring the same
// sources: a caller with wrong sources must not fail one with right ones.
func (d *Directory) Protocol(ctx context.Context, hexHash string, sources []string) (*Protocol, error) {
	if p, ok := d.protocols.Peek(hexHash); ok {
		return p, nil // the warm path: no flight key to build
	}
	flight := hexHash + "\x00" + strings.Join(sources, "\x00")
	return d.protocols.GetShared(ctx, hexHash, flight, func(ctx context.Context) (*Protocol, error) {
		doc, err := d.reg.ResolveProtocol(ctx, hexHash, sources)
		if errors.Is(err, ErrNotFound) {
			return nil, resource.NotFound("protocol", hexHash)
		}
		if err != nil {
			return nil, fmt.Errorf("protocol %s: %w", hexHash, err)
		}
		p := &Protocol{Document: doc}
		// The registry parsed and checked the schemas; we only compile them.
		p.Schemas, p.SchemaErr = d.schemas.Compile(doc.Hash, doc.RequestSchema, doc.ResponseSchema)
		if doc.StateMachine != nil {
			p.Machine, p.MachineErr = protocolcontrol.Compile(doc.StateMachine)
		}
		return p, nil
	})
}

// PeekProtocol returns a protocol already in the cache; it never calls
// the registry.
func (d *Directory) PeekProtocol(hexHash string) (*Protocol, bool) {
	return d.protocols.Peek(hexHash)
}

// Register stores a protocol document in the registry.
func (d *Directory) Register(ctx context.Context, content []byte) error {
	if err := d.reg.CreateProtocol(ctx, content); err != nil {
		return fmt.Errorf("register the protocol: %w", err)
	}
	return nil
}

// AddSupported adds a protocol to an agent's supported list.
func (d *Directory) AddSupported(ctx context.Context, agent, hexHash string) error {
	if err := d.reg.AddSupportedProtocol(ctx, agent, hexHash); err != nil {
		return fmt.Errorf("add the supported protocol: %w", err)
	}
	d.ForgetAgent(agent)
	return nil
}

// ValidAgentName reports whether name is clients/{client}/agents/{agent}:
// the one rule, resource.ValidAgentName.
func ValidAgentName(name string) bool { return resource.ValidAgentName(name) }
