package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/parleyhq/parley/platform/serve"
	registryapp "github.com/parleyhq/parley/services/registry/app"
	registryconfig "github.com/parleyhq/parley/services/registry/config"
)

// startRegistry runs the registry on loopback and returns its gRPC address.
func startRegistry(t *testing.T) string {
	t.Helper()
	cfg, err := registryconfig.Load([]string{"--data", t.TempDir()}, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.DiscardHandler)
	a, err := registryapp.New(cfg, logger, nil)
	if err != nil {
		t.Fatal(err)
	}
	return serveTestApp(t, logger, a)
}

// testApp is a service app as serveTestApp runs it.
type testApp interface {
	Register(ctx context.Context, s *serve.Server) error
	Close() error
}

// serveTestApp serves a on gRPC and HTTP listeners at 127.0.0.1:0 until
// the test ends, then closes it, and returns the gRPC address.
func serveTestApp(t *testing.T, logger *slog.Logger, a testApp) string {
	t.Helper()
	srv, err := serve.New(serve.Options{Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := a.Register(ctx, srv); err != nil {
		cancel()
		t.Fatal(err)
	}
	grpcLis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	httpLis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, grpcLis, httpLis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run() error = %v", err)
		}
		if err := a.Close(); err != nil {
			t.Errorf("Close() error = %v", err)
		}
	})
	return grpcLis.Addr().String()
}

// cli runs `parley args...` against addr (through PARLEY_SERVER) and
// returns stdout.
func cli(t *testing.T, addr string, args ...string) (string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	getenv := func(k string) string {
		if k == "PARLEY_SERVER" {
			return addr
		}
		return ""
	}
	err := run(args, getenv, &stdout, &stderr)
	return stdout.String(), err
}

func TestProtocolAndAgentCommands(t *testing.T) {
	addr := startRegistry(t)
	doc := "---\nname: Météo\ndescription: Forecasts.\ntags: [weather]\n---\nTempérature °C.\n"
	file := filepath.Join(t.TempDir(), "pd.txt")
	if err := os.WriteFile(file, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	hash, err := cli(t, addr, "protocol", "add", file)
	hash = strings.TrimSpace(hash)
	if err != nil || len(hash) != 40 {
		t.Fatalf("protocol add = %q, %v; want a SHA-1 hex", hash, err)
	}
	for _, h := range []string{hash, strings.ToUpper(hash)} {
		if got, err := cli(t, addr, "protocol", "get", h); err != nil || got != doc {
			t.Errorf("protocol get %s = %q, %v; want the exact document", h, got, err)
		}
	}
	if got, err := cli(t, addr, "protocol", "list", "--server", addr); err != nil || !strings.Contains(got, hash) || !strings.Contains(got, "Météo") {
		t.Errorf("protocol list = %q, %v", got, err)
	}
	if got, err := cli(t, addr, "protocol", "search", "WEATHER"); err != nil || !strings.Contains(got, hash) {
		t.Errorf("protocol search = %q, %v", got, err)
	}
	if got, err := cli(t, addr, "protocol", "search", "nothing"); err != nil || got != "" {
		t.Errorf("protocol search nothing = %q, %v; want no output", got, err)
	}

	if got, err := cli(t, addr, "agent", "create", "acme:weather", "--display-name", "Weather", "--dialect", "std"); err != nil || !regexp.MustCompile(`^parley_ak_[0-9a-f]{16}_[A-Za-z0-9_-]{43}\n$`).MatchString(got) {
		t.Fatalf("agent create = %q, %v; want the agent's key alone on stdout", got, err)
	}
	got, err := cli(t, addr, "agent", "update", "acme:weather", "--description", "Forecasts.", "--policy", "implemented")
	var updated map[string]any
	if err == nil {
		err = json.Unmarshal([]byte(got), &updated)
	}
	if err != nil || updated["displayName"] != "Weather" || updated["description"] != "Forecasts." || updated["supportPolicy"] != "SUPPORT_POLICY_IMPLEMENTED" || updated["dialect"] != "DIALECT_STD" {
		t.Errorf("agent update = %q, %v; want description and policy changed, the rest kept", got, err)
	}
	if got, err := cli(t, addr, "agent", "update", "acme:weather", "--ap-access", "token"); err != nil || !strings.Contains(got, `"agentProtocolAccess": "AGENT_PROTOCOL_ACCESS_TOKEN"`) || !strings.Contains(got, `"description": "Forecasts."`) {
		t.Errorf("agent update --ap-access token = %q, %v; want the access set, the rest kept", got, err)
	}
	if _, err := cli(t, addr, "agent", "update", "acme:weather", "--ap-access", "secret"); err == nil || !strings.Contains(err.Error(), "public or token") {
		t.Errorf("agent update --ap-access secret error = %v; want one naming public and token", err)
	}
	if _, err := cli(t, addr, "agent", "update", "acme:weather", "--display-name", "X", "--etag", "stale"); err == nil || !strings.Contains(err.Error(), "changed since it was read") {
		t.Errorf("agent update --etag stale error = %v; want the etag mismatch", err)
	}
	if got, err := cli(t, addr, "agent", "support", "acme:weather", hash, "--source", "https://pd.example.com/w.txt"); err != nil || !strings.Contains(got, "https://pd.example.com/w.txt") {
		t.Errorf("agent support = %q, %v", got, err)
	}
	other := strings.Repeat("ab", 20)
	if got, err := cli(t, addr, "agent", "unsupport", "acme:weather", other, "--comment", "no thanks"); err != nil || !strings.Contains(got, "no thanks") {
		t.Errorf("agent unsupport = %q, %v", got, err)
	}
	if got, err := cli(t, addr, "agent", "list"); err != nil || !strings.Contains(got, "acme:weather") || !strings.Contains(got, "1 supported") {
		t.Errorf("agent list = %q, %v", got, err)
	}
	if _, err := cli(t, addr, "agent", "delete", "acme:weather"); err != nil {
		t.Errorf("agent delete error = %v", err)
	}
	if _, err := cli(t, addr, "agent", "get", "acme:weather"); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("agent get after delete error = %v; want not found", err)
	}
	for _, args := range [][]string{
		{"protocol", "get", "nope"},
		{"protocol", "add"},
		{"agent", "create", "no-colon"},
		{"agent", "support", "acme:weather"},
		{"agent", "update", "acme:weather"},
		{"agent", "update", "acme:weather", "--dialect", "klingon"},
		{"protocol", "frobnicate"},
	} {
		if _, err := cli(t, addr, args...); err == nil {
			t.Errorf("parley %v succeeded; want an error", args)
		}
	}
}

