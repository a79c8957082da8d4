package serve

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// requireClientCerts sets s.tlsConf (the HTTP side) to verify a client
// certificate when one is given, and returns the gRPC side's
// configuration, which requires one, except on the in-process pipe: that
// pipe cannot be reached from outside the process, and its clients
// authenticate with the operator token.
func (s *Server) requireClientCerts(caFile string) (*tls.Config, error) {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("--tls-client-ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--tls-client-ca: %s holds no PEM certificate", caFile)
	}
	s.tlsConf.ClientCAs = pool
	s.tlsConf.ClientAuth = tls.VerifyClientCertIfGiven
	required := s.tlsConf.Clone()
	required.ClientAuth = tls.RequireAndVerifyClientCert
	pipe := s.tlsConf.Clone()
	pipe.ClientAuth = tls.NoClientCert
	required.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
		if hello.Conn != nil && hello.Conn.LocalAddr().Network() == "bufconn" {
			return pipe, nil
		}
		return nil, nil // the required configuration
	}
	return required, nil
}
