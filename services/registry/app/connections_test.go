package app_test

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/auth"
	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/platform/serve"
	"github.com/parleyhq/parley/services/registry/app"
	"github.com/parleyhq/parley/services/registry/config"
)

// authRegistry is a registry with access control on (auth.ParleyPolicy).
type authRegistry struct {
	*registry
	operator string // the operator token
}

// startAuthRegistry runs a registry with the Parley policy on loopback
// listeners and returns it with its operator token; args are extra flags.
func startAuthRegistry(t *testing.T, args ...string) *authRegistry {
	t.Helper()
	dir := t.TempDir()
	cfg, err := config.Load(append([]string{"--data", dir}, args...), func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	token, _, _, err := auth.LoadOperatorToken("", dir)
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.DiscardHandler)
	a, err := app.New(cfg, logger, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := serve.New(serve.Options{Logger: logger, Policy: auth.ParleyPolicy(), DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := a.Register(ctx, srv); err != nil {
		t.Fatal(err)
	}
	grpcLis, httpLis := listen(t), listen(t)
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, grpcLis, httpLis) }()
	conn, err := grpc.NewClient(grpcLis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	r := &registry{client: registryv1.NewRegistryServiceClient(conn), grpc: grpcLis.Addr().String(), url: "http://" + httpLis.Addr().String()}
	r.cleanup = func() {
		once.Do(func() {
			conn.Close()
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run() error = %v", err)
			}
			a.Close()
		})
	}
	t.Cleanup(r.cleanup)
	return &authRegistry{registry: r, operator: token}
}

// as returns ctx calling with the bearer token; "" calls anonymously.
func as(ctx context.Context, token string) context.Context {
	if token == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}

// newAgent creates clients/{client}/agents/{id} as the operator and
// returns its name and initial agent key.
func (r *authRegistry) newAgent(t *testing.T, client, id string) (name, key string) {
	t.Helper()
	a, err := r.client.CreateAgent(as(t.Context(), r.operator), &registryv1.CreateAgentRequest{Parent: "clients/" + client, AgentId: id, Agent: &registryv1.Agent{Owner: &registryv1.Owner{Country: "FR"}}})
	if err != nil {
		t.Fatalf("CreateAgent(%s/%s): %v", client, id, err)
	}
	return a.GetName(), a.GetInitialKey().GetSecret()
}

func (r *authRegistry) followers(t *testing.T, agent string) []string {
	t.Helper()
	resp, err := r.client.ListFollowers(as(t.Context(), r.operator), &registryv1.ListFollowersRequest{Parent: agent})
	if err != nil {
		t.Fatalf("ListFollowers(%s): %v", agent, err)
	}
	return resp.GetAgents()
}

func (r *authRegistry) permission(t *testing.T, sender, recipient string) *registryv1.CheckDialoguePermissionResponse {
	t.Helper()
	resp, err := r.client.CheckDialoguePermission(as(t.Context(), r.operator), &registryv1.CheckDialoguePermissionRequest{Sender: sender, Recipient: recipient})
	if err != nil {
		t.Fatalf("CheckDialoguePermission(%s, %s): %v", sender, recipient, err)
	}
	return resp
}

func TestFollow_grpcThenREST(t *testing.T) {
	r := startAuthRegistry(t)
	alice, _ := r.newAgent(t, "acme", "alice")
	bob, bobKey := r.newAgent(t, "beta", "bob")

	if got := r.permission(t, alice, bob); got.GetAllowed() {
		t.Fatalf("CheckDialoguePermission(alice, bob) before any follow = %v, want refused", got)
	}
	f, err := r.client.FollowAgent(as(t.Context(), bobKey), &registryv1.FollowAgentRequest{Name: bob, Agent: alice})
	if err != nil || f.GetFollower() != bob || f.GetAgent() != alice {
		t.Fatalf("FollowAgent(bob → alice, bob's key) = %v, %v", f, err)
	}
	if _, err := r.client.FollowAgent(as(t.Context(), bobKey), &registryv1.FollowAgentRequest{Name: bob, Agent: alice}); err != nil {
		t.Errorf("FollowAgent(repeat) error = %v, want none", err)
	}
	if got := r.permission(t, alice, bob); !got.GetAllowed() || got.GetBasis() != registryv1.DialogueBasis_DIALOGUE_BASIS_FOLLOW {
		t.Errorf("CheckDialoguePermission(alice, bob) = %v, want allowed by follow", got)
	}
	if got := r.permission(t, bob, alice); got.GetAllowed() {
		t.Errorf("CheckDialoguePermission(bob, alice) = %v, want refused: a follow is one way", got)
	}

	// Over REST, bob's key reads whom bob follows, then unfollows.
	res := do(t, http.MethodGet, r.url+"/v1/"+bob+"/following", "", "Authorization", "Bearer "+bobKey)
	if res.code != http.StatusOK || !strings.Contains(string(res.body), alice) {
		t.Errorf("GET /v1/%s/following = %d %s; want 200 listing %s", bob, res.code, res.body, alice)
	}
	res = do(t, http.MethodPost, r.url+"/v1/"+bob+":unfollow", `{"agent":"`+alice+`"}`, "Authorization", "Bearer "+bobKey)
	if res.code != http.StatusOK {
		t.Errorf("POST /v1/%s:unfollow = %d %s; want 200", bob, res.code, res.body)
	}
	if got := r.followers(t, alice); len(got) != 0 {
		t.Errorf("ListFollowers(alice) after unfollow = %v, want none", got)
	}
	if got := r.permission(t, alice, bob); got.GetAllowed() {
		t.Errorf("CheckDialoguePermission(alice, bob) after unfollow = %v, want refused", got)
	}
}

func TestClientGroup_membersMayTalk(t *testing.T) {
	r := startAuthRegistry(t)
	a, aKey := r.newAgent(t, "acme", "a")
	b, bKey := r.newAgent(t, "acme", "b")
	other, otherKey := r.newAgent(t, "beta", "c")
	for _, k := range []string{aKey, bKey} {
		res := do(t, http.MethodPost, r.url+"/v1/"+map[string]string{aKey: a, bKey: b}[k]+":joinClientGroup", `{}`, "Authorization", "Bearer "+k)
		if res.code != http.StatusOK {
			t.Fatalf("POST :joinClientGroup with %.14s = %d %s", k, res.code, res.body)
		}
	}
	if _, err := r.client.JoinClientGroup(as(t.Context(), otherKey), &registryv1.JoinClientGroupRequest{Name: other}); err != nil {
		t.Fatal(err)
	}
	if got := r.permission(t, a, b); !got.GetAllowed() || got.GetBasis() != registryv1.DialogueBasis_DIALOGUE_BASIS_CLIENT_GROUP {
		t.Errorf("CheckDialoguePermission(a, b) = %v, want allowed by client group", got)
	}
	if got := r.permission(t, a, other); got.GetAllowed() {
		t.Errorf("CheckDialoguePermission(a, other client's member) = %v, want refused", got)
	}
	resp, err := r.client.ListClientGroupMembers(as(t.Context(), aKey), &registryv1.ListClientGroupMembersRequest{Parent: "clients/acme", PageSize: 1})
	if err != nil || len(resp.GetAgents()) != 1 || resp.GetAgents()[0] != a || resp.GetNextPageToken() == "" {
		t.Fatalf("ListClientGroupMembers(acme, page 1) = %v, %v; want [%s] and a token", resp, err, a)
	}
	resp, err = r.client.ListClientGroupMembers(as(t.Context(), aKey), &registryv1.ListClientGroupMembersRequest{Parent: "clients/acme", PageSize: 1, PageToken: resp.GetNextPageToken()})
	if err != nil || len(resp.GetAgents()) != 1 || resp.GetAgents()[0] != b || resp.GetNextPageToken() != "" {
		t.Errorf("ListClientGroupMembers(acme, page 2) = %v, %v; want [%s] and no token", resp, err, b)
	}
	if _, err := r.client.LeaveClientGroup(as(t.Context(), bKey), &registryv1.LeaveClientGroupRequest{Name: b}); err != nil {
		t.Fatal(err)
	}
	if got := r.permission(t, a, b); got.GetAllowed() {
		t.Errorf("CheckDialoguePermission(a, b) after b left = %v, want refused", got)
	}
}

// TestConnections_refusalsChangeNothing checks each refused connection
// call's exact code, then that no follow or membership was written.
func TestConnections_refusalsChangeNothing(t *testing.T) {
	r := startAuthRegistry(t)
	alice, aliceKey := r.newAgent(t, "acme", "alice")
	bob, bobKey := r.newAgent(t, "beta", "bob")
	ctx := t.Context()
	missing := "clients/beta/agents/ghost"
	cases := []struct {
		name   string
		call   func() error
		code   codes.Code
		reason string
	}{
		{"follow, unauthenticated", func() error {
			_, err := r.client.FollowAgent(ctx, &registryv1.FollowAgentRequest{Name: bob, Agent: alice})
			return err
		}, codes.Unauthenticated, ""},
		{"follow as another agent", func() error {
			_, err := r.client.FollowAgent(as(ctx, aliceKey), &registryv1.FollowAgentRequest{Name: bob, Agent: alice})
			return err
		}, codes.PermissionDenied, ""},
		{"follow yourself", func() error {
			_, err := r.client.FollowAgent(as(ctx, bobKey), &registryv1.FollowAgentRequest{Name: bob, Agent: bob})
			return err
		}, codes.InvalidArgument, "FOLLOW_SELF"},
		{"follow a missing agent", func() error {
			_, err := r.client.FollowAgent(as(ctx, bobKey), &registryv1.FollowAgentRequest{Name: bob, Agent: missing})
			return err
		}, codes.NotFound, "AGENT_NOT_FOUND"},
		{"follow a malformed name", func() error {
			_, err := r.client.FollowAgent(as(ctx, bobKey), &registryv1.FollowAgentRequest{Name: bob, Agent: "clients/acme/agents/" + strings.Repeat("x", 64)})
			return err
		}, codes.InvalidArgument, "INVALID_ARGUMENT"},
		{"join another agent into its group", func() error {
			_, err := r.client.JoinClientGroup(as(ctx, bobKey), &registryv1.JoinClientGroupRequest{Name: alice})
			return err
		}, codes.PermissionDenied, ""},
		{"join, unauthenticated", func() error {
			_, err := r.client.JoinClientGroup(ctx, &registryv1.JoinClientGroupRequest{Name: alice})
			return err
		}, codes.Unauthenticated, ""},
		{"list a foreign client's group", func() error {
			_, err := r.client.ListClientGroupMembers(as(ctx, bobKey), &registryv1.ListClientGroupMembersRequest{Parent: "clients/acme"})
			return err
		}, codes.PermissionDenied, "CLIENT_GROUP_FOREIGN"},
		{"list another agent's followers", func() error {
			_, err := r.client.ListFollowers(as(ctx, bobKey), &registryv1.ListFollowersRequest{Parent: alice})
			return err
		}, codes.PermissionDenied, ""},
		{"check a permission with an agent key", func() error {
			_, err := r.client.CheckDialoguePermission(as(ctx, bobKey), &registryv1.CheckDialoguePermissionRequest{Sender: bob, Recipient: alice})
			return err
		}, codes.PermissionDenied, ""},
		{"a negative page size", func() error {
			_, err := r.client.ListFollowing(as(ctx, bobKey), &registryv1.ListFollowingRequest{Parent: bob, PageSize: -1})
			return err
		}, codes.InvalidArgument, "INVALID_ARGUMENT"},
	}
	for _, tc := range cases {
		err := tc.call()
		if status.Code(err) != tc.code || (tc.reason != "" && grpcerr.Reason(err) != tc.reason) {
			t.Errorf("%s: error = %v (reason %q), want %v %s", tc.name, err, grpcerr.Reason(err), tc.code, tc.reason)
		}
	}
	for _, agent := range []string{alice, bob} {
		if got := r.followers(t, agent); len(got) != 0 {
			t.Errorf("ListFollowers(%s) after refusals = %v, want none", agent, got)
		}
		following, err := r.client.ListFollowing(as(ctx, r.operator), &registryv1.ListFollowingRequest{Parent: agent})
		if err != nil || len(following.GetAgents()) != 0 {
			t.Errorf("ListFollowing(%s) after refusals = %v, %v; want none", agent, following, err)
		}
	}
	for _, client := range []string{"clients/acme", "clients/beta"} {
		members, err := r.client.ListClientGroupMembers(as(ctx, r.operator), &registryv1.ListClientGroupMembersRequest{Parent: client})
		if err != nil || len(members.GetAgents()) != 0 {
			t.Errorf("ListClientGroupMembers(%s) after refusals = %v, %v; want none", client, members, err)
		}
	}
	if notes, _ := r.notesAfter(t, 0); len(notes) != 0 {
		t.Errorf("notification outbox after refusals = %v, want empty", notes)
	}
}
