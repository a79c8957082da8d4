package main

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/parleyhq/parley/platform/grpcclient"
	"github.com/parleyhq/parley/platform/serve"
	dispatcherapp "github.com/parleyhq/parley/services/dispatcher/app"
	dispatcherconfig "github.com/parleyhq/parley/services/dispatcher/config"
)

// startDispatcherWithoutRegistry runs the dispatcher on loopback, its
// peers dialled as cmd/dispatcher dials them, at an address where nothing
// listens; it returns the dispatcher's gRPC address.
func startDispatcherWithoutRegistry(t *testing.T) string {
	t.Helper()
	peerAddr := closedAddr(t)
	cfg, err := dispatcherconfig.Load([]string{"--data", t.TempDir(), "--registry-addr", peerAddr,
		"--negotiator-addr", peerAddr, "--peer-ready-timeout", "300ms", "--auth=false"}, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	peer, err := serve.PeerOptions(cfg.Flags)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpcclient.Dial(cfg.RegistryAddr, peer)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	logger := slog.New(slog.DiscardHandler)
	a, err := dispatcherapp.New(cfg, logger, dispatcherapp.Peers{Registry: conn, Negotiator: conn})
	if err != nil {
		t.Fatal(err)
	}
	return serveTestApp(t, logger, a)
}

// A dispatcher that is up but cannot reach its registry is not "a Parley
// server that cannot be reached": the CLI names the peer that is down and
// says the server at --server answered.
func TestClient_peerDownNamesThePeerNotTheServer(t *testing.T) {
	addr := startDispatcherWithoutRegistry(t)
	src := filepath.Join(t.TempDir(), "echo.star")
	if err := os.WriteFile(src, []byte("def reply(query, memory):\n    return query\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	err := run([]string{"routine", "set", "acme:echo", strings.Repeat("ab", 20), src, "--server", addr}, noEnv, &out, &errOut)
	if err == nil {
		t.Fatal("routine set with the registry down = nil, want an error")
	}
	msg := oneLine(err)
	if strings.Contains(msg, "cannot reach a Parley server") {
		t.Errorf("routine set = %q, want it not to blame the server it reached", msg)
	}
	t.Log(msg)
	for _, want := range []string{"registry", addr} {
		if !strings.Contains(msg, want) {
			t.Errorf("routine set = %q, want it to name %s", msg, want)
		}
	}
}
