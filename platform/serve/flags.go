package serve

import (
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/parleyhq/parley/platform/envflag"
)

// Flags are the serving flags every Parley binary shares. Service-specific
// flags are registered by each service's config package.
type Flags struct {
	GRPCAddr string
	HTTPAddr string
	DataDir  string
	TLSCert  string
	TLSKey   string
	// TLSClientCA, with TLSCert, makes the gRPC listener require a client
	// certificate issued by this CA (mTLS between services); peer clients
	// then present TLSCert.
	TLSClientCA string
	// PeerCA is the CA bundle a one-service binary or `parley gateway`
	// trusts when dialling its peers over TLS [TLSClientCA].
	PeerCA string
	// PeerReadyTimeout is how long a call of a one-service binary (or
	// `parley gateway`) to a peer service waits for a connection to it, so
	// that a peer starting or restarting delays calls instead of failing
	// them (grpcclient.Options.ReadyTimeout).
	PeerReadyTimeout time.Duration
	PublicURL        string
	LogLevel         string
	ShutdownTimeout  time.Duration
	// OperatorTokenFile holds the operator token; empty means
	// DataDir/operator.token, written on first start.
	OperatorTokenFile string
	// Auth switches access control on (auth.ParleyPolicy on every call);
	// MetricsPublic then leaves /metrics open.
	Auth           bool
	MetricsPublic  bool
	MaxConnections int
	// DatabaseURL selects the PostgreSQL backend (several replicas on one
	// database); empty keeps the bbolt files in DataDir. It may hold a
	// password: never log it.
	DatabaseURL string
}

// Register adds the shared flags to fs, with the same names in every
// binary: --grpc-addr and --http-addr (--grpc and --http, the old spelling
// of `parley serve`, stay as deprecated aliases). Only the defaults differ
// between the all-in-one binary (loopback) and one-service binaries (all
// interfaces).
func (f *Flags) Register(fs *flag.FlagSet, grpcDefault, httpDefault, dataDefault string) {
	fs.StringVar(&f.GRPCAddr, "grpc-addr", grpcDefault, "gRPC listen address (port 0 picks a free port)")
	fs.StringVar(&f.HTTPAddr, "http-addr", httpDefault, "HTTP listen address for the REST gateway, health and metrics (port 0 picks a free port)")
	envflag.Alias(fs, "grpc", "grpc-addr")
	envflag.Alias(fs, "http", "http-addr")
	fs.StringVar(&f.DataDir, "data", dataDefault, "data directory; each service keeps one bbolt file there")
	fs.StringVar(&f.DatabaseURL, "database-url", "", "PostgreSQL URL (postgres://user:password@host:5432/db): the stores live there instead of in --data's bbolt files, so several replicas can share them. secret: prefer PARLEY_DATABASE_URL")
	fs.StringVar(&f.TLSCert, "tls-cert", "", "PEM certificate file; with --tls-key, serve HTTPS and TLS gRPC")
	fs.StringVar(&f.TLSKey, "tls-key", "", "PEM private key file for --tls-cert")
	fs.StringVar(&f.TLSClientCA, "tls-client-ca", "", "PEM CA bundle `file`; with --tls-cert, gRPC clients must present a certificate it issued (mTLS), HTTP clients may, and calls to peer services present --tls-cert")
	fs.StringVar(&f.PeerCA, "peer-ca", "", "PEM CA bundle `file` trusted for peer services' certificates; when set (or --tls-client-ca is), peers are dialled over TLS (default: --tls-client-ca)")
	fs.DurationVar(&f.PeerReadyTimeout, "peer-ready-timeout", 10*time.Second, "how long a call to a peer service waits for a connection to it, while the peer starts or restarts (one-service binaries and parley gateway)")
	fs.StringVar(&f.PublicURL, "public-url", "", "public base URL of the HTTP side (https://parley.example.com), used in absolute links such as protocolSources")
	f.LogLevel = "info"
	fs.Var(logLevel{&f.LogLevel}, "log-level", "log level: debug, info, warn or error")
	fs.DurationVar(&f.ShutdownTimeout, "shutdown-timeout", 10*time.Second, "how long a graceful shutdown may take before connections are cut")
	fs.BoolVar(&f.Auth, "auth", true, "check every call against the access policy: keys issued by the registry, or the operator token (a one-service binary then needs --operator-token-file)")
	fs.BoolVar(&f.MetricsPublic, "metrics-public", false, "with --auth, serve /metrics to anyone instead of the operator only")
	fs.StringVar(&f.OperatorTokenFile, "operator-token-file", "", "file holding the operator token (default: <data>/operator.token, written with mode 0600 on first start)")
	fs.IntVar(&f.MaxConnections, "max-connections", 400, "open connections allowed on each listener (gRPC and HTTP); more are refused. keep twice this under the open-file limit")
}

// logLevel is a flag.Value accepting only the levels telemetry.NewLogger
// knows, so a typo is reported instead of silently meaning info.
type logLevel struct{ p *string }

func (l logLevel) String() string {
	if l.p == nil {
		return ""
	}
	return *l.p
}

func (l logLevel) Set(v string) error {
	switch lv := strings.ToLower(v); lv {
	case "debug", "info", "warn", "error":
		*l.p = lv
		return nil
	default:
		return fmt.Errorf("unknown log level %q: want debug, info, warn or error", v)
	}
}
