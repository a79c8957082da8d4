package storetest

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/services/registry/internal/store"
)

func group(path string, access registryv1.GroupAccess) *registryv1.Group {
	return &registryv1.Group{Path: path, Access: access, Category: registryv1.GroupCategory_GROUP_CATEGORY_MESSAGE, Description: "about " + path}
}

func member(path, agent string, t registryv1.MemberType) *registryv1.GroupMember {
	return &registryv1.GroupMember{Group: path, Agent: agent, MemberType: t}
}

// update runs fn in UpdateGroups and fails the test on an error.
func update(t *testing.T, s store.Store, fn func(store.GroupWriter) error) {
	t.Helper()
	if err := s.UpdateGroups(t.Context(), fn); err != nil {
		t.Fatalf("UpdateGroups: %v", err)
	}
}

func view(t *testing.T, s store.Store, fn func(store.GroupReader) error) {
	t.Helper()
	if err := s.ViewGroups(t.Context(), fn); err != nil {
		t.Fatalf("ViewGroups: %v", err)
	}
}

func paths(gs []*registryv1.Group) []string {
	var out []string
	for _, g := range gs {
		out = append(out, g.GetPath())
	}
	return out
}

func memberAgents(ms []*registryv1.GroupMember) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.GetAgent())
	}
	return out
}

func testGroupsTree(t *testing.T, s store.Store) {
	open := registryv1.GroupAccess_GROUP_ACCESS_OPEN_PUBLIC
	update(t, s, func(w store.GroupWriter) error {
		for _, p := range []string{"acme/travel", "acme/travel/hotel", "acme/travel/hotel/resort", "acme/travel/flight", "acme/travelling", "acme/trave"} {
			if err := w.PutGroup(group(p, open)); err != nil {
				return err
			}
		}
		return nil
	})
	view(t, s, func(r store.GroupReader) error {
		g, err := r.Group("acme/travel/hotel")
		if err != nil || g.GetDescription() != "about acme/travel/hotel" {
			t.Errorf("Group(acme/travel/hotel) = %v, %v", g, err)
		}
		if _, err := r.Group("acme/none"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("Group(missing) error = %v, want ErrNotFound", err)
		}
		d, err := r.Descendants("acme/travel")
		if want := []string{"acme/travel/flight", "acme/travel/hotel", "acme/travel/hotel/resort"}; err != nil || !slices.Equal(paths(d), want) {
			t.Errorf("Descendants(acme/travel) = %v, %v; want %v (not acme/travelling)", paths(d), err, want)
		}
		return nil
	})
}

func testGroupMembers(t *testing.T, s store.Store) {
	n := createAgents(t, s, [2]string{"acme", "a"}, [2]string{"beta", "b"}, [2]string{"beta", "c"})
	a, b, c := n[0], n[1], n[2]
	admin, plain := registryv1.MemberType_MEMBER_TYPE_ADMIN, registryv1.MemberType_MEMBER_TYPE_MEMBER
	update(t, s, func(w store.GroupWriter) error {
		for _, p := range []string{"acme/x", "acme/x/y"} {
			if err := w.PutGroup(group(p, registryv1.GroupAccess_GROUP_ACCESS_OPEN_PUBLIC)); err != nil {
				return err
			}
		}
		for _, m := range []*registryv1.GroupMember{member("acme/x", c, plain), member("acme/x", a, admin), member("acme/x", b, plain), member("acme/x/y", b, admin)} {
			if err := w.PutMember(m); err != nil {
				return err
			}
		}
		return nil
	})
	view(t, s, func(r store.GroupReader) error {
		all := collect(t, func(o store.ListOptions) ([]string, error) {
			ms, err := r.Members("acme/x", o)
			return memberAgents(ms), err
		})
		if want := []string{a, b, c}; !slices.Equal(all, want) {
			t.Errorf("Members(acme/x) paged = %v, want %v (not acme/x/y's)", all, want)
		}
		var each []string
		if err := r.EachMember("acme/x/y", func(m *registryv1.GroupMember) error { each = append(each, m.GetAgent()); return nil }); err != nil || !slices.Equal(each, []string{b}) {
			t.Errorf("EachMember(acme/x/y) = %v, %v; want [%s]", each, err, b)
		}
		mine, err := r.AgentGroups(b, store.ListOptions{Limit: 10})
		if err != nil || len(mine) != 2 || mine[0].GetGroup() != "acme/x" || mine[1].GetMemberType() != admin {
			t.Errorf("AgentGroups(b) = %v, %v; want acme/x member, acme/x/y admin", mine, err)
		}
		return nil
	})
	update(t, s, func(w store.GroupWriter) error { return w.DeleteMember("acme/x", b) })
	view(t, s, func(r store.GroupReader) error {
		if _, err := r.Member("acme/x", b); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("Member(after delete) error = %v, want ErrNotFound", err)
		}
		if mine, _ := r.AgentGroups(b, store.ListOptions{Limit: 10}); len(mine) != 1 {
			t.Errorf("AgentGroups(b) after leaving acme/x = %v, want acme/x/y only", mine)
		}
		return nil
	})
}

