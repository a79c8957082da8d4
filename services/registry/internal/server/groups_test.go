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
