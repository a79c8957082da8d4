package main

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/parleyhq/parley/platform/serve"
)

// closedAddr returns a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func TestClient_unreachableServerIsOneLineNamingTheFlag(t *testing.T) {
	addr := closedAddr(t)
	for _, args := range [][]string{
		{"agent", "get", "a:b", "--server", addr},
		{"protocol", "list", "--server", addr},
		{"routine", "list", "a:b", "--server", addr},
	} {
		var out, errOut bytes.Buffer
		err := run(args, noEnv, &out, &errOut)
		if err == nil {
			t.Fatalf("parley %q = nil, want an error", args)
		}
		msg := oneLine(err)
		for _, want := range []string{addr, "--server", "PARLEY_SERVER"} {
			if !strings.Contains(msg, want) {
				t.Errorf("parley %q = %q, want it to name %s", args, msg, want)
			}
		}
		if strings.Contains(msg, "rpc error") || strings.Contains(msg, "desc =") {
			t.Errorf("parley %q = %q, want a sentence, not a raw gRPC status", args, msg)
		}
	}
}

func TestHealth_unreachableTargetIsOneLineNamingTheFlag(t *testing.T) {
	addr := closedAddr(t)
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"health", "--server", addr, "--timeout", "2s"}, []string{addr, "--server", "PARLEY_HEALTH_SERVER"}},
		{[]string{"health", "--url", "http://" + addr + "/readyz", "--timeout", "2s"}, []string{addr, "--url", "PARLEY_HEALTH_URL"}},
	} {
		var out, errOut bytes.Buffer
		err := run(tc.args, noEnv, &out, &errOut)
		if err == nil {
			t.Fatalf("parley %q = nil, want an error", tc.args)
		}
		msg := oneLine(err)
		for _, want := range tc.want {
			if !strings.Contains(msg, want) {
				t.Errorf("parley %q = %q, want it to name %s", tc.args, msg, want)
			}
		}
		if strings.Contains(msg, "rpc error") || strings.Contains(msg, "desc =") || strings.Contains(msg, "dial tcp") {
			t.Errorf("parley %q = %q, want a sentence, not a raw transport error", tc.args, msg)
		}
	}
}

// startEmptyServer runs a Parley server that hosts no service but health.
func startEmptyServer(t *testing.T) string {
	t.Helper()
	s, err := serve.New(serve.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
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
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, gl, hl) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run() = %v", err)
		}
	})
	return gl.Addr().String()
}

func TestClient_missingServiceSaysWhichAndWhere(t *testing.T) {
	addr := startEmptyServer(t)
	doc := filepath.Join(t.TempDir(), "p.md")
	if err := os.WriteFile(doc, []byte("---\nname: x\n---\nbody\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		args []string
		want []string
	}{
		{[]string{"protocol", "add", doc, "--server", addr}, []string{"parley.registry.v1.RegistryService", "registry", "--server", addr}},
		{[]string{"routine", "list", "a:b", "--server", addr}, []string{"parley.dispatcher.v1.DispatcherService", "dispatcher", "--server", addr}},
	}
	for _, tt := range tests {
		var out, errOut bytes.Buffer
		err := run(tt.args, noEnv, &out, &errOut)
		if err == nil {
			t.Fatalf("parley %q = nil, want an error", tt.args)
		}
		msg := oneLine(err)
		for _, want := range tt.want {
			if !strings.Contains(msg, want) {
				t.Errorf("parley %q = %q, want it to name %s", tt.args, msg, want)
			}
		}
		if !strings.Contains(msg, "parley serve") {
			t.Errorf("parley %q = %q, want it to say where the service usually runs (parley serve)", tt.args, msg)
		}
	}
}
