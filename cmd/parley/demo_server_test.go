package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"math"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/parleyhq/parley/cmd/parley/internal/demo"
	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
)

// startServe runs `parley serve` in process with extra flags on loopback
// and returns its gRPC address and HTTP base URL, and an environment
// holding its operator token in PARLEY_TOKEN.
func startServe(t *testing.T, extra ...string) (grpcAddr, httpURL string, conn registryv1.RegistryServiceClient, getenv func(string) string) {
	t.Helper()
	dir := t.TempDir()
	args := append([]string{"--data", dir, "--log-level", "error"}, extra...)
	cfg, err := loadSuiteConfig(env{getenv: noEnv, stdout: io.Discard}, args)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s, err := newSuite(ctx, cfg)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.srv.Run(ctx, gl, hl) }()
	c, err := s.srv.InProcessConn()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run() = %v", err)
		}
		if err := s.Close(); err != nil {
			t.Errorf("Close() = %v", err)
		}
	})
	token, err := os.ReadFile(filepath.Join(dir, "operator.token"))
	if err != nil {
		t.Fatal(err)
	}
	getenv = func(k string) string {
		if k == "PARLEY_TOKEN" {
			return strings.TrimSpace(string(token))
		}
		return ""
	}
	return gl.Addr().String(), "http://" + hl.Addr().String(), registryv1.NewRegistryServiceClient(c), getenv
}

// demoAgents lists the demo's agents (Alice's and Bob's, whatever their
// suffix) on a server.
func demoAgents(t *testing.T, reg registryv1.RegistryServiceClient) []string {
	t.Helper()
	resp, err := reg.ListAgents(t.Context(), &registryv1.ListAgentsRequest{Parent: "clients/-", PageSize: 1000})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, a := range resp.GetAgents() {
		if n := a.GetName(); strings.Contains(n, "/agents/alice-") || strings.Contains(n, "/agents/bob-") {
			names = append(names, n)
		}
	}
	return names
}

func TestDemoOnServer_refusedSendNamesTheFlag(t *testing.T) {
	addr, url, reg, getenv := startServe(t) // without --send-allow-private
	var out, errOut bytes.Buffer
	err := run([]string{"demo", "weather", "--server", addr, "--http", url, "--queries", "2"}, getenv, &out, &errOut)
	if err == nil {
		t.Fatal("demo against a server that refuses loopback sends succeeded, want an error")
	}
	if msg := oneLine(err); !strings.Contains(msg, "--send-allow-private") {
		t.Errorf("demo error = %q, want it to name --send-allow-private", msg)
	}
	if left := demoAgents(t, reg); len(left) != 0 {
		t.Errorf("a failed demo left agents %v on the server", left)
	}
}

func TestDemoOnServer_leavesNoAgentsAndSaysWhatItSaved(t *testing.T) {
	addr, url, reg, getenv := startServe(t, "--send-allow-private")
	var out, errOut bytes.Buffer
	err := run([]string{"demo", "weather", "--server", addr, "--http", url, "--queries", "3"}, getenv, &out, &errOut)
	if err != nil {
		t.Fatalf("demo on a server: %v\n%s", err, out.String())
	}
	if left := demoAgents(t, reg); len(left) != 0 {
		t.Errorf("the demo left agents %v on the server", left)
	}
	// No LLM: 3 structured queries plus the negotiating one, against the
	// paper's 0.020 USD and the demo's 3 calls per natural-language query.
	for _, want := range []string{"removed the agents it created: tours:alice-", "Saved over the 4 queries after negotiation: 12 LLM calls and 0.0800 USD"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("demo output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestComputeSavings(t *testing.T) {
	sum := demo.Summary{NLCostPerQueryUSD: 0.01, Phases: []demo.Phase{
		{Name: "natural-language", Queries: 2, LLMCalls: 6, CostUSD: 0.02},
		{Name: "negotiation", Queries: 1, LLMCalls: 3, CostUSD: 0.03},
		{Name: "routines", LLMCalls: 2, CostUSD: 0.02},
		{Name: "structured", Queries: 9, LLMCalls: 0, CostUSD: 0},
	}}
	got := computeSavings(sum)
	// 10 queries: natural language 30 calls and 0.10 USD; Parley spent 5 calls and 0.05 USD.
	if got.Queries != 10 || got.LLMCalls != 25 || math.Abs(got.USD-0.05) > 1e-9 || !strings.Contains(got.Basis, "measured") {
		t.Errorf("computeSavings = %+v, want 10 queries, 25 calls and 0.05 USD saved on the measured basis", got)
	}
	sum.Phases[3].Queries = 1
	if got := computeSavings(sum); got.USD >= 0 || !strings.Contains(got.String(), "Not saving yet") {
		t.Errorf("computeSavings with 2 queries = %+v (%s), want a loss said plainly", got, got)
	}
}

func TestDemoJSON_reportsTheSavings(t *testing.T) {
	var out, errOut bytes.Buffer
	if err := run([]string{"demo", "weather", "--json", "--queries", "2"}, noEnv, &out, &errOut); err != nil {
		t.Fatalf("parley demo weather --json: %v\n%s", err, errOut.String())
	}
	var s struct {
		Saved savings `json:"saved"`
	}
	if err := json.Unmarshal(out.Bytes(), &s); err != nil {
		t.Fatalf("summary %s: %v", out.String(), err)
	}
	if s.Saved.Queries != 3 || s.Saved.LLMCalls != 9 || math.Abs(s.Saved.USD-0.06) > 1e-9 || s.Saved.Basis == "" {
		t.Errorf("saved = %+v, want 3 queries, 9 calls and 0.06 USD on the paper's basis", s.Saved)
	}
}
