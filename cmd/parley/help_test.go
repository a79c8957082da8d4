package main

import (
	"bytes"
	"maps"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// commandPaths lists every runnable command, groups expanded:
// "agent get", "serve", ...
func commandPaths() []string {
	var paths []string
	for _, name := range slices.Sorted(maps.Keys(commands())) {
		subs := groups()[name]
		if subs == nil {
			paths = append(paths, name)
			continue
		}
		for _, sub := range slices.Sorted(maps.Keys(subs)) {
			paths = append(paths, name+" "+sub)
		}
	}
	return paths
}

var (
	// singleDashFlag finds a flag written Go's default way, -name.
	singleDashFlag = regexp.MustCompile(`(^|[\s\[(])-[a-z]`)
	// quotedNumber finds a numeric default printed as a string.
	quotedNumber = regexp.MustCompile(`default "[0-9.]+[a-z]*"`)
	// positional finds the upper-case argument names of a usage line.
	positional = regexp.MustCompile(`\b[A-Z][A-Z:_]+[A-Z]\b`)
)

func TestHelp_everyCommand(t *testing.T) {
	for _, path := range commandPaths() {
		t.Run(path, func(t *testing.T) {
			var out, errOut bytes.Buffer
			err := run(append(strings.Fields(path), "--help"), noEnv, &out, &errOut)
			if code := exitCode(err); code != 0 {
				t.Fatalf("parley %s --help exits %d (%v), want 0", path, code, err)
			}
			help := out.String()
			if errOut.Len() != 0 {
				t.Errorf("--help wrote %q to stderr, want it on stdout", errOut.String())
			}
			first, _, _ := strings.Cut(help, "\n")
			if !strings.HasPrefix(first, "Usage: parley "+path) {
				t.Fatalf("help starts %q, want \"Usage: parley %s ...\"", first, path)
			}
			if !strings.Contains(help, "\nExample") {
				t.Errorf("help has no example:\n%s", help)
			}
			if m := singleDashFlag.FindString(help); m != "" {
				t.Errorf("help writes a flag with one dash (%q); the house style is --flag:\n%s", m, help)
			}
			if m := quotedNumber.FindString(help); m != "" {
				t.Errorf("help quotes a number (%s):\n%s", m, help)
			}
			if strings.Contains(help, "  --") && !strings.Contains(help, "[$PARLEY_") {
				t.Errorf("help names no environment variable; flags read them as --flag [$PARLEY_X]:\n%s", help)
			}
			for _, arg := range positional.FindAllString(first, -1) {
				if !regexp.MustCompile(`(?m)^  ` + regexp.QuoteMeta(arg) + `\s`).MatchString(help) {
					t.Errorf("positional argument %s is not explained under Arguments:\n%s", arg, help)
				}
			}
		})
	}
}

func TestHelp_topLevelAndGroupsExitZero(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"help"}, {"-h"}, {"agent", "--help"}, {"protocol", "help"}, {"routine", "-h"}} {
		var out, errOut bytes.Buffer
		err := run(args, noEnv, &out, &errOut)
		if code := exitCode(err); code != 0 {
			t.Errorf("parley %q exits %d (%v), want 0", args, code, err)
		}
		if !strings.HasPrefix(out.String(), "Usage: parley") {
			t.Errorf("parley %q printed %q on stdout, want the usage", args, out.String())
		}
	}
	var out, errOut bytes.Buffer
	if code := exitCode(run(nil, noEnv, &out, &errOut)); code == 0 {
		t.Errorf("parley with no command exits 0, want a usage error")
	}
}

func TestHelp_demoIsComplete(t *testing.T) {
	var out, errOut bytes.Buffer
	err := run([]string{"demo", "--help"}, noEnv, &out, &errOut)
	if code := exitCode(err); code != 0 {
		t.Fatalf("parley demo --help exits %d (%v), want 0", code, err)
	}
	for _, want := range []string{"weather", "--queries", "--server", "send-allow-private", "Example", "market", "--window", "parley demo market --json"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("parley demo --help lacks %q:\n%s", want, out.String())
		}
	}
}

// parley serve --help lists the dispatcher's --dispatcher-journal (on by
// default) with its environment variable.
func TestHelp_serveListsDispatcherJournal(t *testing.T) {
	var out, errOut bytes.Buffer
	if err := run([]string{"serve", "--help"}, noEnv, &out, &errOut); exitCode(err) != 0 {
		t.Fatalf("parley serve --help: %v", err)
	}
	if !regexp.MustCompile(`  --dispatcher-journal\n\s+[^\n]*dispatcher\.db-journal[^\n]*\(default true\) \[\$PARLEY_DISPATCHER_JOURNAL\]`).MatchString(out.String()) {
		t.Errorf("parley serve --help lacks --dispatcher-journal [$PARLEY_DISPATCHER_JOURNAL], its journal file and default true:\n%s", out.String())
	}
}

func TestFlagErrors_useDoubleDash(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--log-level", "loud"}, "--log-level"},
		{[]string{"serve", "--bogus"}, "--bogus"},
		{[]string{"agent", "get", "--bogus", "a:b"}, "--bogus"},
		{[]string{"demo", "weather", "--queries", "many"}, "--queries"},
		{[]string{"protocol", "list", "--server"}, "--server"},
	}
	for _, tt := range tests {
		var out, errOut bytes.Buffer
		err := run(tt.args, noEnv, &out, &errOut)
		if err == nil || !strings.Contains(err.Error(), tt.want) || singleDashFlag.MatchString(err.Error()) {
			t.Errorf("parley %q = %v, want an error naming %s (two dashes)", tt.args, err, tt.want)
		}
		if code := exitCode(err); code != 2 {
			t.Errorf("parley %q exits %d, want 2 for a usage error", tt.args, code)
		}
	}
}

// TestHelp_neverEchoesTheToken: help shows flag defaults, and --token's
// comes from $PARLEY_TOKEN; a secret must not reach the terminal, a
// pasted transcript or a CI log that way.
func TestHelp_neverEchoesTheToken(t *testing.T) {
	const secret = "parley_ck_0123456789abcdef_secretsecretsecretsecretsecretsecretsec"
	getenv := func(k string) string {
		if k == "PARLEY_TOKEN" {
			return secret
		}
		return ""
	}
	for _, path := range commandPaths() {
		var out, errOut bytes.Buffer
		_ = run(append(strings.Fields(path), "--help"), getenv, &out, &errOut)
		if strings.Contains(out.String()+errOut.String(), secret) {
			t.Errorf("parley %s --help prints $PARLEY_TOKEN", path)
		}
	}
}
