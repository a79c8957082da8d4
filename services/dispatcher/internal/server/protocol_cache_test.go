package server

import (
	"encoding/base64"
	"testing"
	"time"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
)

// TestProtocol_wrongSourcesDoNotPoisonOthers: while a first lookup with
// sources that do not verify is in flight, a lookup of the same PD with the
// right sources gets its own registry call and succeeds.
func TestProtocol_wrongSourcesDoNotPoisonOthers(t *testing.T) {
	reg := newFakeRegistry()
	const pd = "---\nname: Fresh\n---\nA protocol the registry does not hold yet."
	h := sha1Hex([]byte(pd))
	good := []string{"data:text/plain;charset=utf-8;base64," + base64.StdEncoding.EncodeToString([]byte(pd))}
	bad := []string{"data:text/plain;charset=utf-8;base64," + base64.StdEncoding.EncodeToString([]byte("not it"))}
	release := make(chan struct{})
	entered := make(chan []string, 4)
	reg.resolveHook = func(req *registryv1.ResolveProtocolRequest) {
		entered <- req.GetSources()
		if req.GetSources()[0] == bad[0] {
			<-release
		}
	}
	e := startEnv(t, reg, "", Options{})

	badErr := make(chan error, 1)
	go func() {
		_, err := e.srv.dir.Protocol(t.Context(), h, bad)
		badErr <- err
	}()
	if got := <-entered; got[0] != bad[0] {
		t.Fatalf("first registry call had sources %v, want the bad ones", got)
	}
	goodErr := make(chan error, 1)
	go func() {
		_, err := e.srv.dir.Protocol(t.Context(), h, good)
		goodErr <- err
	}()
	select {
	case got := <-entered:
		if got[0] != good[0] {
			t.Fatalf("second registry call had sources %v, want the good ones", got)
		}
	case <-time.After(5 * time.Second):
		close(release)
		t.Fatalf("the lookup with good sources waited on the one with bad sources (registry calls: %d)", reg.resolveCalls.Load())
	}
	if err := <-goodErr; err != nil {
		t.Errorf("protocol(good sources) = %v, want the PD", err)
	}
	close(release)
	if err := <-badErr; err != nil { // the fake registry now holds the PD, so it may succeed too
		t.Logf("protocol(bad sources) = %v", err)
	}
	// Now cached under the hash: any caller gets it without a registry call.
	before := reg.resolveCalls.Load()
	if _, err := e.srv.dir.Protocol(t.Context(), h, nil); err != nil || reg.resolveCalls.Load() != before {
		t.Errorf("protocol(cached) = %v with %d more registry calls, want the cached PD", err, reg.resolveCalls.Load()-before)
	}
}
