package e2e

import (
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/parleyhq/parley/e2e/parleytest"
	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/sdk"
)

// TestSeparateProcesses_revokedKeyEndsStreamAndNextCall runs the registry
// and the dispatcher as two processes with access control on. An SDK agent
// connected to the dispatcher with its key is cut off once the key is
// revoked at the registry, and the dispatcher refuses the key on the next
// call. ADR 4 states the bound: the stream's 2 s recheck plus the
// dispatcher's 2 s cache of the registry's answer, under 5 s; the wait
// below is capped at 30 s only so that a broken build fails rather than
// hangs (elapsed time is not asserted).
func TestSeparateProcesses_revokedKeyEndsStreamAndNextCall(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts two binaries")
	}
	tokenFile := parleytest.OperatorTokenFile(t)
	reg := parleytest.StartProcess(t, parleytest.Build(t, "github.com/parleyhq/parley/services/registry/cmd/registry"),
		"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--data", t.TempDir(),
		"--auth", "--operator-token-file", tokenFile)
	disp := parleytest.StartProcess(t, parleytest.Build(t, "github.com/parleyhq/parley/services/dispatcher/cmd/dispatcher"),
		"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--data", t.TempDir(),
		"--auth", "--operator-token-file", tokenFile,
		"--registry-addr", reg.GRPCAddr, "--negotiator-addr", "127.0.0.1:1") // the negotiator is not used here

	dial := func(addr string, opts ...grpc.DialOption) *grpc.ClientConn {
		t.Helper()
		conn, err := grpc.NewClient(addr, append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	admin := registryv1.NewRegistryServiceClient(dial(reg.GRPCAddr, grpc.WithPerRPCCredentials(parleytest.Bearer(t))))
	ctx := t.Context()
	a, err := admin.CreateAgent(ctx, &registryv1.CreateAgentRequest{Parent: "clients/acme", AgentId: "bot", Agent: &registryv1.Agent{}})
	if err != nil {
		t.Fatal(err)
	}
	key := a.GetInitialKey().GetSecret()

	dconn := dial(disp.GRPCAddr)
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- sdk.Connect(ctx, dconn, a.GetName(), sdk.Key(key), sdk.OnReady(func() { close(ready) }))
	}()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("Connect to the dispatcher process ended before ready: %v\n%s", err, disp.Log)
	case <-time.After(30 * time.Second):
		t.Fatalf("Connect to the dispatcher process not ready after 30 s\n%s", disp.Log)
	}
	keyed := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+key)
	routines := dispatcherv1.NewDispatcherServiceClient(dconn)
	if _, err := routines.ListRoutines(keyed, &dispatcherv1.ListRoutinesRequest{Parent: a.GetName()}); err != nil {
		t.Fatalf("ListRoutines with the live key on the dispatcher process: %v", err)
	}

	keys, err := admin.ListKeys(ctx, &registryv1.ListKeysRequest{Parent: a.GetName()})
	if err != nil || len(keys.GetKeys()) != 1 {
		t.Fatalf("ListKeys = %v, %v", keys, err)
	}
	if _, err := admin.DeleteKey(ctx, &registryv1.DeleteKeyRequest{Name: keys.GetKeys()[0].GetName()}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, sdk.ErrNotAuthorized) {
			t.Errorf("Connect after its key was revoked in another process = %v, want ErrNotAuthorized", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the SDK stream stayed open 30 s after its key was revoked\n%s", disp.Log)
	}
	// The dispatcher learned of the revocation to end the stream, so the
	// next call with the key is refused at once.
	_, err = routines.ListRoutines(keyed, &dispatcherv1.ListRoutinesRequest{Parent: a.GetName()})
	if status.Code(err) != codes.Unauthenticated {
		t.Errorf("ListRoutines with the revoked key after the stream ended = %v, want UNAUTHENTICATED", err)
	}
}
