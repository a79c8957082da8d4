package storetest

import (
	"errors"
	"slices"
	"testing"

	"github.com/parleyhq/parley/services/registry/internal/store"
)

// createAgents stores agents named clients/{client}/agents/{id}, one per
// "client/id" pair, and returns their names.
func createAgents(t *testing.T, s store.Store, pairs ...[2]string) []string {
	t.Helper()
	var names []string
	for _, p := range pairs {
		a := agent(p[0], p[1])
		if _, err := s.CreateAgent(t.Context(), a, nil, ""); err != nil {
			t.Fatalf("CreateAgent(%s): %v", a.GetName(), err)
		}
		names = append(names, a.GetName())
	}
	return names
}

// collect pages through list two at a time and returns every name.
func collect(t *testing.T, list func(opts store.ListOptions) ([]string, error)) []string {
	t.Helper()
	var out []string
	after := ""
	for {
		page, err := list(store.ListOptions{After: after, Limit: 2})
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			return out
		}
		out = append(out, page...)
		after = page[len(page)-1]
	}
}

func testFollows(t *testing.T, s store.Store) {
	ctx := t.Context()
	n := createAgents(t, s, [2]string{"acme", "a"}, [2]string{"acme", "b"}, [2]string{"beta", "c"}, [2]string{"beta", "d"}, [2]string{"acme", "ab"})
	a, b, c, d, ab := n[0], n[1], n[2], n[3], n[4]
	for _, f := range []string{d, b, c, ab} {
		if created, err := s.Follow(ctx, f, a); err != nil || !created {
			t.Fatalf("Follow(%s, %s) = %v, %v; want created", f, a, created, err)
		}
	}
	if created, err := s.Follow(ctx, b, a); err != nil || created {
		t.Errorf("Follow(repeat) = %v, %v; want not created, no error", created, err)
	}
	if _, err := s.Follow(ctx, b, c); err != nil {
		t.Fatal(err)
	}
	followers := collect(t, func(o store.ListOptions) ([]string, error) { return s.ListFollowers(ctx, a, o) })
	if want := []string{ab, b, c, d}; !slices.Equal(followers, want) {
		t.Errorf("ListFollowers(%s) = %v, want %v", a, followers, want)
	}
	following := collect(t, func(o store.ListOptions) ([]string, error) { return s.ListFollowing(ctx, b, o) })
	if want := []string{a, c}; !slices.Equal(following, want) {
		t.Errorf("ListFollowing(%s) = %v, want %v", b, following, want)
	}
	if ok, err := s.IsFollowing(ctx, b, a); err != nil || !ok {
		t.Errorf("IsFollowing(%s, %s) = %v, %v; want true", b, a, ok, err)
	}
	if ok, _ := s.IsFollowing(ctx, a, b); ok {
		t.Errorf("IsFollowing(%s, %s) = true; a follow is one way", a, b)
	}
	if err := s.Unfollow(ctx, b, a); err != nil {
		t.Fatal(err)
	}
	if err := s.Unfollow(ctx, b, a); err != nil {
		t.Errorf("Unfollow(repeat) error = %v, want none", err)
	}
	if ok, _ := s.IsFollowing(ctx, b, a); ok {
		t.Errorf("IsFollowing after Unfollow = true")
	}
	if got, _ := s.ListFollowers(ctx, a, store.ListOptions{Limit: 10}); !slices.Equal(got, []string{ab, c, d}) {
		t.Errorf("ListFollowers after Unfollow = %v", got)
	}
}

