package app_test

import (
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/auth"
	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/platform/pgdb/pgdbtest"
)

// TestPostgreSQL_replicasShareOneRegistry runs two registries on one
// PostgreSQL database (--database-url): a protocol and an agent created
// through A are served by B, and an update through B with the etag A's
// writer already used loses (no lost update across replicas).
func TestPostgreSQL_replicasShareOneRegistry(t *testing.T) {
	url := pgdbtest.Database(t)
	a := startRegistry(t, "--database-url", url)
	b := startRegistry(t, "--database-url", url)
	ctx := t.Context()
	if _, err := a.client.CreateProtocol(ctx, &registryv1.CreateProtocolRequest{Protocol: &registryv1.Protocol{Content: []byte(weatherPD)}}); err != nil {
		t.Fatal(err)
	}
	p, err := b.client.GetProtocol(ctx, &registryv1.GetProtocolRequest{Name: "protocols/" + weatherHex})
	if err != nil || string(p.GetContent()) != weatherPD {
		t.Fatalf("GetProtocol on B = %v, %v; want the document created on A", p, err)
	}
	const name = "clients/acme/agents/w"
	created, err := a.client.CreateAgent(ctx, &registryv1.CreateAgentRequest{Parent: "clients/acme", AgentId: "w", Agent: &registryv1.Agent{DisplayName: "W"}})
	if err != nil {
		t.Fatal(err)
	}
	mask := &fieldmaskpb.FieldMask{Paths: []string{"display_name"}}
	if _, err := a.client.UpdateAgent(ctx, &registryv1.UpdateAgentRequest{Agent: &registryv1.Agent{Name: name, DisplayName: "first", Etag: created.GetEtag()}, UpdateMask: mask}); err != nil {
		t.Fatalf("UpdateAgent on A: %v", err)
	}
	_, err = b.client.UpdateAgent(ctx, &registryv1.UpdateAgentRequest{Agent: &registryv1.Agent{Name: name, DisplayName: "second", Etag: created.GetEtag()}, UpdateMask: mask})
	if status.Code(err) != codes.Aborted {
		t.Errorf("UpdateAgent on B with the stale etag = %v, want ABORTED", err)
	}
	if got, err := b.client.GetAgent(ctx, &registryv1.GetAgentRequest{Name: name}); err != nil || got.GetDisplayName() != "first" {
		t.Errorf("GetAgent on B = %q, %v; want A's update", got.GetDisplayName(), err)
	}
}

// TestPostgreSQL_rateLimitsHoldAcrossReplicas runs two registries with
// access control on one database: the open-registration limit and the
// failed-authentication limit of an address hold for both together, not
// once per replica.
func TestPostgreSQL_rateLimitsHoldAcrossReplicas(t *testing.T) {
	url := pgdbtest.Database(t)
	args := []string{"--database-url", url, "--open-registration", "--open-registration-burst", "3", "--open-registration-interval", "1h"}
	replicas := []*authRegistry{startAuthRegistry(t, args...), startAuthRegistry(t, args...)}
	ctx := t.Context()

	created := 0
	for i := range 6 {
		_, err := replicas[i%2].client.CreateClient(ctx, &registryv1.CreateClientRequest{ClientId: fmt.Sprintf("c%d", i)})
		switch {
		case err == nil:
			created++
		case status.Code(err) != codes.ResourceExhausted || grpcerr.Reason(err) != "REGISTRATION_RATE_LIMITED":
			t.Fatalf("CreateClient #%d (open registration) error = %v, want none or RESOURCE_EXHAUSTED REGISTRATION_RATE_LIMITED", i+1, err)
		}
	}
	if created != 3 {
		t.Errorf("CreateClient from one address, alternating replicas: %d of 6 created, want the burst, 3, between both", created)
	}

	// auth.Options.FailBurst is 20 failed authentications per address.
	bad := as(ctx, "parley_ck_not_a_key")
	get := func(r *authRegistry) error {
		_, err := r.client.GetClient(bad, &registryv1.GetClientRequest{Name: "clients/c0"})
		return err
	}
	for i := range 20 {
		if err := get(replicas[i%2]); status.Code(err) != codes.Unauthenticated {
			t.Fatalf("GetClient #%d with a bad key = %v, want UNAUTHENTICATED", i+1, err)
		}
	}
	for i, r := range replicas {
		if err := get(r); status.Code(err) != codes.ResourceExhausted || grpcerr.Reason(err) != auth.ReasonRateLimited {
			t.Errorf("replica %d: GetClient after 20 failures on both = %v, want RESOURCE_EXHAUSTED %s", i, err, auth.ReasonRateLimited)
		}
	}
}
