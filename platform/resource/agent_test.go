package resource_test

import (
	"strings"
	"testing"

	"github.com/parleyhq/parley/platform/resource"
)

// TestValidAgentName is the one agent-name rule every service applies.
func TestValidAgentName(t *testing.T) {
	tests := []struct {
		name string
		want bool
	}{
		{"clients/acme/agents/weather", true},
		{"clients/a/agents/b", true},
		{"clients/acme/agents/w-1", true},
		{"clients/acme-2/agents/w2d2", true},
		{"clients/acme/agents/" + strings.Repeat("a", 63), true},
		{"clients/acme/agents/" + strings.Repeat("a", 64), false},
		{"clients/acme/agents/1w", false},      // digit first
		{"clients/acme/agents/w-", false},      // trailing hyphen
		{"clients/-acme/agents/w", false},      // hyphen first
		{"clients/Acme/agents/weather", false}, // upper case
		{"clients/acme/agents/we_ather", false},
		{"clients/acme/agents/", false},
		{"clients//agents/w", false},
		{"clients/acme/agent/weather", false},
		{"clients/acme/agents/w/x", false},
		{"clients/acme:x/agents/w", false},
		{"acme/agents/w", false},
		{"", false},
	}
	for _, tt := range tests {
		if got := resource.ValidAgentName(tt.name); got != tt.want {
			t.Errorf("ValidAgentName(%q) = %v, want %v", tt.name, got, tt.want)
		}
	}
}
