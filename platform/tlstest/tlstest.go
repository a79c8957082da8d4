// Package tlstest makes certificates for tests: a CA and the certificates
// it issues, ECDSA P-256, valid for an hour, written under t.TempDir().
// Only tests import it.
package tlstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a certificate authority made for one test: ECDSA P-256, valid
// for an hour, written under t.TempDir().
type CA struct {
	// File is the CA certificate in PEM, for --tls-client-ca and --peer-ca.
	File string
	// Pool trusts the CA alone.
	Pool *x509.CertPool
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// Leaf is a certificate the CA issued, with its key, on disk and loaded.
type Leaf struct {
	CertFile, KeyFile string
	TLS               tls.Certificate
}

// NewCA makes a CA named name.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	tmpl := template(t, name)
	tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature
	key := newKey(t)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	ca := &CA{File: filepath.Join(t.TempDir(), "ca.pem"), Pool: x509.NewCertPool(), cert: cert, key: key}
	ca.Pool.AddCert(cert)
	writePEM(t, ca.File, "CERTIFICATE", der)
	return ca
}

// Issue makes a certificate for 127.0.0.1 usable both as a server's and
// as a client's, as a Parley service uses one for both sides.
func (ca *CA) Issue(t testing.TB, name string) Leaf {
	t.Helper()
	key := newKey(t)
	tmpl := template(t, name)
	tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
	tmpl.DNSNames = []string{"localhost"}
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	l := Leaf{CertFile: filepath.Join(dir, name+".pem"), KeyFile: filepath.Join(dir, name+"-key.pem")}
	writePEM(t, l.CertFile, "CERTIFICATE", der)
	writePEM(t, l.KeyFile, "EC PRIVATE KEY", keyDER)
	if l.TLS, err = tls.LoadX509KeyPair(l.CertFile, l.KeyFile); err != nil {
		t.Fatal(err)
	}
	return l
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

// template is a certificate named name, valid from an hour ago for two
// hours, with a random serial number.
func template(t testing.TB, name string) *x509.Certificate {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatal(err)
	}
	return &x509.Certificate{SerialNumber: n, Subject: pkix.Name{CommonName: name}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
}

func writePEM(t testing.TB, file, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}