// TestAgentJSON_isStableAndIndented checks what scripts and people read:
// protojson's Multiline output varies its spacing on purpose; the CLI
// prints encoding/json's two-space indentation, the same every run.
func TestAgentJSON_isStableAndIndented(t *testing.T) {
	addr := startRegistry(t)
	if _, err := cli(t, addr, "agent", "create", "acme:weather", "--display-name", "Weather"); err != nil {
		t.Fatal(err)
	}
	got, err := cli(t, addr, "agent", "get", "acme:weather")
	if err != nil {
		t.Fatal(err)
	}
	var compact, indented bytes.Buffer
	if err := json.Compact(&compact, []byte(got)); err != nil {
		t.Fatalf("agent get printed invalid JSON %q: %v", got, err)
	}
	if err := json.Indent(&indented, compact.Bytes(), "", "  "); err != nil {
		t.Fatal(err)
	}
	if want := indented.String() + "\n"; got != want {
		t.Errorf("agent get printed\n%s\nwant two-space indented JSON:\n%s", got, want)
	}
	if !strings.Contains(got, "\n  \"displayName\": \"Weather\"") {
		t.Errorf("agent get = %s, want \"displayName\": \"Weather\" on its own line", got)
	}
}

func TestIndentJSON_evensOutProtojsonSpacing(t *testing.T) {
	// protojson inserts a random extra space after some colons (by design,
	// so nobody depends on its layout); the CLI's printer removes it.
	var out bytes.Buffer
	if err := writeIndented(&out, []byte("{\"name\":  \"clients/acme/agents/w\",\n \"dialect\":\"DIALECT_STD\"}")); err != nil {
		t.Fatal(err)
	}
	want := "{\n  \"name\": \"clients/acme/agents/w\",\n  \"dialect\": \"DIALECT_STD\"\n}\n"
	if out.String() != want {
		t.Errorf("writeIndented = %q, want %q", out.String(), want)
	}
}
