package e2e

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/parleyhq/parley/e2e/parleytest"
)

// TestSeparateProcesses runs the registry as its own process and the REST
// gateway as another, as docker-compose and Kubernetes do, and drives the
// registry's REST API through the gateway.
func TestSeparateProcesses_registryBehindGateway(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts two binaries")
	}
	reg := parleytest.StartProcess(t, parleytest.Build(t, "github.com/parleyhq/parley/services/registry/cmd/registry"),
		"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--data", t.TempDir(), "--auth=false")
	gw := parleytest.StartProcess(t, parleytest.Binary(t), "gateway",
		"--http-addr", "127.0.0.1:0", "--registry-addr", reg.GRPCAddr,
		// Nothing listens on these in this test; only the registry is used.
		"--dispatcher-addr", "127.0.0.1:1", "--negotiator-addr", "127.0.0.1:1", "--tasks-addr", "127.0.0.1:1",
		"--auth=false") // access control is TestSeparateProcesses_gatewayTokenMode's

	doc := "---\nname: Echo\ndescription: Echo the body.\nmultiround: false\n---\n\nReply with the body you got.\n"
	body, _ := json.Marshal(map[string]any{"content": []byte(doc)})
	resp, err := http.Post(gw.URL("/v1/protocols"), "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	var created struct {
		Sha1Hex string `json:"sha1Hex"`
		Title   string `json:"title"`
	}
	err = json.NewDecoder(resp.Body).Decode(&created)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || created.Title != "Echo" {
		t.Fatalf("POST /v1/protocols via gateway = %d %+v %v, want 200 with title Echo", resp.StatusCode, created, err)
	}

	resp, err = http.Get(gw.URL("/protocols/" + created.Sha1Hex))
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(got) != doc {
		t.Errorf("GET /protocols/%s via gateway = %d %q, want 200 and the exact document", created.Sha1Hex, resp.StatusCode, got)
	}

	// The gateway is not ready while its other peers are down, and says which.
	resp, err = http.Get(gw.URL("/readyz"))
	if err != nil {
		t.Fatal(err)
	}
	rb, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !bytes.Contains(rb, []byte("dispatcher")) {
		t.Errorf("gateway /readyz with peers down = %d %s, want 503 naming dispatcher", resp.StatusCode, rb)
	}

	for _, p := range []*parleytest.Server{gw, reg} {
		if err := p.Stop(5 * time.Second); err != nil {
			t.Errorf("SIGTERM: %v\n%s", err, p.Log)
		}
	}
}
