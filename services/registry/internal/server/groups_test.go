package server

import (
	"fmt"
	"testing"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/services/registry/internal/store"
)

// TestSearchGroups_stopsAt350Results pages a search over 400 matching
// groups: 350 come back in all, then the list ends.
func TestSearchGroups_stopsAt350Results(t *testing.T) {
	s := newKeyServer(t, Options{})
	err := s.store.UpdateGroups(t.Context(), func(w store.GroupWriter) error {
		for i := range 400 {
			g := &registryv1.Group{Path: fmt.Sprintf("acme/g%03d", i), Access: registryv1.GroupAccess_GROUP_ACCESS_OPEN_PUBLIC, Description: "Hotels"}
			if err := w.PutGroup(g); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	total, pages, token := 0, 0, ""
	for {
		resp, err := s.SearchGroups(asOperator(t.Context()), &registryv1.SearchGroupsRequest{Query: "hotel", PageSize: 100, PageToken: token})
		if err != nil {
			t.Fatalf("SearchGroups(page %d): %v", pages+1, err)
		}
		total += len(resp.GetGroups())
		pages++
		if token = resp.GetNextPageToken(); token == "" || pages > 10 {
			break
		}
	}
	if total != 350 || pages != 4 {
		t.Errorf("SearchGroups over 400 matches returned %d groups in %d pages, want 350 in 4", total, pages)
	}
}

// TestListNotifications_trimsAMoreThanOneBatchBacklog trims through more
// notifications than one trim transaction drops: all of them go, so the
// oldest kept is the one after trim_through.
func TestListNotifications_trimsAMoreThanOneBatchBacklog(t *testing.T) {
	s := newKeyServer(t, Options{})
	const backlog = 2*notificationsTrimBatch + 1
	err := s.store.UpdateGroups(t.Context(), func(w store.GroupWriter) error {
		for i := range backlog + 1 {
			if err := w.Notify(&registryv1.Notification{Type: "removed_from_group", Recipient: "clients/acme/agents/a", Group: fmt.Sprint("acme/g", i)}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	first, _, err := s.store.ListNotifications(t.Context(), 0, 1)
	if err != nil || len(first) != 1 {
		t.Fatalf("ListNotifications(0, 1) = %v, %v", first, err)
	}
	through := first[0].GetSequence() + backlog - 1
	resp, err := s.ListNotifications(asOperator(t.Context()), &registryv1.ListNotificationsRequest{After: through, TrimThrough: through})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetFirstSequence() != through+1 || len(resp.GetNotifications()) != 1 {
		t.Errorf("ListNotifications(trim through the backlog) = first sequence %d, %d notifications; want %d, 1",
			resp.GetFirstSequence(), len(resp.GetNotifications()), through+1)
	}
}
