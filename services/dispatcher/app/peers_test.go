package app_test

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/grpcclient"
	"github.com/parleyhq/parley/platform/serve"
	"github.com/parleyhq/parley/services/dispatcher/app"
	"github.com/parleyhq/parley/services/dispatcher/config"
)

// A dispatcher started before its registry answers a call made once the
// registry is up, even with its connection to the registry in reconnect
// backoff (the separate-processes walkthrough met that: the call failed
// UNAVAILABLE and the CLI blamed the dispatcher). The registry is dialled
// as cmd/dispatcher dials it.
func TestApp_answersOnceItsRegistryComesUp(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	regAddr := l.Addr().String()
	l.Close() // the registry is not up yet

	// Access control is not what this is about: the fake registry checks
	// no token.
	args := []string{"--registry-addr", regAddr, "--negotiator-addr", regAddr, "--peer-ready-timeout", "1m", "--auth=false"}
	cfg, err := config.Load(append([]string{"--data", t.TempDir()}, args...), func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	peer, err := serve.PeerOptions(cfg.Flags)
	if err != nil {
		t.Fatal(err)
	}
	regConn, err := grpcclient.Dial(cfg.RegistryAddr, peer)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { regConn.Close() })
	e := startDispatcherWithPeers(t, app.Peers{Registry: regConn, Negotiator: regConn}, args...)

	// The dispatcher's connection to the registry has failed once and
	// waits out its backoff.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	regConn.Connect()
	for s := regConn.GetState(); s != connectivity.TransientFailure; s = regConn.GetState() {
		if !regConn.WaitForStateChange(ctx, s) {
			t.Fatalf("the registry connection stayed %v, want TRANSIENT_FAILURE", s)
		}
	}

	// The registry comes up on its address.
	l, err = net.Listen("tcp", regAddr)
	if err != nil {
		t.Fatalf("listen on the registry's address %s again: %v", regAddr, err)
	}
	regSrv := grpc.NewServer()
	registryv1.RegisterRegistryServiceServer(regSrv, fakeRegistry{})
	go func() { _ = regSrv.Serve(l) }()
	t.Cleanup(regSrv.Stop)

	// A call that needs the registry succeeds within its deadline.
	_, err = e.client.SetRoutine(ctx, &dispatcherv1.SetRoutineRequest{
		Routine: &dispatcherv1.Routine{Name: "clients/acme/agents/echo/routines/" + pdHex, Source: "def reply(q, m):\n    return q\n"},
	})
	if err != nil {
		t.Fatalf("SetRoutine once the registry is up = %v, want success", err)
	}
}
