package app_test

import (
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/grpcerr"
)

const (
	openPublic        = registryv1.GroupAccess_GROUP_ACCESS_OPEN_PUBLIC
	restrictedPublic  = registryv1.GroupAccess_GROUP_ACCESS_RESTRICTED_PUBLIC
	restrictedPrivate = registryv1.GroupAccess_GROUP_ACCESS_RESTRICTED_PRIVATE
	categoryMessage   = registryv1.GroupCategory_GROUP_CATEGORY_MESSAGE
)

// createGroup creates path as the agent with key.
func (r *authRegistry) createGroup(t *testing.T, key, agent, path string, access registryv1.GroupAccess) *registryv1.Group {
	t.Helper()
	g, err := r.client.CreateGroup(as(t.Context(), key), &registryv1.CreateGroupRequest{Name: agent, Group: &registryv1.Group{Path: path, Access: access, Category: categoryMessage, Description: "about " + path}})
	if err != nil {
		t.Fatalf("CreateGroup(%s by %s): %v", path, agent, err)
	}
	return g
}

func (r *authRegistry) join(t *testing.T, key, agent, path string, regions ...*registryv1.Region) *registryv1.JoinGroupResponse {
	t.Helper()
	resp, err := r.client.JoinGroup(as(t.Context(), key), &registryv1.JoinGroupRequest{Name: agent, Group: path, Regions: regions})
	if err != nil {
		t.Fatalf("JoinGroup(%s joins %s): %v", agent, path, err)
	}
	return resp
}

func (r *authRegistry) resolve(t *testing.T, req *registryv1.ResolveRecipientsRequest) *registryv1.ResolveRecipientsResponse {
	t.Helper()
	resp, err := r.client.ResolveRecipients(as(t.Context(), r.operator), req)
	if err != nil {
		t.Fatalf("ResolveRecipients(%v): %v", req, err)
	}
	return resp
}

func recipientNames(resp *registryv1.ResolveRecipientsResponse) []string {
	var out []string
	for _, r := range resp.GetRecipients() {
		out = append(out, r.GetAgent())
	}
	return out
}

func region(country, state, city string) *registryv1.Region {
	return &registryv1.Region{Country: country, State: state, City: city}
}

