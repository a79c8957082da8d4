package e2e

import (
	"bytes"
	"crypto/sha1" //nolint:gosec // the Agora protocol hash
	"encoding/hex"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/parleyhq/parley/e2e/parleytest"
	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
)

var updateFixtures = flag.Bool("update-fixtures", false, "rewrite the dispatcher's service-protocol state machine fixtures from the registry's answer")

// serviceProtocolDir holds the built-in PDs and, in testdata, the state
// machines the registry parses from them: the dispatcher's engine tests run
// on those fixtures, and this test keeps them true.
const serviceProtocolDir = "../services/dispatcher/internal/serviceprotocol"

// The dispatcher stores the built-in service PDs in the registry when it
// starts, under their hashes, and does so again harmlessly on every start.
func TestServe_registersBuiltinServiceProtocols(t *testing.T) {
	dataDir := t.TempDir()
	for start := range 2 {
		srv := parleytest.Start(t, dataDir)
		conn, err := grpc.NewClient(srv.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(parleytest.Bearer(t)))
		if err != nil {
			t.Fatal(err)
		}
		reg := registryv1.NewRegistryServiceClient(conn)
		for _, name := range []string{"delegate", "allocate", "transact"} {
			content, err := os.ReadFile(filepath.Join(serviceProtocolDir, "pd", name+".md"))
			if err != nil {
				t.Fatal(err)
			}
			sum := sha1.Sum(content) //nolint:gosec // the Agora protocol hash
			hash := hex.EncodeToString(sum[:])
			// Registration runs beside Serve, so poll for it.
			var p *registryv1.Protocol
			deadline := time.Now().Add(30 * time.Second)
			for {
				p, err = reg.GetProtocol(t.Context(), &registryv1.GetProtocolRequest{Name: "protocols/" + hash})
				if err == nil || time.Now().After(deadline) {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			if err != nil {
				t.Fatalf("start %d: GetProtocol(%s %s) error = %v\n%s", start, name, hash, err, srv.Log)
			}
			if !bytes.Equal(p.GetContent(), content) {
				t.Errorf("start %d: GetProtocol(%s) content differs from the PD file", start, name)
			}
			checkFixture(t, p.GetStateMachine(), name)
		}
		if start == 0 {
			// A custom service protocol is a PD like any other: registered,
			// its machine comes back in the same shape the engine runs.
			content, err := os.ReadFile(filepath.Join(serviceProtocolDir, "testdata", "haggle.md"))
			if err != nil {
				t.Fatal(err)
			}
			p, err := reg.CreateProtocol(t.Context(), &registryv1.CreateProtocolRequest{Protocol: &registryv1.Protocol{Content: content}})
			if err != nil {
				t.Fatalf("CreateProtocol(haggle) error = %v", err)
			}
			checkFixture(t, p.GetStateMachine(), "haggle")
		}
		conn.Close()
		// The second start registers the same bytes again without error.
		waitFor(t, srv, "service protocols registered")
		if err := srv.Stop(10 * time.Second); err != nil {
			t.Fatalf("start %d: stop: %v\n%s", start, err, srv.Log)
		}
	}
}

// checkFixture compares the registry's state machine for a PD with the
// dispatcher's fixture of it (or writes the fixture with -update-fixtures).
func checkFixture(t *testing.T, got *registryv1.StateMachine, name string) {
	t.Helper()
	fixture := filepath.Join(serviceProtocolDir, "testdata", name+".json")
	if *updateFixtures {
		b, err := protojson.MarshalOptions{Multiline: true}.Marshal(got)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(fixture, append(b, '\n'), 0o644); err != nil { //nolint:gosec // a committed fixture
			t.Fatal(err)
		}
	}
	raw, err := os.ReadFile(fixture)
	if err != nil {
		t.Fatalf("%v (run with -update-fixtures to write it)", err)
	}
	want := &registryv1.StateMachine{}
	if err := protojson.Unmarshal(raw, want); err != nil {
		t.Fatalf("fixture %s: %v", fixture, err)
	}
	if !proto.Equal(got, want) {
		t.Errorf("the registry's state machine for %s differs from %s; rerun with -update-fixtures and review the diff", name, fixture)
	}
}

func waitFor(t *testing.T, srv *parleytest.Server, line string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(srv.Log.String(), line) {
		if time.Now().After(deadline) {
			t.Fatalf("the server never logged %q:\n%s", line, srv.Log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
