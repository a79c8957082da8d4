package app

import (
	"context"

	"google.golang.org/protobuf/proto"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/auth"
)

// introspector checks keys with the registry's IntrospectKey, answers
// cached for auth.IntrospectionTTL. In `parley serve` the registry's own verifier
// takes precedence (serve.FallbackKeyVerifier).
func introspector(reg registryv1.RegistryServiceClient) auth.Verifier {
	return auth.Introspector(func(ctx context.Context, secret string) (proto.Message, error) {
		return reg.IntrospectKey(ctx, &registryv1.IntrospectKeyRequest{Secret: secret})
	}, auth.IntrospectionTTL, nil)
}