func testGroupRequestsAndInvites(t *testing.T, s store.Store) {
	n := createAgents(t, s, [2]string{"acme", "a"}, [2]string{"beta", "b"})
	a, b := n[0], n[1]
	update(t, s, func(w store.GroupWriter) error {
		if err := w.PutJoinRequest(&registryv1.GroupJoinRequest{Group: "acme/x", Agent: b}); err != nil {
			return err
		}
		if err := w.PutJoinRequest(&registryv1.GroupJoinRequest{Group: "acme/x", Agent: a}); err != nil {
			return err
		}
		return w.PutInvite(&registryv1.GroupInvite{Group: "acme/x", Agent: b, Inviter: a, Conditions: "a fee"})
	})
	view(t, s, func(r store.GroupReader) error {
		reqs, err := r.JoinRequests("acme/x", 10)
		if err != nil || len(reqs) != 2 || reqs[0].GetAgent() != a {
			t.Errorf("JoinRequests = %v, %v; want a's then b's", reqs, err)
		}
		inv, err := r.Invite("acme/x", b)
		if err != nil || inv.GetConditions() != "a fee" {
			t.Errorf("Invite(acme/x, b) = %v, %v", inv, err)
		}
		if invs, _ := r.Invites(b, 10); len(invs) != 1 {
			t.Errorf("Invites(b) = %v, want one", invs)
		}
		return nil
	})
	update(t, s, func(w store.GroupWriter) error {
		if err := w.DeleteInvite("acme/x", b); err != nil {
			return err
		}
		return w.DeleteJoinRequest("acme/x", b)
	})
	view(t, s, func(r store.GroupReader) error {
		if _, err := r.Invite("acme/x", b); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("Invite(after delete) error = %v, want ErrNotFound", err)
		}
		if _, err := r.JoinRequest("acme/x", b); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("JoinRequest(after delete) error = %v, want ErrNotFound", err)
		}
		return nil
	})
}

