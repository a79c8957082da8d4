package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func noEnv(string) string { return "" }

func TestRun_badInvocations(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"unknown command", []string{"frobnicate"}, `unknown command "frobnicate"`},
		{"unknown flag", []string{"serve", "--bogus"}, "flag provided but not defined: --bogus"},
		{"stray argument", []string{"serve", "extra"}, "takes no arguments"},
		{"data dir is a file", []string{"serve", "--data", file, "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"}, "data directory " + file + " is unusable"},
		{"bad duration", []string{"serve", "--shutdown-timeout", "soon"}, "invalid value"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			err := run(tt.args, noEnv, &out, &errOut)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("run(%q) = %v, want an error containing %q", tt.args, err, tt.want)
			}
			if strings.Contains(oneLine(err), "\n") {
				t.Errorf("oneLine(%v) spans lines", err)
			}
			if errOut.Len() != 0 {
				t.Errorf("run(%q) printed %q on stderr; errors must be reported once, by main", tt.args, errOut.String())
			}
		})
	}
}

func TestServe_secondServerOnSameDataFailsFast(t *testing.T) {
	dir := t.TempDir()
	cfg, err := loadSuiteConfig(env{getenv: noEnv, stdout: io.Discard}, []string{"--data", dir})
	if err != nil {
		t.Fatal(err)
	}
	first, err := newSuite(context.Background(), cfg)
	if err != nil {
		t.Fatalf("first newSuite: %v", err)
	}
	defer first.Close()
	_, err = newSuite(context.Background(), cfg)
	if err == nil || !strings.Contains(err.Error(), "locked by another process") {
		t.Fatalf("second newSuite on %s = %v, want a 'locked by another process' error", dir, err)
	}
}

func TestServe_portInUseIsOneLineError(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	var out, errOut bytes.Buffer
	err = run([]string{"serve", "--data", t.TempDir(), "--grpc-addr", taken.Addr().String(), "--http-addr", "127.0.0.1:0"}, noEnv, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "address already in use") || strings.Contains(oneLine(err), "\n") {
		t.Fatalf("parley serve on a taken port = %v, want a one-line 'address already in use' error", err)
	}
}

func TestServe_environmentFallback(t *testing.T) {
	vars := map[string]string{"PARLEY_DATA": "/env/data", "PARLEY_HTTP_ADDR": "127.0.0.1:1234"}
	cfg, err := loadSuiteConfig(env{getenv: func(k string) string { return vars[k] }, stdout: io.Discard}, []string{"--http-addr", "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.DataDir != "/env/data" || cfg.HTTPAddr != "127.0.0.1:0" {
		t.Errorf("config = data %q http %q, want /env/data from the environment and 127.0.0.1:0 from the flag", cfg.DataDir, cfg.HTTPAddr)
	}
	if cfg.registry.DataDir != "/env/data" || cfg.tasks.HTTPAddr != "127.0.0.1:0" {
		t.Errorf("service configs did not inherit the shared flags: %+v", cfg.registry.Flags)
	}
}

// TestServe_oldFlagSpellingStillWorks proves --grpc and --http, the old
// spelling of --grpc-addr and --http-addr in `parley serve`, still set the
// listen addresses, and that the service binaries' spelling works there too.
func TestServe_oldFlagSpellingStillWorks(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  map[string]string
	}{
		{"old flags", []string{"--grpc", "127.0.0.1:7001", "--http", "127.0.0.1:7002"}, nil},
		{"new flags", []string{"--grpc-addr", "127.0.0.1:7001", "--http-addr", "127.0.0.1:7002"}, nil},
		{"old variables", nil, map[string]string{"PARLEY_GRPC": "127.0.0.1:7001", "PARLEY_HTTP": "127.0.0.1:7002"}},
		{"new variables", nil, map[string]string{"PARLEY_GRPC_ADDR": "127.0.0.1:7001", "PARLEY_HTTP_ADDR": "127.0.0.1:7002"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := loadSuiteConfig(env{getenv: func(k string) string { return tt.env[k] }, stdout: io.Discard}, tt.args)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.GRPCAddr != "127.0.0.1:7001" || cfg.HTTPAddr != "127.0.0.1:7002" || cfg.tasks.HTTPAddr != "127.0.0.1:7002" {
				t.Errorf("loadSuiteConfig(%q, env %v) = grpc %q http %q, want 127.0.0.1:7001 and 127.0.0.1:7002", tt.args, tt.env, cfg.GRPCAddr, cfg.HTTPAddr)
			}
		})
	}
}

func TestVersion(t *testing.T) {
	var out bytes.Buffer
	if err := run([]string{"version"}, noEnv, &out, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "parley ") {
		t.Errorf("parley version printed %q, want it to start with \"parley \"", out.String())
	}
}
