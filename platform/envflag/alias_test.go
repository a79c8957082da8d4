package envflag

import (
	"bytes"
	"strings"
	"testing"
)

// TestAlias_oldSpellingStillWorks proves a deprecated alias sets its
// flag, from the command line and from its own variable, and that the
// command line beats the environment whichever spelling each uses.
func TestAlias_oldSpellingStillWorks(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"new spelling", []string{"--grpc-addr", "new:1"}, nil, "new:1"},
		{"old spelling", []string{"--grpc", "old:1"}, nil, "old:1"},
		{"old spelling beats the new variable", []string{"--grpc", "old:1"}, map[string]string{"P_GRPC_ADDR": "env:1"}, "old:1"},
		{"new spelling beats the old variable", []string{"--grpc-addr", "new:1"}, map[string]string{"P_GRPC": "env:2"}, "new:1"},
		{"old variable", nil, map[string]string{"P_GRPC": "env:2"}, "env:2"},
		{"new variable beats the old one", nil, map[string]string{"P_GRPC": "env:2", "P_GRPC_ADDR": "env:1"}, "env:1"},
		{"default", nil, nil, ":9090"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs, addr, _, _ := newSet()
			Alias(fs, "grpc", "grpc-addr")
			if err := Parse(fs, tt.args, "P_", func(k string) string { return tt.env[k] }); err != nil {
				t.Fatalf("Parse(%q) = %v", tt.args, err)
			}
			if *addr != tt.want {
				t.Errorf("Parse(%q, env %v): grpc-addr = %q, want %q", tt.args, tt.env, *addr, tt.want)
			}
		})
	}
}

func TestAlias_helpSaysDeprecated(t *testing.T) {
	fs, _, _, _ := newSet()
	Alias(fs, "grpc", "grpc-addr")
	var buf bytes.Buffer
	Doc{Prefix: "P_"}.Print(&buf, fs)
	if !strings.Contains(buf.String(), "--grpc\n    \tdeprecated: use --grpc-addr\n") {
		t.Errorf("help = %s\nwant --grpc marked deprecated, without default or variable", buf.String())
	}
}
