// Package auth authenticates every call to a Parley service, on gRPC and on
// HTTP, and checks it against one policy table.
//
// A caller presents `authorization: Bearer <token>`. The token is the
// operator token (compared in constant time with the one the server was
// given) or a key issued by the registry (parley_ck_ for a client,
// parley_ak_ for an agent), which a Verifier turns into a Principal.
// Handlers never parse credentials: they call FromContext.
package auth

import (
	"context"
	"strings"
)

// Kind is the kind of caller.
type Kind uint8

// The kinds of caller, as bits so that a policy rule can allow several.
const (
	Anonymous Kind = 1 << iota
	Agent
	Client
	Operator
)

// Anyone allows every kind of caller, with or without a credential.
const Anyone = Anonymous | Agent | Client | Operator

// AnyKey allows every authenticated caller.
const AnyKey = Agent | Client | Operator

// String names the kind for logs.
func (k Kind) String() string {
	switch k {
	case Anonymous:
		return "anonymous"
	case Agent:
		return "agent"
	case Client:
		return "client"
	case Operator:
		return "operator"
	}
	return "unknown"
}

// Principal is who is calling.
type Principal struct {
	Kind Kind
	// Client is the caller's client, clients/{client}, for agent and
	// client keys.
	Client string
	// Agent is the caller's agent, clients/{client}/agents/{agent}, for
	// agent keys.
	Agent string
	// Key is the key's resource name, never its secret; empty for the
	// operator and anonymous callers.
	Key string
}

// String identifies the principal in logs, without any secret.
func (p Principal) String() string {
	switch p.Kind {
	case Agent:
		return p.Agent
	case Client:
		return p.Client
	case Operator:
		return "operator"
	}
	return "anonymous"
}

// Owns reports whether p may act on the resource named name: the operator
// on anything, a client on itself and everything under it, an agent on
// itself and everything under it.
func (p Principal) Owns(name string) bool {
	var root string
	switch p.Kind {
	case Operator:
		return true
	case Client:
		root = p.Client
	case Agent:
		root = p.Agent
	default:
		return false
	}
	if root == "" {
		return false
	}
	return name == root || strings.HasPrefix(name, root+"/")
}

type principalKey struct{}

// WithPrincipal returns ctx carrying p. Only this package's interceptors
// and middleware call it in production; tests use it to call handlers
// directly.
func WithPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// FromContext returns the caller, and false when no authentication ran
// (auth is off, or the call did not pass through this package).
func FromContext(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(Principal)
	return p, ok
}
