package server

import (
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/platform/resource"
)

// TestList_paginates walks ListTools and ListSendCounts page by page
// (AIP-158): every item exactly once, in order, and bad tokens and sizes
// are INVALID_ARGUMENT.
func TestList_paginates(t *testing.T) {
	e := startWeather(t, 0, Options{})
	const n = 7
	for i := range n {
		e.setTable(weatherAgent, fmt.Sprintf("t%02d", i), `{}`)
		if err := e.srv.store.CountSend(t.Context(), weatherAgent, fmt.Sprintf("task%02d", i), "https://x.example/a", false); err != nil {
			t.Fatal(err)
		}
	}
	lists := map[string]func(size int32, token string) ([]string, string, error){
		"ListTools": func(size int32, token string) ([]string, string, error) {
			r, err := e.client.ListTools(t.Context(), &dispatcherv1.ListToolsRequest{Parent: weatherAgent, PageSize: size, PageToken: token})
			var names []string
			for _, x := range r.GetTools() {
				names = append(names, resource.ID(x.GetName()))
			}
			return names, r.GetNextPageToken(), err
		},
		"ListSendCounts": func(size int32, token string) ([]string, string, error) {
			r, err := e.client.ListSendCounts(t.Context(), &dispatcherv1.ListSendCountsRequest{Parent: weatherAgent, PageSize: size, PageToken: token})
			var names []string
			for _, x := range r.GetCounts() {
				names = append(names, x.GetTask())
			}
			return names, r.GetNextPageToken(), err
		},
	}
	for name, list := range lists {
		t.Run(name, func(t *testing.T) {
			all, next, err := list(0, "")
			if err != nil || next != "" || len(all) < n {
				t.Fatalf("page_size 0 = %v, %q, %v; want everything (%d+) on one page", all, next, err, n)
			}
			var got []string
			token := ""
			for pages := 0; ; pages++ {
				page, next, err := list(3, token)
				if err != nil || len(page) > 3 || pages > len(all) {
					t.Fatalf("page %d = %v, %v; want at most 3 items", pages, page, err)
				}
				got = append(got, page...)
				if next == "" {
					break
				}
				token = next
			}
			if fmt.Sprint(got) != fmt.Sprint(all) {
				t.Errorf("pages = %v, want %v", got, all)
			}
			for _, bad := range []struct {
				size  int32
				token string
			}{{-1, ""}, {0, "garbage!"}, {0, "AQAAAAAAAAAAAA"}} {
				if _, _, err := list(bad.size, bad.token); status.Code(err) != codes.InvalidArgument {
					t.Errorf("list(%d, %q) = %v, want INVALID_ARGUMENT", bad.size, bad.token, err)
				}
			}
		})
	}
}
