package main

import (
	"io"
	"slices"
	"testing"

	"github.com/parleyhq/parley/platform/auth"
)

// TestPolicy_everyRPCAndRouteHasAnEntry walks every method of every service
// registered by `parley serve`, and every hand-written route, and fails on
// one the access policy does not list: such a call would be refused for
// everyone, or, were the check ever skipped, open to everyone.
func TestPolicy_everyRPCAndRouteHasAnEntry(t *testing.T) {
	cfg, err := loadSuiteConfig(env{getenv: noEnv, stdout: io.Discard}, []string{"--data", t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	s, err := newSuite(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var calls []string
	for name, info := range s.srv.GRPC.GetServiceInfo() {
		for _, m := range info.Methods {
			calls = append(calls, "/"+name+"/"+m.Name)
		}
	}
	if !slices.Contains(calls, "/parley.registry.v1.RegistryService/CreateAgent") {
		t.Fatalf("the walk found %d methods, not the registry's: %v", len(calls), calls)
	}
	calls = append(calls, s.srv.Routes()...)
	policy := auth.ParleyPolicy()
	if missing := policy.Missing(calls); len(missing) > 0 {
		t.Errorf("calls without an access policy entry (add them to platform/auth/table.go):\n%q", missing)
	}
	// The walk must catch a missing entry, not pass vacuously.
	delete(policy, "/parley.dispatcher.v1.DispatcherService/Send")
	if missing := policy.Missing(calls); !slices.Equal(missing, []string{"/parley.dispatcher.v1.DispatcherService/Send"}) {
		t.Errorf("Missing() after deleting Send's entry = %q, want just Send", missing)
	}
	// No stale entries either: each names a call that exists.
	for call := range auth.ParleyPolicy() {
		if !slices.Contains(calls, call) {
			t.Errorf("policy entry %q names no registered RPC or route", call)
		}
	}
}
