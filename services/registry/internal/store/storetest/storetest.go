// Package storetest is the conformance suite every registry store backend
// must pass: call Run from the backend's tests with a function opening a
// fresh, empty store.
package storetest

import (
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/services/registry/internal/pd"
	"github.com/parleyhq/parley/services/registry/internal/store"
)

// Run runs the suite. open returns a new empty store; Run closes it.
func Run(t *testing.T, open func(t *testing.T) store.Store) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s store.Store)
	}{
		{"CreateProtocol_storesExactBytes", testCreateProtocolExact},
		{"CreateProtocol_idempotent", testCreateProtocolIdempotent},
		{"CreateProtocol_conflict", testCreateProtocolConflict},
		{"GetProtocol_notFound", testGetProtocolNotFound},
		{"ListProtocols_pagesInHashOrder", testListProtocols},
		{"ListProtocols_query", testListProtocolsQuery},
		{"Agents_lifecycle", testAgents},
		{"ListAgents_pagesAndClients", testListAgents},
		{"UpdateAgent_mutateErrorWritesNothing", testUpdateAgentError},
		{"RequestIDs_repeatReturnsFirstResult", testRequestIDs},
		{"RequestIDs_sweepInBatches", testSweepRequestBatches},
		{"Clients_createGetList", testClients},
		{"Keys_lifecycle", testKeys},
		{"Keys_ownerMustExist", testKeysOwnerMissing},
		{"Keys_limitPerOwner", testKeysLimit},
		{"Keys_goWithTheirAgent", testKeysDeletedWithAgent},
		{"Keys_secretNeverStored", testKeysSecretNeverStored},
		{"Follows_lifecycle", testFollows},
		{"Follows_missingAgentWritesNothing", testFollowMissing},
		{"ClientGroups_joinLeaveList", testClientGroups},
		{"Connections_goWithTheirAgent", testConnectionsGoWithTheirAgent},
		{"Groups_treeAndDescendants", testGroupsTree},
		{"Groups_membersBothWays", testGroupMembers},
		{"Groups_requestsAndInvites", testGroupRequestsAndInvites},
		{"Groups_failedUpdateWritesNothing", testGroupUpdateFailureWritesNothing},
		{"Groups_searchSkipsPrivate", testSearchGroups},
		{"Notifications_outbox", testNotificationOutbox},
		{"Notifications_trimInBatches", testNotificationTrimBatches},
		{"Groups_goWithTheirAgent", testGroupRecordsGoWithTheirAgent},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := open(t)
			t.Cleanup(func() { s.Close() })
			tt.fn(t, s)
		})
	}
}

// Protocol returns a protocol record for content as the server fills it.
func Protocol(content string) *registryv1.Protocol {
	h := pd.Sum([]byte(content))
	s256 := pd.Sum256([]byte(content))
	return &registryv1.Protocol{
		Name:       "protocols/" + h.Hex(),
		Content:    []byte(content),
		Sha1Hex:    h.Hex(),
		Sha1Base64: h.Base64(),
		Sha256Hex:  hex.EncodeToString(s256[:]),
		Title:      "Title of " + content,
		SizeBytes:  int64(len(content)),
		Origin:     "api",
	}
}

