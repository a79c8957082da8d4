package app

import (
	"context"
	"time"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/auth"
)

// keyCacheTTL bounds how long a revoked key keeps working here when the
// registry runs in another process (docs/adr/0004).
const keyCacheTTL = 2 * time.Second

// introspector checks keys with the registry's IntrospectKey, answers
// cached for keyCacheTTL. In `parley serve` the registry's own verifier
// takes precedence (serve.FallbackKeyVerifier).
func introspector(reg registryv1.RegistryServiceClient) auth.Verifier {
	return auth.Cached(auth.VerifierFunc(func(ctx context.Context, secret string) (auth.Principal, error) {
		resp, err := reg.IntrospectKey(ctx, &registryv1.IntrospectKeyRequest{Secret: secret})
		if err != nil {
			return auth.Principal{}, err
		}
		if !resp.GetActive() {
			return auth.Principal{}, auth.ErrInvalidCredential
		}
		p := auth.Principal{Kind: auth.Client, Client: resp.GetClient(), Key: resp.GetKey()}
		if resp.GetKind() == registryv1.PrincipalKind_PRINCIPAL_KIND_AGENT {
			p.Kind, p.Agent = auth.Agent, resp.GetAgent()
		}
		return p, nil
	}), keyCacheTTL, nil)
}
