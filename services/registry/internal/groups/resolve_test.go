package groups_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/services/registry/internal/groups"
	"github.com/parleyhq/parley/services/registry/internal/store"
	"github.com/parleyhq/parley/services/registry/internal/store/boltstore"
)

// BenchmarkResolve measures resolving a distribution list that reaches
// every member of an open_public group (local scope from its root, half
// the members in a sub-group, all with a region the list filters on)
// against the reference measured in the same run: walking and decoding the
// same membership records in one read transaction, which is the least any
// resolution must do. Run:
//
//	go test -run '^$' -bench Resolve -benchtime 20x ./internal/groups/
func BenchmarkResolve(b *testing.B) {
	for _, n := range []int{1000, 10000, 100000} {
		s := fill(b, n)
		b.Run(fmt.Sprintf("walk/members=%d", n), func(b *testing.B) {
			for b.Loop() {
				count := 0
				err := s.ViewGroups(b.Context(), func(r store.GroupReader) error {
					for _, p := range []string{"acme/travel", "acme/travel/hotels"} {
						if err := r.EachMember(p, func(*registryv1.GroupMember) error { count++; return nil }); err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil || count != n+1 {
					b.Fatalf("walk = %d, %v; want %d", count, err, n+1)
				}
			}
		})
		b.Run(fmt.Sprintf("resolve/members=%d", n), func(b *testing.B) {
			list := groups.List{
				Sender:  "clients/acme/agents/admin",
				Groups:  []*registryv1.GroupTarget{{Group: "acme/travel", Scope: registryv1.GroupScope_GROUP_SCOPE_LOCAL}},
				Regions: []*registryv1.Region{{Country: "FR"}},
			}
			for b.Loop() {
				var resp *registryv1.ResolveRecipientsResponse
				err := s.ViewGroups(b.Context(), func(r store.GroupReader) error {
					var err error
					resp, err = groups.Resolve(b.Context(), r, list)
					return err
				})
				if err != nil || len(resp.GetRecipients()) != n {
					b.Fatalf("Resolve = %d recipients, %v; want %d", len(resp.GetRecipients()), err, n)
				}
			}
		})
	}
}

// fill stores acme/travel and acme/travel/hotels with n members split
// between them (the admin is in both), in one transaction.
func fill(b testing.TB, n int) *boltstore.Store {
	b.Helper()
	s, err := boltstore.Open(b.TempDir(), time.Second)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	open := registryv1.GroupAccess_GROUP_ACCESS_OPEN_PUBLIC
	err = s.UpdateGroups(b.Context(), func(w store.GroupWriter) error {
		for _, p := range []string{"acme/travel", "acme/travel/hotels"} {
			if err := w.PutGroup(&registryv1.Group{Path: p, Access: open, Category: registryv1.GroupCategory_GROUP_CATEGORY_MESSAGE}); err != nil {
				return err
			}
		}
		if err := w.PutMember(&registryv1.GroupMember{Group: "acme/travel", Agent: "clients/acme/agents/admin", MemberType: registryv1.MemberType_MEMBER_TYPE_ADMIN}); err != nil {
			return err
		}
		for i := range n {
			path := []string{"acme/travel", "acme/travel/hotels"}[i%2]
			m := &registryv1.GroupMember{Group: path, Agent: fmt.Sprintf("clients/c%d/agents/a%d", i%50, i), MemberType: registryv1.MemberType_MEMBER_TYPE_MEMBER,
				Regions: []*registryv1.Region{{Country: "FR", State: "IDF", City: "Paris"}}}
			if err := w.PutMember(m); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	return s
}

// TestResolve_stopsWhenTheContextEnds: a canceled call resolves nothing.
func TestResolve_stopsWhenTheContextEnds(t *testing.T) {
	s := fill(t, 3000)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	err := s.ViewGroups(t.Context(), func(r store.GroupReader) error {
		_, err := groups.Resolve(ctx, r, groups.List{Sender: "clients/acme/agents/admin", Groups: []*registryv1.GroupTarget{{Group: "acme/travel", Scope: registryv1.GroupScope_GROUP_SCOPE_LOCAL}}})
		return err
	})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Resolve(canceled) error = %v, want context.Canceled", err)
	}
}