// TestResolveRecipients_scopesRegionsAndRefusals is the scenario of issue
// 13: three clients, the tree acme/travel → {flights → domestic, hotels →
// resort}, members with and without regions; each scope from flights
// reaches exactly its groups' members, the region filter narrows them, and
// every refused agent or group is reported.
func TestResolveRecipients_scopesRegionsAndRefusals(t *testing.T) {
	r := startAuthRegistry(t)
	admin, adminKey := r.newAgent(t, "acme", "admin")
	for _, p := range []string{"acme/travel", "acme/travel/flights", "acme/travel/flights/domestic", "acme/travel/hotels", "acme/travel/hotels/resort"} {
		r.createGroup(t, adminKey, admin, p, openPublic)
	}
	members := map[string]string{} // id → name
	joinAs := func(client, id, path string, regions ...*registryv1.Region) {
		name, key := r.newAgent(t, client, id)
		members[id] = name
		r.join(t, key, name, path, regions...)
	}
	joinAs("beta", "t1", "acme/travel")
	joinAs("beta", "f1", "acme/travel/flights", region("FR", "", ""))
	joinAs("gamma", "d1", "acme/travel/flights/domestic", region("FR", "IDF", "Paris"))
	joinAs("gamma", "d2", "acme/travel/flights/domestic", region("US", "", ""))
	joinAs("gamma", "h1", "acme/travel/hotels")
	joinAs("beta", "r1", "acme/travel/hotels/resort")
	sender, senderKey := r.newAgent(t, "gamma", "sender")
	names := func(ids ...string) []string {
		var out []string
		for _, id := range ids {
			if id == "admin" {
				out = append(out, admin)
			} else {
				out = append(out, members[id])
			}
		}
		slices.Sort(out)
		return out
	}

	scopes := []struct {
		scope   registryv1.GroupScope
		regions []*registryv1.Region
		want    []string
	}{
		{registryv1.GroupScope_GROUP_SCOPE_DIRECT, nil, names("admin", "f1")},
		{registryv1.GroupScope_GROUP_SCOPE_LOCAL, nil, names("admin", "f1", "d1", "d2")},
		{registryv1.GroupScope_GROUP_SCOPE_GLOBAL, nil, names("admin", "t1", "f1", "d1", "d2")},
		{registryv1.GroupScope_GROUP_SCOPE_EXCLUSIVE, nil, names("admin", "t1", "f1")},
		// Members without regions always pass; d2 (US) does not.
		{registryv1.GroupScope_GROUP_SCOPE_LOCAL, []*registryv1.Region{region("fr", "", "")}, names("admin", "f1", "d1")},
		// f1 names no state: a wildcard; d1's city differs.
		{registryv1.GroupScope_GROUP_SCOPE_LOCAL, []*registryv1.Region{region("FR", "IDF", "Lyon")}, names("admin", "f1")},
		// Regions are ORed.
		{registryv1.GroupScope_GROUP_SCOPE_LOCAL, []*registryv1.Region{region("FR", "IDF", "Lyon"), region("US", "CA", "")}, names("admin", "f1", "d2")},
	}
	for _, tc := range scopes {
		resp := r.resolve(t, &registryv1.ResolveRecipientsRequest{Sender: sender, Groups: []*registryv1.GroupTarget{{Group: "acme/travel/flights", Scope: tc.scope}}, Regions: tc.regions})
		if got := recipientNames(resp); !slices.Equal(got, tc.want) || len(resp.GetRefusals()) != 0 {
			t.Errorf("ResolveRecipients(flights, %v, regions %v) = %v, refusals %v; want %v and none", tc.scope, tc.regions, got, resp.GetRefusals(), tc.want)
		}
		for _, rc := range resp.GetRecipients() {
			if rc.GetBasis() != registryv1.DialogueBasis_DIALOGUE_BASIS_GROUP {
				t.Errorf("recipient %s basis = %v, want GROUP", rc.GetAgent(), rc.GetBasis())
			}
		}
	}

	// Restricted groups: a members-only one and a private one the sender
	// is not in; direct agents: a follower, a stranger, a missing agent,
	// the sender itself, and a group member repeated directly.
	r.createGroup(t, adminKey, admin, "acme/vip", restrictedPublic)
	r.createGroup(t, adminKey, admin, "acme/secret", restrictedPrivate)
	follower, followerKey := r.newAgent(t, "beta", "fan")
	if _, err := r.client.FollowAgent(as(t.Context(), followerKey), &registryv1.FollowAgentRequest{Name: follower, Agent: sender}); err != nil {
		t.Fatal(err)
	}
	stranger, _ := r.newAgent(t, "beta", "stranger")
	ghost := "clients/beta/agents/ghost"
	resp := r.resolve(t, &registryv1.ResolveRecipientsRequest{
		Sender: sender,
		Direct: []string{follower, stranger, ghost, sender, members["h1"]},
		Groups: []*registryv1.GroupTarget{
			{Group: "acme/travel/hotels", Scope: registryv1.GroupScope_GROUP_SCOPE_DIRECT},
			{Group: "acme/vip", Scope: registryv1.GroupScope_GROUP_SCOPE_DIRECT},
			{Group: "acme/secret", Scope: registryv1.GroupScope_GROUP_SCOPE_LOCAL},
			{Group: "acme/nowhere", Scope: registryv1.GroupScope_GROUP_SCOPE_DIRECT},
		},
	})
	want := &registryv1.ResolveRecipientsResponse{
		Recipients: []*registryv1.Recipient{
			{Agent: admin, Basis: registryv1.DialogueBasis_DIALOGUE_BASIS_GROUP},
			{Agent: follower, Basis: registryv1.DialogueBasis_DIALOGUE_BASIS_FOLLOW},
			{Agent: members["h1"], Basis: registryv1.DialogueBasis_DIALOGUE_BASIS_GROUP},
		},
		Refusals: []*registryv1.RecipientRefusal{
			{Group: "acme/vip", Reason: "GROUP_MEMBERS_ONLY"},
			{Group: "acme/secret", Reason: "GROUP_NOT_FOUND"},
			{Group: "acme/nowhere", Reason: "GROUP_NOT_FOUND"},
			{Agent: ghost, Reason: "AGENT_NOT_FOUND"},
			{Agent: stranger, Reason: "NOT_CONNECTED"},
		},
	}
	if diff := cmp.Diff(want, resp, protocmp.Transform(), protocmp.IgnoreFields(&registryv1.RecipientRefusal{}, "message")); diff != "" {
		t.Errorf("ResolveRecipients(mixed list) mismatch (-want +got):\n%s", diff)
	}

	// Once the sender is a member of the restricted group, it reaches its
	// members.
	vipMember, vipKey := r.newAgent(t, "beta", "vip")
	if got := r.join(t, vipKey, vipMember, "acme/vip"); got.GetRequest() == nil {
		t.Fatalf("JoinGroup(restricted_public) = %v, want a pending request", got)
	}
	if _, err := r.client.AnswerGroupJoinRequest(as(t.Context(), adminKey), &registryv1.AnswerGroupJoinRequestRequest{Name: admin, Group: "acme/vip", Agent: vipMember, Accept: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.client.JoinGroup(as(t.Context(), senderKey), &registryv1.JoinGroupRequest{Name: sender, Group: "acme/vip"}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.client.AnswerGroupJoinRequest(as(t.Context(), adminKey), &registryv1.AnswerGroupJoinRequestRequest{Name: admin, Group: "acme/vip", Agent: sender, Accept: true}); err != nil {
		t.Fatal(err)
	}
	resp = r.resolve(t, &registryv1.ResolveRecipientsRequest{Sender: sender, Groups: []*registryv1.GroupTarget{{Group: "acme/vip", Scope: registryv1.GroupScope_GROUP_SCOPE_DIRECT}}})
	if got, want := recipientNames(resp), sortedCopy([]string{admin, vipMember}); !slices.Equal(got, want) {
		t.Errorf("ResolveRecipients(vip, as a member) = %v, want admin and %s", got, vipMember)
	}
}

func sortedCopy(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}

// TestResolveRecipients_invalidLists checks the InvalidArgument cases
// name their field.
func TestResolveRecipients_invalidLists(t *testing.T) {
	r := startAuthRegistry(t)
	sender, _ := r.newAgent(t, "acme", "s")
	cases := []struct {
		name  string
		req   *registryv1.ResolveRecipientsRequest
		field string
	}{
		{"neither direct nor groups", &registryv1.ResolveRecipientsRequest{Sender: sender}, "direct"},
		{"unknown scope", &registryv1.ResolveRecipientsRequest{Sender: sender, Groups: []*registryv1.GroupTarget{{Group: "acme/x", Scope: 9}}}, "groups[0].scope"},
		{"missing scope", &registryv1.ResolveRecipientsRequest{Sender: sender, Groups: []*registryv1.GroupTarget{{Group: "acme/x"}}}, "groups[0].scope"},
		{"empty path segment", &registryv1.ResolveRecipientsRequest{Sender: sender, Groups: []*registryv1.GroupTarget{{Group: "acme//x", Scope: registryv1.GroupScope_GROUP_SCOPE_DIRECT}}}, "groups[0].group"},
		{"forbidden ~>", &registryv1.ResolveRecipientsRequest{Sender: sender, Groups: []*registryv1.GroupTarget{{Group: "acme/a~>b", Scope: registryv1.GroupScope_GROUP_SCOPE_DIRECT}}}, "groups[0].group"},
		{"city without state", &registryv1.ResolveRecipientsRequest{Sender: sender, Direct: []string{sender}, Regions: []*registryv1.Region{{Country: "FR", City: "Paris"}}}, "regions[0]"},
		{"malformed direct", &registryv1.ResolveRecipientsRequest{Sender: sender, Direct: []string{"bob"}}, "direct[0]"},
	}
	for _, tc := range cases {
		_, err := r.client.ResolveRecipients(as(t.Context(), r.operator), tc.req)
		if status.Code(err) != codes.InvalidArgument || !strings.HasPrefix(status.Convert(err).Message(), tc.field+":") {
			t.Errorf("%s: ResolveRecipients error = %v, want INVALID_ARGUMENT naming %s", tc.name, err, tc.field)
		}
	}
}

// TestGroups_lifecycleOverGRPCAndREST walks a restricted_public group:
// created over REST by its admin, a join request answered with an invite,
// the invite accepted, a type change, search, lists, removal, leave.
func TestGroups_lifecycleOverGRPCAndREST(t *testing.T) {
	r := startAuthRegistry(t)
	admin, adminKey := r.newAgent(t, "acme", "admin")
	bob, bobKey := r.newAgent(t, "beta", "bob")
	carol, carolKey := r.newAgent(t, "gamma", "carol")
	ctx := t.Context()

	res := do(t, http.MethodPost, r.url+"/v1/"+admin+":createGroup", `{"group":{"path":"acme/Travel","access":"GROUP_ACCESS_RESTRICTED_PUBLIC","category":"GROUP_CATEGORY_SERVICE","displayName":"Travel deals","agentDescription":"Send travel task requests"}}`, "Authorization", "Bearer "+adminKey)
	if res.code != http.StatusOK {
		t.Fatalf("POST :createGroup = %d %s", res.code, res.body)
	}
	res = do(t, http.MethodGet, r.url+"/v1/groups/acme/Travel", "", "Authorization", "Bearer "+bobKey)
	if res.code != http.StatusOK || !strings.Contains(string(res.body), "Travel deals") {
		t.Errorf("GET /v1/groups/acme/Travel = %d %s; want 200 with the group", res.code, res.body)
	}
	// A sub-group must match its parent.
	_, err := r.client.CreateGroup(as(ctx, adminKey), &registryv1.CreateGroupRequest{Name: admin, Group: &registryv1.Group{Path: "acme/Travel/Hotel", Access: openPublic, Category: registryv1.GroupCategory_GROUP_CATEGORY_SERVICE}})
	if status.Code(err) != codes.InvalidArgument || grpcerr.Reason(err) != "GROUP_PARENT_MISMATCH" || !strings.HasPrefix(status.Convert(err).Message(), "group.access") {
		t.Errorf("CreateGroup(sub-group with other access) = %v, want INVALID_ARGUMENT GROUP_PARENT_MISMATCH on group.access", err)
	}

	// bob asks to join; admin answers with an invite as an admin.
	if got := r.join(t, bobKey, bob, "acme/Travel"); got.GetRequest() == nil || got.GetMember() != nil {
		t.Fatalf("JoinGroup(restricted_public) = %v, want a pending request", got)
	}
	reqs, err := r.client.ListGroupJoinRequests(as(ctx, adminKey), &registryv1.ListGroupJoinRequestsRequest{Parent: admin, Group: "acme/Travel"})
	if err != nil || len(reqs.GetRequests()) != 1 || reqs.GetRequests()[0].GetAgent() != bob {
		t.Fatalf("ListGroupJoinRequests = %v, %v; want bob's", reqs, err)
	}
	if _, err := r.client.InviteToGroup(as(ctx, adminKey), &registryv1.InviteToGroupRequest{Name: admin, Group: "acme/Travel", Agent: bob, MemberType: registryv1.MemberType_MEMBER_TYPE_ADMIN, Conditions: "10 EUR a month", PaymentRequired: true}); err != nil {
		t.Fatalf("InviteToGroup(bob, answering his request): %v", err)
	}
	if reqs, _ := r.client.ListGroupJoinRequests(as(ctx, adminKey), &registryv1.ListGroupJoinRequestsRequest{Parent: admin, Group: "acme/Travel"}); len(reqs.GetRequests()) != 0 {
		t.Errorf("join requests after answering with an invite = %v, want none", reqs.GetRequests())
	}
	invites, err := r.client.ListGroupInvites(as(ctx, bobKey), &registryv1.ListGroupInvitesRequest{Parent: bob})
	if err != nil || len(invites.GetInvites()) != 1 || invites.GetInvites()[0].GetConditions() != "10 EUR a month" || !invites.GetInvites()[0].GetPaymentRequired() {
		t.Fatalf("ListGroupInvites(bob) = %v, %v", invites, err)
	}
	ans, err := r.client.AnswerGroupInvite(as(ctx, bobKey), &registryv1.AnswerGroupInviteRequest{Name: bob, Group: "acme/Travel", Accept: true, Payment: "pay_ref_1", Regions: []*registryv1.Region{region("DE", "BE", "Berlin")}})
	if err != nil || ans.GetMember().GetMemberType() != registryv1.MemberType_MEMBER_TYPE_ADMIN {
		t.Fatalf("AnswerGroupInvite(accept) = %v, %v; want an admin membership", ans, err)
	}
	// bob, now an admin, may invite carol if she follows him.
	if _, err := r.client.InviteToGroup(as(ctx, bobKey), &registryv1.InviteToGroupRequest{Name: bob, Group: "acme/Travel", Agent: carol}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("InviteToGroup(carol, who does not follow bob) = %v, want PERMISSION_DENIED", err)
	}
	if _, err := r.client.FollowAgent(as(ctx, carolKey), &registryv1.FollowAgentRequest{Name: carol, Agent: bob}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.client.InviteToGroup(as(ctx, bobKey), &registryv1.InviteToGroupRequest{Name: bob, Group: "acme/Travel", Agent: carol}); err != nil {
		t.Fatalf("InviteToGroup(carol, a follower): %v", err)
	}
	if _, err := r.client.AnswerGroupInvite(as(ctx, carolKey), &registryv1.AnswerGroupInviteRequest{Name: carol, Group: "acme/Travel", Accept: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.client.SetGroupMemberType(as(ctx, adminKey), &registryv1.SetGroupMemberTypeRequest{Name: admin, Group: "acme/Travel", Agent: bob, MemberType: registryv1.MemberType_MEMBER_TYPE_MEMBER}); err != nil {
		t.Fatal(err)
	}
	admins, err := r.client.ListAgentGroups(as(ctx, bobKey), &registryv1.ListAgentGroupsRequest{Parent: bob, AdminOnly: true})
	if err != nil || len(admins.GetMembers()) != 0 {
		t.Errorf("ListAgentGroups(bob, admin only) after demotion = %v, %v; want none", admins, err)
	}
	all, err := r.client.ListAgentGroups(as(ctx, bobKey), &registryv1.ListAgentGroupsRequest{Parent: bob})
	if err != nil || len(all.GetMembers()) != 1 || all.GetMembers()[0].GetRegions()[0].GetCity() != "Berlin" {
		t.Errorf("ListAgentGroups(bob) = %v, %v; want acme/Travel with Berlin", all, err)
	}

	// Search: case-insensitive over names and descriptions; private groups
	// are never listed.
	r.createGroup(t, adminKey, admin, "acme/hidden-travel", restrictedPrivate)
	res = do(t, http.MethodGet, r.url+"/v1/groups:search?query=TRAVEL%20TASK", "", "Authorization", "Bearer "+carolKey)
	if res.code != http.StatusOK || !strings.Contains(string(res.body), `"acme/Travel"`) {
		t.Errorf("GET /v1/groups:search = %d %s; want acme/Travel", res.code, res.body)
	}
	found, err := r.client.SearchGroups(as(ctx, carolKey), &registryv1.SearchGroupsRequest{Query: "travel"})
	if err != nil || len(found.GetGroups()) != 1 || found.GetGroups()[0].GetPath() != "acme/Travel" {
		t.Errorf("SearchGroups(travel) = %v, %v; want only acme/Travel", found, err)
	}
	if _, err := r.client.GetGroup(as(ctx, carolKey), &registryv1.GetGroupRequest{Path: "acme/hidden-travel"}); status.Code(err) != codes.NotFound {
		t.Errorf("GetGroup(private, as a non-member) = %v, want NOT_FOUND", err)
	}

	// Removal and leaving.
	if _, err := r.client.RemoveGroupMember(as(ctx, adminKey), &registryv1.RemoveGroupMemberRequest{Name: admin, Group: "acme/Travel", Agent: carol}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.client.LeaveGroup(as(ctx, bobKey), &registryv1.LeaveGroupRequest{Name: bob, Group: "acme/Travel"}); err != nil {
		t.Fatal(err)
	}
	mem, err := r.client.ListGroupMembers(as(ctx, adminKey), &registryv1.ListGroupMembersRequest{Name: admin, Group: "acme/Travel"})
	if err != nil || len(mem.GetMembers()) != 1 || mem.GetMembers()[0].GetAgent() != admin {
		t.Errorf("ListGroupMembers after removal and leave = %v, %v; want only the admin", mem, err)
	}
}

// TestGroups_searchPagesAndStopsAt350 pages a search to its end.
func TestGroups_searchPagesAndStopsAt350(t *testing.T) {
	r := startAuthRegistry(t)
	admin, adminKey := r.newAgent(t, "acme", "admin")
	for _, p := range []string{"acme/a", "acme/b", "acme/c", "acme/d", "acme/e"} {
		r.createGroup(t, adminKey, admin, p, openPublic)
	}
	var got []string
	token := ""
	for range 10 {
		resp, err := r.client.SearchGroups(as(t.Context(), adminKey), &registryv1.SearchGroupsRequest{Query: "ABOUT", PageSize: 2, PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range resp.GetGroups() {
			got = append(got, g.GetPath())
		}
		if token = resp.GetNextPageToken(); token == "" {
			break
		}
	}
	if want := []string{"acme/a", "acme/b", "acme/c", "acme/d", "acme/e"}; !slices.Equal(got, want) {
		t.Errorf("SearchGroups pages = %v, want %v", got, want)
	}
	if _, err := r.client.SearchGroups(as(t.Context(), adminKey), &registryv1.SearchGroupsRequest{Query: "other", PageToken: token + "x"}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("SearchGroups(foreign token) = %v, want INVALID_ARGUMENT", err)
	}
}

// groupState is everything a group refusal could change, read as the
// operator: the groups, each one's members, join requests and invites,
// and the notification outbox.
func (r *authRegistry) groupState(t *testing.T, admin string, agents []string, paths []string) string {
	t.Helper()
	ctx := as(t.Context(), r.operator)
	var b strings.Builder
	for _, p := range paths {
		g, err := r.client.GetGroup(ctx, &registryv1.GetGroupRequest{Path: p})
		b.WriteString(p + ": " + protoText(g) + " " + status.Code(err).String() + "\n")
		mem, err := r.client.ListGroupMembers(ctx, &registryv1.ListGroupMembersRequest{Name: admin, Group: p})
		b.WriteString("  members: " + protoText(mem) + " " + status.Code(err).String() + "\n")
		reqs, err := r.client.ListGroupJoinRequests(ctx, &registryv1.ListGroupJoinRequestsRequest{Parent: admin, Group: p})
		b.WriteString("  requests: " + protoText(reqs) + " " + status.Code(err).String() + "\n")
	}
	for _, a := range agents {
		inv, err := r.client.ListGroupInvites(ctx, &registryv1.ListGroupInvitesRequest{Parent: a})
		b.WriteString(a + " invites: " + protoText(inv) + " " + status.Code(err).String() + "\n")
		groups, err := r.client.ListAgentGroups(ctx, &registryv1.ListAgentGroupsRequest{Parent: a})
		b.WriteString(a + " groups: " + protoText(groups) + " " + status.Code(err).String() + "\n")
	}
	notes, err := r.client.ListNotifications(ctx, &registryv1.ListNotificationsRequest{})
	b.WriteString("outbox: " + protoText(notes) + " " + status.Code(err).String() + "\n")
	return b.String()
}

func protoText(m proto.Message) string {
	if m == nil {
		return "<nil>"
	}
	return prototext.Format(m)
}

// TestGroups_refusalsChangeNothing checks each refused group call's code
// and reason, then that no group, membership, request, invite or
// notification was written.
func TestGroups_refusalsChangeNothing(t *testing.T) {
	r := startAuthRegistry(t)
	admin, adminKey := r.newAgent(t, "acme", "admin")
	bob, bobKey := r.newAgent(t, "beta", "bob")
	carol, carolKey := r.newAgent(t, "beta", "carol")
	r.createGroup(t, adminKey, admin, "acme/open", openPublic)
	r.createGroup(t, adminKey, admin, "acme/club", restrictedPublic)
	r.createGroup(t, adminKey, admin, "acme/secret", restrictedPrivate)
	r.join(t, bobKey, bob, "acme/open")
	r.join(t, carolKey, carol, "acme/club") // a pending request
	paths := []string{"acme/open", "acme/club", "acme/secret", "acme/open/sub", "beta/mine"}
	agents := []string{admin, bob, carol}
	before := r.groupState(t, admin, agents, paths)
	ctx := t.Context()
	long := strings.Repeat("x", 2049)
	cases := []struct {
		name   string
		call   func() error
		code   codes.Code
		reason string
	}{
		{"create, unauthenticated", func() error {
			_, err := r.client.CreateGroup(ctx, &registryv1.CreateGroupRequest{Name: bob, Group: &registryv1.Group{Path: "beta/mine", Access: openPublic, Category: categoryMessage}})
			return err
		}, codes.Unauthenticated, ""},
		{"create as another agent", func() error {
			_, err := r.client.CreateGroup(as(ctx, carolKey), &registryv1.CreateGroupRequest{Name: bob, Group: &registryv1.Group{Path: "beta/mine", Access: openPublic, Category: categoryMessage}})
			return err
		}, codes.PermissionDenied, ""},
		{"create under another client", func() error {
			_, err := r.client.CreateGroup(as(ctx, bobKey), &registryv1.CreateGroupRequest{Name: bob, Group: &registryv1.Group{Path: "acme/mine", Access: openPublic, Category: categoryMessage}})
			return err
		}, codes.PermissionDenied, "GROUP_CLIENT_FOREIGN"},
		{"create a sub-group of a group one does not administer", func() error {
			_, err := r.client.CreateGroup(as(ctx, bobKey), &registryv1.CreateGroupRequest{Name: bob, Group: &registryv1.Group{Path: "acme/open/sub", Access: openPublic, Category: categoryMessage}})
			return err
		}, codes.PermissionDenied, "GROUP_ADMIN_ONLY"},
		{"create a sub-group with another category", func() error {
			_, err := r.client.CreateGroup(as(ctx, adminKey), &registryv1.CreateGroupRequest{Name: admin, Group: &registryv1.Group{Path: "acme/open/sub", Access: openPublic, Category: registryv1.GroupCategory_GROUP_CATEGORY_SUBSCRIPTION}})
			return err
		}, codes.InvalidArgument, "GROUP_PARENT_MISMATCH"},
		{"create a sub-group with a protocol its parent lacks", func() error {
			_, err := r.client.CreateGroup(as(ctx, adminKey), &registryv1.CreateGroupRequest{Name: admin, Group: &registryv1.Group{Path: "acme/open/sub", Access: openPublic, Category: categoryMessage, Protocol: strings.Repeat("ab", 20)}})
			return err
		}, codes.InvalidArgument, "GROUP_PARENT_MISMATCH"},
		{"create an existing group", func() error {
			_, err := r.client.CreateGroup(as(ctx, adminKey), &registryv1.CreateGroupRequest{Name: admin, Group: &registryv1.Group{Path: "acme/open", Access: openPublic, Category: categoryMessage}})
			return err
		}, codes.AlreadyExists, "GROUP_ALREADY_EXISTS"},
		{"create with an empty segment", func() error {
			_, err := r.client.CreateGroup(as(ctx, bobKey), &registryv1.CreateGroupRequest{Name: bob, Group: &registryv1.Group{Path: "beta//mine", Access: openPublic, Category: categoryMessage}})
			return err
		}, codes.InvalidArgument, "INVALID_ARGUMENT"},
		{"create with ~>", func() error {
			_, err := r.client.CreateGroup(as(ctx, bobKey), &registryv1.CreateGroupRequest{Name: bob, Group: &registryv1.Group{Path: "beta/mi~>ne", Access: openPublic, Category: categoryMessage}})
			return err
		}, codes.InvalidArgument, "INVALID_ARGUMENT"},
		{"create without access", func() error {
			_, err := r.client.CreateGroup(as(ctx, bobKey), &registryv1.CreateGroupRequest{Name: bob, Group: &registryv1.Group{Path: "beta/mine", Category: categoryMessage}})
			return err
		}, codes.InvalidArgument, "INVALID_ARGUMENT"},
		{"create with a long description", func() error {
			_, err := r.client.CreateGroup(as(ctx, bobKey), &registryv1.CreateGroupRequest{Name: bob, Group: &registryv1.Group{Path: "beta/mine", Access: openPublic, Category: categoryMessage, Description: long}})
			return err
		}, codes.InvalidArgument, "INVALID_ARGUMENT"},
		{"edit an immutable field", func() error {
			_, err := r.client.UpdateGroup(as(ctx, adminKey), &registryv1.UpdateGroupRequest{Name: admin, Group: &registryv1.Group{Path: "acme/open", Access: restrictedPublic}, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"access"}}})
			return err
		}, codes.InvalidArgument, "INVALID_ARGUMENT"},
		{"edit as a plain member", func() error {
			_, err := r.client.UpdateGroup(as(ctx, bobKey), &registryv1.UpdateGroupRequest{Name: bob, Group: &registryv1.Group{Path: "acme/open", Description: "mine now"}})
			return err
		}, codes.PermissionDenied, "GROUP_ADMIN_ONLY"},
		{"join a restricted_private group", func() error {
			_, err := r.client.JoinGroup(as(ctx, bobKey), &registryv1.JoinGroupRequest{Name: bob, Group: "acme/secret"})
			return err
		}, codes.PermissionDenied, "GROUP_INVITE_ONLY"},
		{"join a missing group", func() error {
			_, err := r.client.JoinGroup(as(ctx, bobKey), &registryv1.JoinGroupRequest{Name: bob, Group: "acme/nowhere"})
			return err
		}, codes.NotFound, "GROUP_NOT_FOUND"},
		{"join with a city but no state", func() error {
			_, err := r.client.JoinGroup(as(ctx, carolKey), &registryv1.JoinGroupRequest{Name: carol, Group: "acme/open", Regions: []*registryv1.Region{{Country: "FR", City: "Paris"}}})
			return err
		}, codes.InvalidArgument, "INVALID_ARGUMENT"},
		{"join as another agent", func() error {
			_, err := r.client.JoinGroup(as(ctx, bobKey), &registryv1.JoinGroupRequest{Name: carol, Group: "acme/open"})
			return err
		}, codes.PermissionDenied, ""},
		{"leave a group one is not in", func() error {
			_, err := r.client.LeaveGroup(as(ctx, carolKey), &registryv1.LeaveGroupRequest{Name: carol, Group: "acme/open"})
			return err
		}, codes.NotFound, "GROUP_MEMBER_NOT_FOUND"},
		{"invite as a plain member", func() error {
			_, err := r.client.InviteToGroup(as(ctx, bobKey), &registryv1.InviteToGroupRequest{Name: bob, Group: "acme/open", Agent: carol})
			return err
		}, codes.PermissionDenied, "GROUP_ADMIN_ONLY"},
		{"invite an agent that does not follow the admin", func() error {
			_, err := r.client.InviteToGroup(as(ctx, adminKey), &registryv1.InviteToGroupRequest{Name: admin, Group: "acme/secret", Agent: bob})
			return err
		}, codes.PermissionDenied, "GROUP_INVITEE_NOT_CONNECTED"},
		{"invite a member", func() error {
			_, err := r.client.InviteToGroup(as(ctx, adminKey), &registryv1.InviteToGroupRequest{Name: admin, Group: "acme/open", Agent: bob})
			return err
		}, codes.AlreadyExists, "GROUP_MEMBER_ALREADY_EXISTS"},
		{"invite a missing agent", func() error {
			_, err := r.client.InviteToGroup(as(ctx, adminKey), &registryv1.InviteToGroupRequest{Name: admin, Group: "acme/open", Agent: "clients/beta/agents/ghost"})
			return err
		}, codes.NotFound, "AGENT_NOT_FOUND"},
		{"answer a join request as a non-admin", func() error {
			_, err := r.client.AnswerGroupJoinRequest(as(ctx, bobKey), &registryv1.AnswerGroupJoinRequestRequest{Name: bob, Group: "acme/club", Agent: carol, Accept: true})
			return err
		}, codes.PermissionDenied, "GROUP_ADMIN_ONLY"},
		{"answer a request never made", func() error {
			_, err := r.client.AnswerGroupJoinRequest(as(ctx, adminKey), &registryv1.AnswerGroupJoinRequestRequest{Name: admin, Group: "acme/club", Agent: bob, Accept: true})
			return err
		}, codes.NotFound, "GROUP_JOIN_REQUEST_NOT_FOUND"},
		{"answer an invite never made", func() error {
			_, err := r.client.AnswerGroupInvite(as(ctx, carolKey), &registryv1.AnswerGroupInviteRequest{Name: carol, Group: "acme/secret", Accept: true})
			return err
		}, codes.NotFound, "GROUP_INVITE_NOT_FOUND"},
		{"remove as a plain member", func() error {
			_, err := r.client.RemoveGroupMember(as(ctx, bobKey), &registryv1.RemoveGroupMemberRequest{Name: bob, Group: "acme/open", Agent: admin})
			return err
		}, codes.PermissionDenied, "GROUP_ADMIN_ONLY"},
		{"promote oneself", func() error {
			_, err := r.client.SetGroupMemberType(as(ctx, bobKey), &registryv1.SetGroupMemberTypeRequest{Name: bob, Group: "acme/open", Agent: bob, MemberType: registryv1.MemberType_MEMBER_TYPE_ADMIN})
			return err
		}, codes.PermissionDenied, "GROUP_ADMIN_ONLY"},
		{"leave as the last admin", func() error {
			_, err := r.client.LeaveGroup(as(ctx, adminKey), &registryv1.LeaveGroupRequest{Name: admin, Group: "acme/open"})
			return err
		}, codes.FailedPrecondition, "GROUP_LAST_ADMIN"},
		{"remove the last admin", func() error {
			_, err := r.client.RemoveGroupMember(as(ctx, adminKey), &registryv1.RemoveGroupMemberRequest{Name: admin, Group: "acme/open", Agent: admin})
			return err
		}, codes.FailedPrecondition, "GROUP_LAST_ADMIN"},
		{"demote the last admin", func() error {
			_, err := r.client.SetGroupMemberType(as(ctx, adminKey), &registryv1.SetGroupMemberTypeRequest{Name: admin, Group: "acme/open", Agent: admin, MemberType: registryv1.MemberType_MEMBER_TYPE_MEMBER})
			return err
		}, codes.FailedPrecondition, "GROUP_LAST_ADMIN"},
		{"set an unknown member type", func() error {
			_, err := r.client.SetGroupMemberType(as(ctx, adminKey), &registryv1.SetGroupMemberTypeRequest{Name: admin, Group: "acme/open", Agent: bob, MemberType: 7})
			return err
		}, codes.InvalidArgument, "INVALID_ARGUMENT"},
		{"list members as a non-member", func() error {
			_, err := r.client.ListGroupMembers(as(ctx, carolKey), &registryv1.ListGroupMembersRequest{Name: carol, Group: "acme/open"})
			return err
		}, codes.PermissionDenied, "GROUP_MEMBERS_ONLY"},
		{"list join requests as a non-admin", func() error {
			_, err := r.client.ListGroupJoinRequests(as(ctx, bobKey), &registryv1.ListGroupJoinRequestsRequest{Parent: bob, Group: "acme/club"})
			return err
		}, codes.PermissionDenied, "GROUP_ADMIN_ONLY"},
		{"list another agent's invites", func() error {
			_, err := r.client.ListGroupInvites(as(ctx, bobKey), &registryv1.ListGroupInvitesRequest{Parent: carol})
			return err
		}, codes.PermissionDenied, ""},
		{"resolve with an agent key", func() error {
			_, err := r.client.ResolveRecipients(as(ctx, bobKey), &registryv1.ResolveRecipientsRequest{Sender: bob, Direct: []string{admin}})
			return err
		}, codes.PermissionDenied, ""},
		{"read the outbox with an agent key", func() error {
			_, err := r.client.ListNotifications(as(ctx, bobKey), &registryv1.ListNotificationsRequest{})
			return err
		}, codes.PermissionDenied, ""},
		{"search with an empty query", func() error {
			_, err := r.client.SearchGroups(as(ctx, bobKey), &registryv1.SearchGroupsRequest{})
			return err
		}, codes.InvalidArgument, "INVALID_ARGUMENT"},
		{"search, unauthenticated", func() error {
			_, err := r.client.SearchGroups(ctx, &registryv1.SearchGroupsRequest{Query: "a"})
			return err
		}, codes.Unauthenticated, ""},
	}
	for _, tc := range cases {
		err := tc.call()
		if status.Code(err) != tc.code || (tc.reason != "" && grpcerr.Reason(err) != tc.reason) {
			t.Errorf("%s: error = %v (reason %q), want %v %s", tc.name, err, grpcerr.Reason(err), tc.code, tc.reason)
		}
	}
	if after := r.groupState(t, admin, agents, paths); after != before {
		t.Errorf("state changed by refused calls:\n--- before\n%s\n--- after\n%s", before, after)
	}
}

type noteKey struct{ typ, recipient, agent, group, response string }

func (r *authRegistry) notesAfter(t *testing.T, after uint64) ([]noteKey, uint64) {
	t.Helper()
	resp, err := r.client.ListNotifications(as(t.Context(), r.operator), &registryv1.ListNotificationsRequest{After: after})
	if err != nil {
		t.Fatalf("ListNotifications(after %d): %v", after, err)
	}
	var out []noteKey
	for _, n := range resp.GetNotifications() {
		out = append(out, noteKey{n.GetType(), n.GetRecipient(), n.GetAgent(), n.GetGroup(), n.GetResponse()})
		after = n.GetSequence()
	}
	return out, after
}

// TestNotifications_eachChangeNotifiesTheRightAgents makes every change
// the spec lists a notification for and reads the outbox as the
// dispatcher does.
func TestNotifications_eachChangeNotifiesTheRightAgents(t *testing.T) {
	r := startAuthRegistry(t)
	ctx := t.Context()
	admin, adminKey := r.newAgent(t, "acme", "admin")
	admin2, admin2Key := r.newAgent(t, "acme", "admin2")
	bob, bobKey := r.newAgent(t, "beta", "bob")
	carol, carolKey := r.newAgent(t, "gamma", "carol")
	r.createGroup(t, adminKey, admin, "acme/club", restrictedPublic)
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	_, err := r.client.FollowAgent(as(ctx, admin2Key), &registryv1.FollowAgentRequest{Name: admin2, Agent: admin})
	must("admin2 follows admin", err)
	_, err = r.client.InviteToGroup(as(ctx, adminKey), &registryv1.InviteToGroupRequest{Name: admin, Group: "acme/club", Agent: admin2, MemberType: registryv1.MemberType_MEMBER_TYPE_ADMIN})
	must("invite admin2", err)
	_, err = r.client.AnswerGroupInvite(as(ctx, admin2Key), &registryv1.AnswerGroupInviteRequest{Name: admin2, Group: "acme/club", Accept: true})
	must("admin2 accepts", err)
	_, cursor := r.notesAfter(t, 0)

	_, err = r.client.FollowAgent(as(ctx, bobKey), &registryv1.FollowAgentRequest{Name: bob, Agent: admin})
	must("bob follows admin", err)
	_, err = r.client.UnfollowAgent(as(ctx, bobKey), &registryv1.UnfollowAgentRequest{Name: bob, Agent: admin})
	must("bob unfollows admin", err)
	r.join(t, bobKey, bob, "acme/club")
	_, err = r.client.AnswerGroupJoinRequest(as(ctx, admin2Key), &registryv1.AnswerGroupJoinRequestRequest{Name: admin2, Group: "acme/club", Agent: bob, Accept: true})
	must("admin2 accepts bob", err)
	// The first admin to act decided: the request is gone for the other.
	if _, err := r.client.AnswerGroupJoinRequest(as(ctx, adminKey), &registryv1.AnswerGroupJoinRequestRequest{Name: admin, Group: "acme/club", Agent: bob}); status.Code(err) != codes.NotFound {
		t.Errorf("AnswerGroupJoinRequest(second admin) = %v, want NOT_FOUND", err)
	}
	_, err = r.client.FollowAgent(as(ctx, carolKey), &registryv1.FollowAgentRequest{Name: carol, Agent: admin})
	must("carol follows admin", err)
	_, err = r.client.InviteToGroup(as(ctx, adminKey), &registryv1.InviteToGroupRequest{Name: admin, Group: "acme/club", Agent: carol})
	must("invite carol", err)
	_, err = r.client.AnswerGroupInvite(as(ctx, carolKey), &registryv1.AnswerGroupInviteRequest{Name: carol, Group: "acme/club"})
	must("carol declines", err)
	_, err = r.client.SetGroupMemberType(as(ctx, adminKey), &registryv1.SetGroupMemberTypeRequest{Name: admin, Group: "acme/club", Agent: bob, MemberType: registryv1.MemberType_MEMBER_TYPE_ADMIN})
	must("promote bob", err)
	_, err = r.client.RemoveGroupMember(as(ctx, adminKey), &registryv1.RemoveGroupMemberRequest{Name: admin, Group: "acme/club", Agent: bob})
	must("remove bob", err)

	got, _ := r.notesAfter(t, cursor)
	want := []noteKey{
		{"followed", admin, bob, "", ""},
		{"unfollowed", admin, bob, "", ""},
		{"request_to_join_group", admin, bob, "acme/club", ""},
		{"request_to_join_group", admin2, bob, "acme/club", ""},
		{"request_to_join_group_response", bob, admin2, "acme/club", "accepted"},
		{"followed", admin, carol, "", ""},
		{"invite_to_group", carol, admin, "acme/club", ""},
		{"invite_to_group_response", admin, carol, "acme/club", "rejected"},
		{"group_member_type_change", bob, admin, "acme/club", ""},
		{"removed_from_group", bob, admin, "acme/club", ""},
	}
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(noteKey{})); diff != "" {
		t.Errorf("notifications (-want +got):\n%s", diff)
	}
}

// TestListNotifications_waitsForTheNextOne starts a long poll past the
// end of the outbox, then follows: the poll answers with that
// notification (whether it began before or after the follow).
func TestListNotifications_waitsForTheNextOne(t *testing.T) {
	r := startAuthRegistry(t)
	alice, _ := r.newAgent(t, "acme", "alice")
	bob, bobKey := r.newAgent(t, "beta", "bob")
	_, cursor := r.notesAfter(t, 0)
	got := make(chan *registryv1.ListNotificationsResponse, 1)
	errs := make(chan error, 1)
	go func() {
		resp, err := r.client.ListNotifications(as(t.Context(), r.operator), &registryv1.ListNotificationsRequest{After: cursor, Wait: durationpb.New(20 * time.Second)})
		got <- resp
		errs <- err
	}()
	if _, err := r.client.FollowAgent(as(t.Context(), bobKey), &registryv1.FollowAgentRequest{Name: bob, Agent: alice}); err != nil {
		t.Fatal(err)
	}
	resp, err := <-got, <-errs
	if err != nil || len(resp.GetNotifications()) != 1 || resp.GetNotifications()[0].GetType() != "followed" {
		t.Errorf("ListNotifications(wait) = %v, %v; want the followed notification", resp, err)
	}
	// trim_through drops what the reader relayed.
	resp, err = r.client.ListNotifications(as(t.Context(), r.operator), &registryv1.ListNotificationsRequest{After: resp.GetNotifications()[0].GetSequence(), TrimThrough: resp.GetNotifications()[0].GetSequence()})
	if err != nil || len(resp.GetNotifications()) != 0 {
		t.Fatalf("ListNotifications(trim) = %v, %v", resp, err)
	}
	if all, _ := r.notesAfter(t, 0); len(all) != 0 {
		t.Errorf("outbox after trimming everything = %v, want empty", all)
	}
	if _, err := r.client.ListNotifications(as(t.Context(), r.operator), &registryv1.ListNotificationsRequest{Wait: durationpb.New(time.Minute)}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("ListNotifications(wait 1m) = %v, want INVALID_ARGUMENT", err)
	}
}
