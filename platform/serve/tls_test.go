package serve

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// writeSelfSigned writes a certificate for 127.0.0.1 and its key, and
// returns their paths and a pool trusting the certificate.
func writeSelfSigned(t *testing.T) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "parley-test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

func TestRun_tls(t *testing.T) {
	certFile, keyFile, pool := writeSelfSigned(t)
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
	certFile, keyFile, pool := writeSelfSigned(t)
	if _, err := New(Options{Logger: slog.New(slog.DiscardHandler), TLSClientCAFile: certFile}); err == nil {
		t.Error("New with --tls-client-ca but no --tls-cert succeeded, want an error")
	}
	s, err := New(Options{Logger: slog.New(slog.DiscardHandler), TLSCertFile: certFile, TLSKeyFile: keyFile, TLSClientCAFile: certFile})
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
