package groups

import (
	"regexp"
	"strings"
	"testing"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
)

var clientID = regexp.MustCompile(`^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$`).MatchString

func TestCheckPath(t *testing.T) {
	tests := []struct {
		path string
		ok   bool
	}{
		{"acme/travel", true},
		{"acme/Travel/Hotel Deals", true},
		{"acme", false},
		{"", false},
		{"acme/", false},
		{"acme//hotel", false},
		{"acme/travel/", false},
		{"Acme/travel", false},
		{"acme/a~>b", false},
		{"acme/tab\there", false},
		{"acme/" + strings.Repeat("x", 64), false},
		{"acme/a/b/c/d/e/f/g/h", true},
		{"acme/a/b/c/d/e/f/g/h/i", false},
	}
	for _, tt := range tests {
		if why := CheckPath(tt.path, clientID); (why == "") != tt.ok {
			t.Errorf("CheckPath(%q) = %q, want ok %v", tt.path, why, tt.ok)
		}
	}
}

func TestParent(t *testing.T) {
	for path, want := range map[string]string{"acme/a": "", "acme/a/b": "acme/a", "acme/a/b/c": "acme/a/b"} {
		if got := Parent(path); got != want {
			t.Errorf("Parent(%q) = %q, want %q", path, got, want)
		}
	}
}

func TestRegionsMatch(t *testing.T) {
	r := func(c, s, city string) *registryv1.Region {
		return &registryv1.Region{Country: c, State: s, City: city}
	}
	tests := []struct {
		name       string
		want, have []*registryv1.Region
		match      bool
	}{
		{"no regions either side", nil, nil, true},
		{"list has none", nil, []*registryv1.Region{r("FR", "", "")}, true},
		{"member has none", []*registryv1.Region{r("FR", "", "")}, nil, true},
		{"country differs", []*registryv1.Region{r("FR", "", "")}, []*registryv1.Region{r("US", "", "")}, false},
		{"country equal, case ignored", []*registryv1.Region{r("fr", "", "")}, []*registryv1.Region{r("FR", "IDF", "Paris")}, true},
		{"state differs", []*registryv1.Region{r("US", "CA", "")}, []*registryv1.Region{r("US", "NY", "")}, false},
		{"missing state is a wildcard", []*registryv1.Region{r("US", "CA", "LA")}, []*registryv1.Region{r("US", "", "")}, true},
		{"city differs", []*registryv1.Region{r("FR", "IDF", "Paris")}, []*registryv1.Region{r("FR", "IDF", "Versailles")}, false},
		{"any pair matches", []*registryv1.Region{r("DE", "", ""), r("FR", "", "")}, []*registryv1.Region{r("US", "", ""), r("FR", "ARA", "Lyon")}, true},
	}
	for _, tt := range tests {
		if got := RegionsMatch(tt.want, tt.have); got != tt.match {
			t.Errorf("%s: RegionsMatch = %v, want %v", tt.name, got, tt.match)
		}
	}
}