func testFollowMissing(t *testing.T, s store.Store) {
	ctx := t.Context()
	a := createAgents(t, s, [2]string{"acme", "a"})[0]
	missing := "clients/acme/agents/zz"
	for _, pair := range [][2]string{{a, missing}, {missing, a}} {
		if _, err := s.Follow(ctx, pair[0], pair[1]); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("Follow(%s, %s) error = %v, want ErrNotFound", pair[0], pair[1], err)
		}
	}
	if err := s.Unfollow(ctx, missing, a); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Unfollow(missing follower) error = %v, want ErrNotFound", err)
	}
	if got, _ := s.ListFollowing(ctx, a, store.ListOptions{Limit: 10}); len(got) != 0 {
		t.Errorf("ListFollowing after refused follows = %v, want none: a refusal writes nothing", got)
	}
	if got, _ := s.ListFollowers(ctx, a, store.ListOptions{Limit: 10}); len(got) != 0 {
		t.Errorf("ListFollowers after refused follows = %v, want none", got)
	}
}

func testClientGroups(t *testing.T, s store.Store) {
	ctx := t.Context()
	n := createAgents(t, s, [2]string{"acme", "x"}, [2]string{"acme", "b"}, [2]string{"acme", "c"}, [2]string{"acme", "a"}, [2]string{"acmeb", "a"}, [2]string{"beta", "a"})
	for _, m := range n {
		if err := s.JoinClientGroup(ctx, m); err != nil {
			t.Fatalf("JoinClientGroup(%s): %v", m, err)
		}
	}
	if err := s.JoinClientGroup(ctx, n[0]); err != nil {
		t.Errorf("JoinClientGroup(repeat) error = %v", err)
	}
	if err := s.LeaveClientGroup(ctx, n[0]); err != nil {
		t.Fatal(err)
	}
	if err := s.LeaveClientGroup(ctx, n[0]); err != nil {
		t.Errorf("LeaveClientGroup(not a member) error = %v", err)
	}
	got := collect(t, func(o store.ListOptions) ([]string, error) { return s.ListClientGroupMembers(ctx, "clients/acme", o) })
	if want := []string{"clients/acme/agents/a", "clients/acme/agents/b", "clients/acme/agents/c"}; !slices.Equal(got, want) {
		t.Errorf("ListClientGroupMembers(clients/acme) = %v, want %v", got, want)
	}
	if ok, _ := s.InClientGroup(ctx, n[0]); ok {
		t.Errorf("InClientGroup(%s) after leaving = true", n[0])
	}
	if ok, _ := s.InClientGroup(ctx, n[1]); !ok {
		t.Errorf("InClientGroup(%s) = false, want true", n[1])
	}
	missing := "clients/acme/agents/zz"
	if err := s.JoinClientGroup(ctx, missing); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("JoinClientGroup(missing) error = %v, want ErrNotFound", err)
	}
	if ok, _ := s.InClientGroup(ctx, missing); ok {
		t.Errorf("InClientGroup(missing) = true after a refused join")
	}
}

func testConnectionsGoWithTheirAgent(t *testing.T, s store.Store) {
	ctx := t.Context()
	n := createAgents(t, s, [2]string{"acme", "a"}, [2]string{"acme", "b"})
	a, b := n[0], n[1]
	for _, p := range [][2]string{{a, b}, {b, a}} {
		if _, err := s.Follow(ctx, p[0], p[1]); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.JoinClientGroup(ctx, a); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteAgent(ctx, a); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.ListFollowers(ctx, b, store.ListOptions{Limit: 10}); len(got) != 0 {
		t.Errorf("ListFollowers(%s) after deleting its follower = %v, want none", b, got)
	}
	if got, _ := s.ListFollowing(ctx, b, store.ListOptions{Limit: 10}); len(got) != 0 {
		t.Errorf("ListFollowing(%s) after deleting the followed = %v, want none", b, got)
	}
	createAgents(t, s, [2]string{"acme", "a"})
	if ok, _ := s.IsFollowing(ctx, a, b); ok {
		t.Errorf("IsFollowing(recreated %s, %s) = true, want false", a, b)
	}
	if ok, _ := s.InClientGroup(ctx, a); ok {
		t.Errorf("InClientGroup(recreated %s) = true, want false", a)
	}
}
