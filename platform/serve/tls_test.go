package serve

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/parleyhq/parley/platform/tlstest"
)

// writeCert issues a certificate for 127.0.0.1 (server and client
// use) from a new CA, and returns its paths, the CA's file and a pool
// trusting the CA.
func writeCert(t *testing.T) (certFile, keyFile, caFile string, pool *x509.CertPool) {
	t.Helper()
	ca := tlstest.NewCA(t, "parley-test-ca")
	leaf := ca.Issue(t, "parley-test")
	return leaf.CertFile, leaf.KeyFile, ca.File, ca.Pool
}

func TestRun_tls(t *testing.T) {
	certFile, keyFile, _, pool := writeCert(t)
	s, err := New(Options{Logger: slog.New(slog.DiscardHandler), TLSCertFile: certFile, TLSKeyFile: keyFile})
	if err != nil {
		t.Fatal(err)
	}
	r := start(t, s) // its plaintext client is unused here
	httpsURL := "https" + r.baseURL[len("http"):]
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	resp, err := client.Get(httpsURL + "/healthz")
	if err != nil {
		t.Fatalf("GET %s/healthz over TLS: %v", httpsURL, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET /healthz over TLS = %d, want 200", resp.StatusCode)
	}

	conn, err := grpc.NewClient(r.grpcConn.Target(), grpc.WithTransportCredentials(credentials.NewClientTLSFromCert(pool, "")))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hr, err := healthpb.NewHealthClient(conn).Check(t.Context(), &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
	if err != nil || hr.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("TLS gRPC health = %v, %v; want SERVING", hr.GetStatus(), err)
	}

	// The in-process connection must also work against a TLS server.
	inproc, err := s.InProcessConn()
	if err != nil {
		t.Fatal(err)
	}
	defer inproc.Close()
	if _, err := healthpb.NewHealthClient(inproc).Check(t.Context(), &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Errorf("in-process health over TLS: %v", err)
	}
}

// TestRun_mTLS: with --tls-client-ca, a gRPC client must present a
// certificate the CA issued, while the in-process pipe (services of
// `parley serve` calling each other) needs none, and HTTP takes one only
// when given.
func TestRun_mTLS(t *testing.T) {
	certFile, keyFile, caFile, pool := writeCert(t)
	if _, err := New(Options{Logger: slog.New(slog.DiscardHandler), TLSClientCAFile: caFile}); err == nil {
		t.Error("New with --tls-client-ca but no --tls-cert succeeded, want an error")
	}
	s, err := New(Options{Logger: slog.New(slog.DiscardHandler), TLSCertFile: certFile, TLSKeyFile: keyFile, TLSClientCAFile: caFile})
	if err != nil {
		t.Fatal(err)
	}
	r := start(t, s)
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	check := func(conf *tls.Config) error {
		conn, err := grpc.NewClient(r.grpcConn.Target(), grpc.WithTransportCredentials(credentials.NewTLS(conf)))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_, err = healthpb.NewHealthClient(conn).Check(t.Context(), &healthpb.HealthCheckRequest{})
		return err
	}
	if err := check(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}); status.Code(err) != codes.Unavailable {
		t.Errorf("gRPC health without a client certificate = %v, want UNAVAILABLE", err)
	}
	if err := check(&tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}); err != nil {
		t.Errorf("gRPC health with the CA's client certificate: %v", err)
	}
	inproc, err := s.InProcessConn()
	if err != nil {
		t.Fatal(err)
	}
	defer inproc.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second) // generous; a refused handshake would retry until then
	defer cancel()
	if _, err := healthpb.NewHealthClient(inproc).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Errorf("in-process health under mTLS: %v", err)
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	resp, err := client.Get("https" + r.baseURL[len("http"):] + "/healthz")
	if err != nil {
		t.Fatalf("GET /healthz over HTTPS without a client certificate: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET /healthz without a client certificate = %d, want 200", resp.StatusCode)
	}
}