func mustHash(t *testing.T, p *registryv1.Protocol) pd.Hash {
	t.Helper()
	h, err := pd.ParseHash(p.GetSha1Hex())
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func testCreateProtocolExact(t *testing.T, s store.Store) {
	ctx := t.Context()
	p := Protocol("---\nname: Météo\n---\r\n  trailing space \n\n")
	got, created, err := s.CreateProtocol(ctx, p)
	if err != nil || !created {
		t.Fatalf("CreateProtocol() = %v, %v, %v; want created", got, created, err)
	}
	if diff := cmp.Diff(p, got, protocmp.Transform()); diff != "" {
		t.Errorf("CreateProtocol() returned (-want +got):\n%s", diff)
	}
	read, err := s.GetProtocol(ctx, mustHash(t, p))
	if err != nil {
		t.Fatalf("GetProtocol() error = %v", err)
	}
	if diff := cmp.Diff(p, read, protocmp.Transform()); diff != "" {
		t.Errorf("GetProtocol() (-want +got):\n%s", diff)
	}
}

func testCreateProtocolIdempotent(t *testing.T, s store.Store) {
	ctx := t.Context()
	first := Protocol("same bytes")
	if _, _, err := s.CreateProtocol(ctx, first); err != nil {
		t.Fatal(err)
	}
	again := Protocol("same bytes")
	again.Origin = "https://elsewhere.example/pd"
	got, created, err := s.CreateProtocol(ctx, again)
	if err != nil || created {
		t.Fatalf("CreateProtocol(again) = %v, %v; want existing, not created", created, err)
	}
	if got.GetOrigin() != "api" {
		t.Errorf("CreateProtocol(again).Origin = %q, want the first origin %q", got.GetOrigin(), "api")
	}
}

func testCreateProtocolConflict(t *testing.T, s store.Store) {
	ctx := t.Context()
	orig := Protocol("original")
	if _, _, err := s.CreateProtocol(ctx, orig); err != nil {
		t.Fatal(err)
	}
	// A forged record claiming the same SHA-1 for other bytes, as a SHA-1
	// collision would produce.
	forged := Protocol("forgery")
	forged.Name, forged.Sha1Hex, forged.Sha1Base64 = orig.Name, orig.Sha1Hex, orig.Sha1Base64
	if _, _, err := s.CreateProtocol(ctx, forged); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("CreateProtocol(forged) error = %v, want ErrConflict", err)
	}
	got, err := s.GetProtocol(ctx, mustHash(t, orig))
	if err != nil || string(got.GetContent()) != "original" {
		t.Errorf("GetProtocol() after conflict = %q, %v; want the original kept", got.GetContent(), err)
	}
}

func testGetProtocolNotFound(t *testing.T, s store.Store) {
	if _, err := s.GetProtocol(t.Context(), pd.Sum([]byte("absent"))); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetProtocol(absent) error = %v, want ErrNotFound", err)
	}
}

