package app_test

import (
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
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
