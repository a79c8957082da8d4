package server

import (
	"context"
	"strings"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/services/dispatcher/internal/agora"
	"github.com/parleyhq/parley/services/dispatcher/internal/pdschema"
)

// agentEntry is a hosted agent as the hot path needs it.
type agentEntry struct {
	agent       *registryv1.Agent
	supported   map[string]bool // sha1 hex
	unsupported map[string]bool
	implemented bool // SUPPORT_POLICY_IMPLEMENTED
	dialect     agora.Dialect
}

func (s *Server) agent(ctx context.Context, name string) (*agentEntry, error) {
	return s.agents.get(ctx, name, func(ctx context.Context) (*agentEntry, error) {
		a, err := s.registry.GetAgent(ctx, &registryv1.GetAgentRequest{Name: name})
		if err != nil {
			return nil, err
		}
		e := &agentEntry{agent: a, supported: map[string]bool{}, unsupported: map[string]bool{}}
		for _, p := range a.GetSupportedProtocols() {
			e.supported[strings.ToLower(strings.TrimPrefix(p.GetProtocol(), "protocols/"))] = true
		}
		for _, p := range a.GetUnsupportedProtocols() {
			e.unsupported[strings.ToLower(strings.TrimPrefix(p.GetProtocol(), "protocols/"))] = true
		}
		e.implemented = a.GetSupportPolicy() == registryv1.SupportPolicy_SUPPORT_POLICY_IMPLEMENTED
		switch a.GetDialect() {
		case registryv1.Dialect_DIALECT_STD:
			e.dialect = agora.Std
		case registryv1.Dialect_DIALECT_PYLIB:
			e.dialect = agora.Pylib
		default:
			e.dialect = agora.Spec2024
		}
		return e, nil
	})
}

// protocolEntry is a resolved PD with its compiled schemas.
type protocolEntry struct {
	pd      *registryv1.Protocol
	schemas pdschema.Schemas
	// schemaErr is set when the PD declares a schema that does not compile;
	// such a PD cannot validate anything and is treated as unsupported.
	schemaErr error
}

// protocol resolves a PD through the registry, which fetches and verifies
// it from sources when it does not hold it. Concurrent first lookups share a
// registry call only when they bring the same sources: a caller with wrong
// sources must not fail one with right ones.
func (s *Server) protocol(ctx context.Context, hexHash string, sources []string) (*protocolEntry, error) {
	flight := hexHash + "\x00" + strings.Join(sources, "\x00")
	return s.protocols.getShared(ctx, hexHash, flight, func(ctx context.Context) (*protocolEntry, error) {
		pd, err := s.registry.ResolveProtocol(ctx, &registryv1.ResolveProtocolRequest{Hash: hexHash, Sources: sources})
		if err != nil {
			return nil, err
		}
		e := &protocolEntry{pd: pd}
		// The registry parsed and checked the schemas; we only compile them.
		e.schemas, e.schemaErr = s.schemas.Compile(pd.GetSha1Hex(), pd.GetRequestSchemaJson(), pd.GetResponseSchemaJson())
		return e, nil
	})
}

// supports applies the agent's support policy to a protocol.
func (s *Server) supports(ctx context.Context, a *agentEntry, hexHash string) bool {
	if a.unsupported[hexHash] {
		return false
	}
	if a.supported[hexHash] {
		return true
	}
	if !a.implemented {
		return false
	}
	name := a.agent.GetName()
	return s.hub.handlerFor(name, hexHash) != nil || s.routines.exists(ctx, name, hexHash)
}
