package auth

import "testing"

// The gateway fills a request field from the query string only when the
// body does not: so ownership may be read from the query only then.
func TestGatewayRoute_queryFills(t *testing.T) {
	for _, tt := range []struct {
		body, field string
		want        bool
	}{
		{"", "agent", true},
		{"*", "agent", false},
		{"task", "task", false},
		{"task", "task.agent", false},
		{"task", "agent", true},
		{"task", "tasks.agent", true}, // a sibling that only shares a prefix
	} {
		if got := (gatewayRoute{method: "/m", body: tt.body}).queryFills(tt.field); got != tt.want {
			t.Errorf("gatewayRoute{body: %q}.queryFills(%q) = %v, want %v", tt.body, tt.field, got, tt.want)
		}
	}
}
