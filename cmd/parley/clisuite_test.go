package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// cliSuite is `parley serve` on a fresh data directory, driven through
// the CLI as a user would: the tests of the agent network's commands share
// it instead of each writing the same preamble.
type cliSuite struct {
	addr     string // gRPC address
	base     string // HTTP base URL
	operator string // the operator token from the data directory
}

// startCLISuite serves a suite on loopback until the test ends.
func startCLISuite(t *testing.T) cliSuite {
	t.Helper()
	dir := t.TempDir()
	cfg, err := loadSuiteConfig(env{getenv: noEnv, stdout: io.Discard}, []string{"--data", dir})
	if err != nil {
		t.Fatal(err)
	}
	_, addr, base := startSuite(t, cfg)
	op, err := os.ReadFile(filepath.Join(dir, "operator.token"))
	if err != nil {
		t.Fatal(err)
	}
	return cliSuite{addr: addr, base: base, operator: strings.TrimSpace(string(op))}
}

// call runs `parley args...` against the suite with token in PARLEY_TOKEN
// and returns its trimmed stdout.
func (s cliSuite) call(token string, args ...string) (string, error) {
	var stdout bytes.Buffer
	getenv := func(k string) string {
		return map[string]string{"PARLEY_SERVER": s.addr, "PARLEY_TOKEN": token}[k]
	}
	err := run(args, getenv, &stdout, io.Discard)
	return strings.TrimSpace(stdout.String()), err
}

// must returns call for t that ends the test when the command fails.
func (s cliSuite) must(t *testing.T) func(token string, args ...string) string {
	return func(token string, args ...string) string {
		t.Helper()
		out, err := s.call(token, args...)
		if err != nil {
			t.Fatalf("parley %q: %v", args, err)
		}
		return out
	}
}
