package auth

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// IntrospectionTTL is how long a service in another process than the
// registry trusts the registry's answer about a key: a revoked key is
// refused there at most this long after revocation (docs/adr/0004).
const IntrospectionTTL = 2 * time.Second

// IntrospectFunc asks the registry about a key: it calls
// RegistryService.IntrospectKey and returns its response.
type IntrospectFunc func(ctx context.Context, secret string) (proto.Message, error)

// Introspector returns the Verifier a service in another process than
// the registry uses: it asks introspect, and caches each answer, a
// principal or ErrInvalidCredential, for ttl (see Cached; docs/adr/0004).
// The response is read by field name (active, kind, client, agent, key,
// as in parley.registry.v1.IntrospectKeyResponse), so that this package
// imports no generated code.
func Introspector(introspect IntrospectFunc, ttl time.Duration, now func() time.Time) Verifier {
	return Cached(VerifierFunc(func(ctx context.Context, secret string) (Principal, error) {
		resp, err := introspect(ctx, secret)
		if err != nil {
			return Principal{}, err
		}
		return principalOf(resp)
	}), ttl, now)
}

// The PrincipalKind numbers of parley.registry.v1.
const (
	introspectedAgent  = 1
	introspectedClient = 2
)

// principalOf reads an IntrospectKeyResponse.
func principalOf(resp proto.Message) (Principal, error) {
	r := resp.ProtoReflect()
	field := func(name string) protoreflect.Value {
		fd := r.Descriptor().Fields().ByName(protoreflect.Name(name))
		if fd == nil {
			return protoreflect.Value{}
		}
		return r.Get(fd)
	}
	str := func(name string) string {
		if v := field(name); v.IsValid() {
			if s, ok := v.Interface().(string); ok {
				return s
			}
		}
		return ""
	}
	active, _ := field("active").Interface().(bool)
	if !active {
		return Principal{}, ErrInvalidCredential
	}
	p := Principal{Client: str("client"), Key: str("key")}
	kind, _ := field("kind").Interface().(protoreflect.EnumNumber)
	switch kind {
	case introspectedAgent:
		p.Kind, p.Agent = Agent, str("agent")
	case introspectedClient:
		p.Kind = Client
	default:
		return Principal{}, fmt.Errorf("the registry introspected a key of kind %d, which is neither an agent's nor a client's", kind)
	}
	return p, nil
}
