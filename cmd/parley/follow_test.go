package main

import (
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/grpcclient"
)

// TestFollowAndUnfollow runs `parley follow` and `parley unfollow` with an
// agent key against a running suite, and checks the follow through the
// registry; following as another agent is refused.
func TestFollowAndUnfollow(t *testing.T) {
	s := startCLISuite(t)
	addr, call, must, operator := s.addr, s.call, s.must(t), s.operator
	acmeKey := must(operator, "client", "create", "acme")
	betaKey := must(operator, "client", "create", "beta")
	aliceKey := must(acmeKey, "agent", "create", "acme:alice")
	bobKey := must(betaKey, "agent", "create", "beta:bob")

	conn, err := grpcclient.Dial(addr, grpcclient.Options{Token: operator})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	reg := registryv1.NewRegistryServiceClient(conn)
	followers := func() []string {
		t.Helper()
		resp, err := reg.ListFollowers(t.Context(), &registryv1.ListFollowersRequest{Parent: "clients/acme/agents/alice"})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetAgents()
	}

	if got := must(bobKey, "whoami"); got != "agent beta:bob" {
		t.Errorf("parley whoami with bob's key = %q, want %q", got, "agent beta:bob")
	}
	if got := must(betaKey, "whoami"); got != "client beta" {
		t.Errorf("parley whoami with beta's client key = %q, want %q", got, "client beta")
	}
	if got := must(operator, "whoami"); got != "operator" {
		t.Errorf("parley whoami with the operator token = %q, want %q", got, "operator")
	}
	if _, err := call("", "whoami"); err == nil || !strings.Contains(err.Error(), "refused the credential") {
		t.Errorf("parley whoami without a token: error = %v, want the server's refusal (UNAUTHENTICATED)", err)
	}

	// The acting agent is the key's: no --as needed.
	must(bobKey, "follow", "acme:alice")
	if got := followers(); len(got) != 1 || got[0] != "clients/beta/agents/bob" {
		t.Errorf("followers of alice after 'parley follow' = %v, want [clients/beta/agents/bob]", got)
	}
	if _, err := call(aliceKey, "follow", "acme:alice", "--as", "beta:bob"); status.Code(err) != codes.PermissionDenied {
		t.Errorf("parley follow --as bob with alice's key: error = %v, want PERMISSION_DENIED", err)
	}
	if _, err := call(betaKey, "follow", "acme:alice"); exitCode(err) != 2 || !strings.Contains(fmt.Sprint(err), "--as") {
		t.Errorf("parley follow with a client key and no --as: error = %v, want a usage error naming --as", err)
	}
	must(bobKey, "unfollow", "acme:alice")
	if got := followers(); len(got) != 0 {
		t.Errorf("followers of alice after 'parley unfollow' = %v, want none", got)
	}
	// --as still names the agent for the operator.
	must(operator, "follow", "acme:alice", "--as", "beta:bob")
	if got := followers(); len(got) != 1 || got[0] != "clients/beta/agents/bob" {
		t.Errorf("followers of alice after 'parley follow --as beta:bob' (operator) = %v, want [clients/beta/agents/bob]", got)
	}
}
