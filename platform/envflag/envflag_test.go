package envflag

import (
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
	"time"
)

func newSet() (*flag.FlagSet, *string, *time.Duration, *int) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	addr := fs.String("grpc-addr", ":9090", "")
	d := fs.Duration("shutdown-timeout", time.Second, "")
	n := fs.Int("max-bytes", 1, "")
	return fs, addr, d, n
}

func TestParse_environmentFillsUnsetFlags(t *testing.T) {
	fs, addr, d, _ := newSet()
	env := map[string]string{"P_GRPC_ADDR": "env:1", "P_SHUTDOWN_TIMEOUT": "3s"}
	if err := Parse(fs, []string{"--grpc-addr", "flag:2"}, "P_", func(k string) string { return env[k] }); err != nil {
		t.Fatalf("Parse() = %v", err)
	}
	if *addr != "flag:2" {
		t.Errorf("grpc-addr = %q, want the command-line value flag:2", *addr)
	}
	if *d != 3*time.Second {
		t.Errorf("shutdown-timeout = %v, want 3s from the environment", *d)
	}
}

func TestParse_reportsEveryBadValue(t *testing.T) {
	fs, _, _, _ := newSet()
	env := map[string]string{"P_SHUTDOWN_TIMEOUT": "soon", "P_MAX_BYTES": "many"}
	err := Parse(fs, nil, "P_", func(k string) string { return env[k] })
	if err == nil {
		t.Fatal("Parse() = nil, want an error naming both variables")
	}
	for _, want := range []string{"P_SHUTDOWN_TIMEOUT", "P_MAX_BYTES"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Parse() error = %q, want it to name %s", err, want)
		}
	}
}

func TestParse_unknownFlag(t *testing.T) {
	fs, _, _, _ := newSet()
	err := Parse(fs, []string{"--nope"}, "P_", func(string) string { return "" })
	if err == nil || errors.Is(err, flag.ErrHelp) {
		t.Fatalf("Parse(--nope) = %v, want an unknown-flag error", err)
	}
}

func TestDoc_helpStyle(t *testing.T) {
	fs, _, _, _ := newSet()
	var out strings.Builder
	fs.SetOutput(&out)
	d := Doc{
		Usage:    "x get THING [flags]",
		Args:     []Arg{{"THING", "what to get"}},
		Examples: []string{"x get a"},
		Env:      map[string]string{"grpc-addr": "P_SERVER"},
	}
	if _, err := d.ParseArgs(fs, []string{"--help"}, func(string) string { return "" }); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("ParseArgs(--help) = %v, want flag.ErrHelp", err)
	}
	help := out.String()
	for _, want := range []string{"Usage: x get THING [flags]", "  THING  what to get", "--grpc-addr string", "(default :9090) [$P_SERVER]", "(default 1)\n", "Examples:\n  x get a"} {
		if !strings.Contains(help, want) {
			t.Errorf("help lacks %q:\n%s", want, help)
		}
	}
	if strings.Contains(help, "$P_MAX_BYTES") {
		t.Errorf("help names a variable for a flag outside Env:\n%s", help)
	}
}

func TestDoc_flagsAmongArgumentsAndErrorsWithTwoDashes(t *testing.T) {
	fs, addr, _, n := newSet()
	pos, err := Doc{}.ParseArgs(fs, []string{"a", "--max-bytes", "3", "b", "--", "--grpc-addr"}, func(string) string { return "" })
	if err != nil || strings.Join(pos, " ") != "a b --grpc-addr" || *n != 3 || *addr != ":9090" {
		t.Errorf("ParseArgs = %q, %v (max-bytes %d); want [a b --grpc-addr] and max-bytes 3", pos, err, *n)
	}
	fs, _, _, _ = newSet()
	_, err = Doc{}.ParseArgs(fs, []string{"--max-bytes", "many"}, func(string) string { return "" })
	var ue *UsageError
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), "flag --max-bytes") {
		t.Errorf("ParseArgs(--max-bytes many) = %v, want a UsageError naming --max-bytes", err)
	}
}