// testGroupUpdateFailureWritesNothing: a failing function leaves no
// group, member or notification behind.
func testGroupUpdateFailureWritesNothing(t *testing.T, s store.Store) {
	n := createAgents(t, s, [2]string{"acme", "a"})
	boom := errors.New("refused")
	err := s.UpdateGroups(t.Context(), func(w store.GroupWriter) error {
		if err := w.PutGroup(group("acme/x", registryv1.GroupAccess_GROUP_ACCESS_OPEN_PUBLIC)); err != nil {
			return err
		}
		if err := w.PutMember(member("acme/x", n[0], registryv1.MemberType_MEMBER_TYPE_ADMIN)); err != nil {
			return err
		}
		if err := w.Notify(&registryv1.Notification{Type: "invite_to_group", Recipient: n[0]}); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("UpdateGroups(failing) error = %v, want the function's", err)
	}
	view(t, s, func(r store.GroupReader) error {
		if _, err := r.Group("acme/x"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("Group after a failed update: %v, want ErrNotFound", err)
		}
		if ms, _ := r.AgentGroups(n[0], store.ListOptions{Limit: 10}); len(ms) != 0 {
			t.Errorf("AgentGroups after a failed update = %v, want none", ms)
		}
		return nil
	})
	if notes, _, err := s.ListNotifications(t.Context(), 0, 10); err != nil || len(notes) != 0 {
		t.Errorf("ListNotifications after a failed update = %v, %v; want none", notes, err)
	}
}

func testSearchGroups(t *testing.T, s store.Store) {
	update(t, s, func(w store.GroupWriter) error {
		for _, g := range []*registryv1.Group{
			group("acme/hotels", registryv1.GroupAccess_GROUP_ACCESS_OPEN_PUBLIC),
			group("acme/secret-hotels", registryv1.GroupAccess_GROUP_ACCESS_RESTRICTED_PRIVATE),
			{Path: "beta/rooms", Access: registryv1.GroupAccess_GROUP_ACCESS_RESTRICTED_PUBLIC, AgentDescription: "Book a HOTEL room"},
			{Path: "beta/cars", Access: registryv1.GroupAccess_GROUP_ACCESS_OPEN_PUBLIC, DisplayName: "Cars"},
		} {
			if err := w.PutGroup(g); err != nil {
				return err
			}
		}
		return nil
	})
	var got []string
	after := ""
	for {
		page, err := s.SearchGroups(t.Context(), store.ListOptions{Query: "hotel", After: after, Limit: 1})
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		got = append(got, paths(page)...)
		after = page[len(page)-1].GetPath()
	}
	if want := []string{"acme/hotels", "beta/rooms"}; !slices.Equal(got, want) {
		t.Errorf("SearchGroups(hotel) paged = %v, want %v (never the private group)", got, want)
	}
}

func testNotificationOutbox(t *testing.T, s store.Store) {
	ctx := t.Context()
	n := createAgents(t, s, [2]string{"acme", "a"}, [2]string{"beta", "b"})
	a, b := n[0], n[1]
	if _, err := s.Follow(ctx, b, a); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Follow(ctx, b, a); err != nil { // a repeat notifies nobody
		t.Fatal(err)
	}
	if err := s.Unfollow(ctx, b, a); err != nil {
		t.Fatal(err)
	}
	if err := s.Unfollow(ctx, b, a); err != nil { // nor does unfollowing again
		t.Fatal(err)
	}
	update(t, s, func(w store.GroupWriter) error {
		return w.Notify(&registryv1.Notification{Type: "removed_from_group", Recipient: b, Agent: a, Group: "acme/x"})
	})
	notes, first, err := s.ListNotifications(ctx, 0, 10)
	if err != nil || len(notes) != 3 || first != notes[0].GetSequence() {
		t.Fatalf("ListNotifications(0) = %v, first %d, %v; want 3 starting at first", notes, first, err)
	}
	wantTypes := []string{"followed", "unfollowed", "removed_from_group"}
	for i, nt := range notes {
		if nt.GetType() != wantTypes[i] || nt.GetId() == "" || nt.GetCreateTime() == nil || (i > 0 && nt.GetSequence() <= notes[i-1].GetSequence()) {
			t.Errorf("notification %d = %v, want type %s, an id, a time and a rising sequence", i, nt, wantTypes[i])
		}
	}
	if notes[0].GetRecipient() != a || notes[0].GetAgent() != b {
		t.Errorf("followed notification = %v, want to %s about %s", notes[0], a, b)
	}
	rest, _, err := s.ListNotifications(ctx, notes[0].GetSequence(), 10)
	if err != nil || len(rest) != 2 || rest[0].GetId() != notes[1].GetId() {
		t.Errorf("ListNotifications(after the first) = %v, %v; want the last two", rest, err)
	}
	if n, err := s.TrimNotifications(ctx, notes[1].GetSequence(), 10); err != nil || n != 2 {
		t.Fatalf("TrimNotifications(through the second) = %d, %v; want 2", n, err)
	}
	kept, first, err := s.ListNotifications(ctx, 0, 10)
	if err != nil || len(kept) != 1 || kept[0].GetId() != notes[2].GetId() || first != notes[2].GetSequence() {
		t.Errorf("ListNotifications after trimming two = %v, first %d, %v; want the third", kept, first, err)
	}
}

// testNotificationTrimBatches trims more notifications than one call may
// drop: each call drops at most its limit, the oldest first, and the calls
// together drop exactly those through the sequence given.
func testNotificationTrimBatches(t *testing.T, s store.Store) {
	ctx := t.Context()
	const due = 7
	update(t, s, func(w store.GroupWriter) error {
		for i := range due + 1 {
			if err := w.Notify(&registryv1.Notification{Type: "removed_from_group", Recipient: "clients/acme/agents/a", Group: fmt.Sprint("acme/g", i)}); err != nil {
				return err
			}
		}
		return nil
	})
	notes, _, err := s.ListNotifications(ctx, 0, 10)
	if err != nil || len(notes) != due+1 {
		t.Fatalf("ListNotifications(0) = %d notifications, %v; want %d", len(notes), err, due+1)
	}
	through := notes[due-1].GetSequence()
	dropOldestFirst(t, "TrimNotifications", due, func(limit int) (int, error) { return s.TrimNotifications(ctx, through, limit) }, func(i int) bool {
		_, first, err := s.ListNotifications(ctx, 0, 1)
		if err != nil {
			t.Fatal(err)
		}
		return notes[i].GetSequence() < first
	}, func(i int) string { return fmt.Sprintf("notification #%d", i) })
	if kept, _, err := s.ListNotifications(ctx, 0, 10); err != nil || len(kept) != 1 || kept[0].GetId() != notes[due].GetId() {
		t.Errorf("ListNotifications after the trims = %v, %v; want only the last", kept, err)
	}
}

func testGroupRecordsGoWithTheirAgent(t *testing.T, s store.Store) {
	n := createAgents(t, s, [2]string{"acme", "a"}, [2]string{"beta", "b"})
	a, b := n[0], n[1]
	update(t, s, func(w store.GroupWriter) error {
		for _, err := range []error{
			w.PutGroup(group("acme/x", registryv1.GroupAccess_GROUP_ACCESS_OPEN_PUBLIC)),
			w.PutMember(member("acme/x", a, registryv1.MemberType_MEMBER_TYPE_ADMIN)),
			w.PutMember(member("acme/x", b, registryv1.MemberType_MEMBER_TYPE_MEMBER)),
			w.PutJoinRequest(&registryv1.GroupJoinRequest{Group: "acme/y", Agent: b}),
			w.PutInvite(&registryv1.GroupInvite{Group: "acme/z", Agent: b}),
		} {
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err := s.DeleteAgent(t.Context(), b); err != nil {
		t.Fatal(err)
	}
	view(t, s, func(r store.GroupReader) error {
		if ms, _ := r.Members("acme/x", store.ListOptions{Limit: 10}); !slices.Equal(memberAgents(ms), []string{a}) {
			t.Errorf("Members(acme/x) after deleting b = %v, want [%s]", memberAgents(ms), a)
		}
		if _, err := r.JoinRequest("acme/y", b); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("JoinRequest of a deleted agent: %v, want ErrNotFound", err)
		}
		if _, err := r.Invite("acme/z", b); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("Invite of a deleted agent: %v, want ErrNotFound", err)
		}
		return nil
	})
}

// OutboxLimit checks that an outbox limited to 3 (set by setLimit, a
// backend's test seam) keeps only the newest notifications, in order.
func OutboxLimit(t *testing.T, s store.Store, setLimit func(int)) {
	t.Helper()
	setLimit(3)
	for range 7 {
		if err := s.UpdateGroups(t.Context(), func(w store.GroupWriter) error {
			return w.Notify(&registryv1.Notification{Type: "followed"})
		}); err != nil {
			t.Fatal(err)
		}
	}
	notes, first, err := s.ListNotifications(t.Context(), 0, 10)
	if err != nil || len(notes) != 3 || first != 5 || notes[0].GetSequence() != 5 || notes[2].GetSequence() != 7 {
		t.Errorf("ListNotifications after 7 appends with limit 3 = %v, first %d, %v; want sequences 5 to 7", notes, first, err)
	}
}
