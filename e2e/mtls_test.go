package e2e

import (
	"context"
	"crypto/tls"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/parleyhq/parley/e2e/parleytest"
	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/auth"
	"github.com/parleyhq/parley/platform/tlstest"
	"github.com/parleyhq/parley/sdk"
)

// TestSeparateProcesses_mTLS runs the registry, the dispatcher and the
// REST gateway as three processes that accept only clients presenting a
// certificate of the deployment's CA (--tls-client-ca), with certificates
// made inside the test. A client without a certificate, or with one of
// another CA, is refused; the dispatcher's own client of the registry
// presents its certificate (an SDK agent's key is checked through it); a
// caller forwarded by an mTLS peer is held to that caller's rights; and a
// forwarded caller a REST client writes in a header never gets through the
// gateway.
func TestSeparateProcesses_mTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts three binaries")
	}
	ca := tlstest.NewCA(t, "parley-test-ca")
	svc := ca.Issue(t, "services")
	client := ca.Issue(t, "client")
	rogue := tlstest.NewCA(t, "rogue-ca").Issue(t, "rogue")
	for _, key := range []string{svc.KeyFile, client.KeyFile, rogue.KeyFile} {
		parleytest.NoteKeyFile(t, key) // no server may log it (TestMain)
	}
	tlsFlags := []string{"--tls-cert", svc.CertFile, "--tls-key", svc.KeyFile, "--tls-client-ca", ca.File}
	tokenFile := parleytest.OperatorTokenFile(t)

	reg := parleytest.StartProcess(t, parleytest.Build(t, "github.com/parleyhq/parley/services/registry/cmd/registry"),
		append([]string{"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--data", t.TempDir(),
			"--auth", "--operator-token-file", tokenFile}, tlsFlags...)...)
	disp := parleytest.StartProcess(t, parleytest.Build(t, "github.com/parleyhq/parley/services/dispatcher/cmd/dispatcher"),
		append([]string{"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--data", t.TempDir(),
			"--auth", "--operator-token-file", tokenFile,
			"--registry-addr", reg.GRPCAddr, "--negotiator-addr", "127.0.0.1:1"}, tlsFlags...)...) // the negotiator is not used here
	gw := parleytest.StartProcess(t, parleytest.Binary(t), append([]string{"gateway",
		"--http-addr", "127.0.0.1:0", "--registry-addr", reg.GRPCAddr, "--dispatcher-addr", disp.GRPCAddr,
		"--negotiator-addr", "127.0.0.1:1", "--tasks-addr", "127.0.0.1:1",
		// The gateway checks nothing itself here, so that the services'
		// own checks are what a forged forwarded caller meets.
		"--auth=false"}, tlsFlags...)...)

	dial := func(addr string, cert *tls.Certificate, opts ...grpc.DialOption) *grpc.ClientConn {
		t.Helper()
		conf := &tls.Config{RootCAs: ca.Pool, MinVersion: tls.VersionTLS12}
		if cert != nil {
			conf.Certificates = []tls.Certificate{*cert}
		}
		conn, err := grpc.NewClient(addr, append(opts, grpc.WithTransportCredentials(credentials.NewTLS(conf)))...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	ctx := t.Context()

	// Without a certificate of the CA, no call gets through, not even health.
	for _, p := range []struct {
		name string
		addr string
	}{{"registry", reg.GRPCAddr}, {"dispatcher", disp.GRPCAddr}} {
		for _, c := range []struct {
			name string
			cert *tls.Certificate
		}{{"no certificate", nil}, {"another CA's certificate", &rogue.TLS}} {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err := healthpb.NewHealthClient(dial(p.addr, c.cert)).Check(cctx, &healthpb.HealthCheckRequest{})
			cancel()
			if status.Code(err) != codes.Unavailable {
				t.Errorf("%s health with %s = %v, want UNAVAILABLE (handshake refused)", p.name, c.name, err)
			}
		}
	}

	admin := registryv1.NewRegistryServiceClient(dial(reg.GRPCAddr, &client.TLS, grpc.WithPerRPCCredentials(parleytest.Bearer(t))))
	bot, err := admin.CreateAgent(ctx, &registryv1.CreateAgentRequest{Parent: "clients/acme", AgentId: "bot", Agent: &registryv1.Agent{}})
	if err != nil {
		t.Fatalf("CreateAgent over mTLS with the operator token: %v\n%s", err, reg.Log)
	}
	if _, err := admin.CreateAgent(ctx, &registryv1.CreateAgentRequest{Parent: "clients/acme", AgentId: "other", Agent: &registryv1.Agent{}}); err != nil {
		t.Fatal(err)
	}
	key := bot.GetInitialKey().GetSecret()

	// The CLI presents a client certificate with --client-cert.
	whoami := func(certArgs ...string) (string, error) {
		cmd := exec.CommandContext(ctx, parleytest.Binary(t), append([]string{"whoami", "--server", reg.GRPCAddr, "--server-ca", ca.File}, certArgs...)...)
		cmd.Env = append(os.Environ(), "PARLEY_TOKEN="+key)
		out, err := cmd.CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	if out, err := whoami("--client-cert", client.CertFile, "--client-key", client.KeyFile); err != nil || out != "agent acme:bot" {
		t.Errorf("parley whoami with a client certificate = %q, %v; want \"agent acme:bot\"", out, err)
	}
	if out, err := whoami(); err == nil {
		t.Errorf("parley whoami without a client certificate succeeded: %q", out)
	}

	// The dispatcher checks the key at the registry, which requires the
	// dispatcher's client certificate.
	dconn := dial(disp.GRPCAddr, &client.TLS)
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- sdk.Connect(ctx, dconn, bot.GetName(), sdk.Key(key), sdk.OnReady(func() { close(ready) }))
	}()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("SDK Connect over mTLS ended before ready: %v\n%s", err, disp.Log)
	case <-time.After(30 * time.Second):
		t.Fatalf("SDK Connect over mTLS not ready after 30 s\n%s", disp.Log)
	}

	// A caller forwarded by a peer that authenticated with its
	// certificate acts with that caller's rights, no more.
	routines := dispatcherv1.NewDispatcherServiceClient(dconn)
	asBot := metadata.AppendToOutgoingContext(ctx, auth.ForwardedCallerHeader, auth.ForwardedCaller(auth.Principal{Kind: auth.Agent, Client: "clients/acme", Agent: bot.GetName()}))
	if _, err := routines.ListRoutines(asBot, &dispatcherv1.ListRoutinesRequest{Parent: bot.GetName()}); err != nil {
		t.Errorf("ListRoutines of its own agent, forwarded by an mTLS peer: %v", err)
	}
	if _, err := routines.ListRoutines(asBot, &dispatcherv1.ListRoutinesRequest{Parent: "clients/acme/agents/other"}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("ListRoutines of another agent, forwarded as bot by an mTLS peer = %v, want PERMISSION_DENIED", err)
	}

	// Through the gateway, a forwarded caller written in a request header
	// is dropped: the gateway's certificate must not lend it trust.
	https := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool, MinVersion: tls.VersionTLS12}}}
	get := func(header, value string) int {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, "GET", "https://"+gw.HTTPAddr+"/v1/"+bot.GetName()+"/routines", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set(header, value)
		resp, err := https.Do(req)
		if err != nil {
			t.Fatalf("GET through the gateway over HTTPS: %v\n%s", err, gw.Log)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	forged := auth.ForwardedCaller(auth.Principal{Kind: auth.Agent, Client: "clients/acme", Agent: bot.GetName()})
	for _, h := range []string{"Grpc-Metadata-" + auth.ForwardedCallerHeader, auth.ForwardedCallerHeader} {
		if code := get(h, forged); code != http.StatusUnauthorized {
			t.Errorf("GET routines through the gateway with only %s: %s = %d, want 401", h, forged, code)
		}
	}
	if code := get("Authorization", "Bearer "+key); code != http.StatusOK {
		t.Errorf("GET routines through the gateway with the agent's key = %d, want 200\n%s", code, gw.Log)
	}
}