func testListProtocols(t *testing.T, s store.Store) {
	ctx := t.Context()
	const n = 7
	for i := range n {
		if _, _, err := s.CreateProtocol(ctx, Protocol(fmt.Sprint("doc ", i))); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	after := ""
	for pages := 0; ; pages++ {
		if pages > n {
			t.Fatalf("ListProtocols did not end after %d pages", pages)
		}
		page, err := s.ListProtocols(ctx, store.ListOptions{After: after, Limit: 3})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range page {
			if p.GetContent() != nil {
				t.Errorf("ListProtocols() returned content for %s", p.GetName())
			}
			got = append(got, p.GetSha1Hex())
		}
		if len(page) < 3 {
			break
		}
		after = page[len(page)-1].GetSha1Hex()
	}
	if len(got) != n {
		t.Fatalf("ListProtocols() pages held %d protocols, want %d", len(got), n)
	}
	for i := 1; i < len(got); i++ {
		if got[i-1] >= got[i] {
			t.Errorf("ListProtocols() order: %s before %s", got[i-1], got[i])
		}
	}
}

func testListProtocolsQuery(t *testing.T, s store.Store) {
	ctx := t.Context()
	a := Protocol("a")
	a.Title = "Weather Forecast"
	b := Protocol("b")
	b.Description = "Ask about the WEATHER"
	c := Protocol("c")
	c.Tags = []string{"travel", "weather-ish"}
	d := Protocol("d")
	d.Title = "Orders"
	for _, p := range []*registryv1.Protocol{a, b, c, d} {
		if _, _, err := s.CreateProtocol(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.ListProtocols(ctx, store.ListOptions{Limit: 10, Query: "wEaThEr"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Errorf("ListProtocols(query weather) returned %d protocols, want 3", len(got))
	}
	for _, p := range got {
		if p.GetSha1Hex() == d.GetSha1Hex() {
			t.Errorf("ListProtocols(query weather) returned %q", p.GetTitle())
		}
	}
}

func agent(client, id string) *registryv1.Agent {
	return &registryv1.Agent{Name: store.AgentPrefix(client) + id, DisplayName: id}
}

func testAgents(t *testing.T, s store.Store) {
	ctx := t.Context()
	a := agent("acme", "weather")
	created, err := s.CreateAgent(ctx, a, nil, "")
	if err != nil || created.GetEtag() == "" {
		t.Fatalf("CreateAgent() = %v, %v; want an etag", created, err)
	}
	if _, err := s.CreateAgent(ctx, a, nil, ""); !errors.Is(err, store.ErrAlreadyExists) {
		t.Errorf("CreateAgent(again) error = %v, want ErrAlreadyExists", err)
	}
	updated, err := s.UpdateAgent(ctx, a.GetName(), "", func(a *registryv1.Agent) error {
		a.SupportedProtocols = append(a.SupportedProtocols, &registryv1.SupportedProtocol{Protocol: "protocols/x", Sources: []string{"https://x"}})
		return nil
	})
	if err != nil || updated.GetEtag() == created.GetEtag() {
		t.Fatalf("UpdateAgent() = %v, %v; want a new etag", updated, err)
	}
	got, err := s.GetAgent(ctx, a.GetName())
	if err != nil || !proto.Equal(got, updated) {
		t.Errorf("GetAgent() = %v, %v; want %v", got, err, updated)
	}
	if err := s.DeleteAgent(ctx, a.GetName()); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetAgent(ctx, a.GetName()); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetAgent(deleted) error = %v, want ErrNotFound", err)
	}
	if err := s.DeleteAgent(ctx, a.GetName()); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("DeleteAgent(deleted) error = %v, want ErrNotFound", err)
	}
	if _, err := s.UpdateAgent(ctx, a.GetName(), "", func(*registryv1.Agent) error { return nil }); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("UpdateAgent(deleted) error = %v, want ErrNotFound", err)
	}
}

func testListAgents(t *testing.T, s store.Store) {
	ctx := t.Context()
	for _, c := range []string{"a", "ab", "b"} {
		for _, id := range []string{"x", "y", "z"} {
			if _, err := s.CreateAgent(ctx, agent(c, id), nil, ""); err != nil {
				t.Fatal(err)
			}
		}
	}
	list := func(client string) []string {
		var names []string
		after := ""
		for range 20 {
			page, err := s.ListAgents(ctx, store.ListOptions{Client: client, After: after, Limit: 2})
			if err != nil {
				t.Fatal(err)
			}
			for _, a := range page {
				names = append(names, a.GetName())
			}
			if len(page) < 2 {
				return names
			}
			after = page[len(page)-1].GetName()
		}
		t.Fatal("ListAgents did not end")
		return nil
	}
	if got := list("a"); len(got) != 3 || got[0] != "clients/a/agents/x" {
		t.Errorf("ListAgents(client a) = %v, want the three agents of a only", got)
	}
	if got := list(""); len(got) != 9 {
		t.Errorf("ListAgents(all) = %v, want 9 agents", got)
	}
}

func testUpdateAgentError(t *testing.T, s store.Store) {
	ctx := t.Context()
	a := agent("acme", "w")
	created, err := s.CreateAgent(ctx, a, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	_, err = s.UpdateAgent(ctx, a.GetName(), "", func(a *registryv1.Agent) error {
		a.Description = "changed"
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("UpdateAgent() error = %v, want the mutate error", err)
	}
	got, err := s.GetAgent(ctx, a.GetName())
	if err != nil || !proto.Equal(got, created) {
		t.Errorf("GetAgent() after failed update = %v, %v; want unchanged %v", got, err, created)
	}
}

// testSweepRequestBatches sweeps more request ids than one call may
// forget: each call forgets at most its limit, the oldest first, and the
// calls together forget exactly those recorded before the cut. The store
// stamps records with its clock, so the cut is taken between writes.
func testSweepRequestBatches(t *testing.T, s store.Store) {
	ctx := t.Context()
	const due = 7
	name := func(i int) (agentID, requestID string) { return fmt.Sprint("w", i), fmt.Sprint("create-", i) }
	created := make([]*registryv1.Agent, due)
	for i := range due {
		id, rid := name(i)
		a, err := s.CreateAgent(ctx, agent("acme", id), nil, rid)
		if err != nil {
			t.Fatal(err)
		}
		created[i] = a
	}
	cut := time.Now()
	// Recorded after the cut: kept, and it must not use up a batch.
	late, err := s.CreateAgent(ctx, agent("acme", "late"), nil, "create-late")
	if err != nil {
		t.Fatal(err)
	}
	// remembered reports whether a repeat of create i returns its first
	// result (recorded) or finds the agent taken (forgotten).
	remembered := func(i int) bool {
		t.Helper()
		id, rid := name(i)
		got, err := s.CreateAgent(ctx, agent("acme", id), nil, rid)
		switch {
		case err == nil && proto.Equal(got, created[i]):
			return true
		case errors.Is(err, store.ErrAlreadyExists):
			return false
		}
		t.Fatalf("CreateAgent(repeat %s) = %v, %v; want the first result or ErrAlreadyExists", rid, got, err)
		return false
	}
	dropOldestFirst(t, "SweepRequests", due, func(limit int) (int, error) { return s.SweepRequests(ctx, cut, limit) },
		func(i int) bool { return !remembered(i) }, func(i int) string { return fmt.Sprintf("the request id of create #%d", i) })
	if again, err := s.CreateAgent(ctx, agent("acme", "late"), nil, "create-late"); err != nil || !proto.Equal(again, late) {
		t.Errorf("CreateAgent(repeat create-late) after the sweeps = %v, %v; want the first result %v", again, err, late)
	}
}

func testRequestIDs(t *testing.T, s store.Store) {
	ctx := t.Context()
	a := agent("acme", "w")
	first, err := s.CreateAgent(ctx, a, nil, "create-1")
	if err != nil {
		t.Fatal(err)
	}
	again, err := s.CreateAgent(ctx, a, nil, "create-1")
	if err != nil || !proto.Equal(again, first) {
		t.Errorf("CreateAgent(repeat request id) = %v, %v; want the first result %v", again, err, first)
	}
	if _, err := s.CreateAgent(ctx, a, nil, "create-2"); !errors.Is(err, store.ErrAlreadyExists) {
		t.Errorf("CreateAgent(new request id) error = %v, want ErrAlreadyExists", err)
	}

	calls := 0
	add := func(a *registryv1.Agent) error {
		calls++
		a.Description += "+"
		return nil
	}
	u1, err := s.UpdateAgent(ctx, a.GetName(), "update-1", add)
	if err != nil {
		t.Fatal(err)
	}
	u2, err := s.UpdateAgent(ctx, a.GetName(), "update-1", add)
	if err != nil || !proto.Equal(u2, u1) || calls != 1 {
		t.Errorf("UpdateAgent(repeat request id) = %v, %v after %d mutate calls; want the first result %v, one call", u2, err, calls, u1)
	}
	boom := errors.New("boom")
	if _, err := s.UpdateAgent(ctx, a.GetName(), "update-2", func(*registryv1.Agent) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("UpdateAgent(failing) error = %v", err)
	}
	// A failed write records nothing: the same id acts next time.
	if u3, err := s.UpdateAgent(ctx, a.GetName(), "update-2", add); err != nil || u3.GetDescription() != "++" {
		t.Errorf("UpdateAgent(id of a failed write) = %v, %v; want it applied", u3, err)
	}

	// Sweeping drops records older than the cutoff only.
	if n, err := s.SweepRequests(ctx, time.Now().Add(-time.Hour), 10); err != nil || n != 0 {
		t.Errorf("SweepRequests(an hour ago) = %d, %v; want 0 dropped", n, err)
	}
	if n, err := s.SweepRequests(ctx, time.Now().Add(time.Hour), 10); err != nil || n != 3 {
		t.Errorf("SweepRequests(in an hour) = %d, %v; want 3 dropped", n, err)
	}
	if u4, err := s.UpdateAgent(ctx, a.GetName(), "update-1", add); err != nil || u4.GetDescription() != "+++" {
		t.Errorf("UpdateAgent(swept request id) = %v, %v; want it applied anew", u4, err)
	}
}

// dropOldestFirst calls drop with a limit of 3 until a call drops
// nothing, over due items that are all due (item 0 the oldest), and checks
// the batches: after k dropped in all, item i is gone exactly when i < k,
// and seven due go in calls dropping 3, 3, 1 and 0. what names the call,
// name an item, in the errors.
func dropOldestFirst(t *testing.T, what string, due int, drop func(limit int) (int, error), gone func(i int) bool, name func(i int) string) {
	t.Helper()
	var got []int
	dropped := 0
	for range due {
		n, err := drop(3)
		if err != nil {
			t.Fatalf("%s(limit 3) = %v", what, err)
		}
		got = append(got, n)
		if n == 0 {
			break
		}
		dropped += n
		for i := range due {
			if g := gone(i); g != (i < dropped) {
				t.Errorf("after %s dropped %d: %s gone = %t, want %t", what, dropped, name(i), g, i < dropped)
			}
		}
	}
	if want := []int{3, 3, 1, 0}; !slices.Equal(got, want) {
		t.Errorf("%s(limit 3) dropped %v per call, want %v", what, got, want)
	}
}
