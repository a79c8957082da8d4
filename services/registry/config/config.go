// Package config loads the registry's configuration from flags, with
// PARLEY_* environment variables as fallbacks.
package config

import (
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/parleyhq/parley/platform/envflag"
	"github.com/parleyhq/parley/platform/serve"
	"github.com/parleyhq/parley/services/registry/internal/fetch"
)

// Config is the registry's configuration.
type Config struct {
	serve.Flags

	// PDMaxBytes caps a protocol document, registered or fetched.
	PDMaxBytes int64
	// PDStrictMetadata rejects documents without name, description and
	// multiround instead of applying the reference library's defaults.
	PDStrictMetadata bool
	// PDCacheBytes caps the in-memory cache of stored documents.
	PDCacheBytes int64

	// FetchAllowHTTP lets protocolSources use plain http.
	FetchAllowHTTP bool
	// FetchAllow lists destinations exempt from the address check: CIDRs,
	// addresses, host names or host:port, comma-separated.
	FetchAllow string
	// FetchConnectTimeout bounds each connection; FetchTimeout one fetch.
	FetchConnectTimeout time.Duration
	FetchTimeout        time.Duration
	// FetchMaxRedirects caps redirects per fetch; FetchMaxSources the
	// sources tried per request.
	FetchMaxRedirects int
	FetchMaxSources   int
	// FetchNegativeTTL is how long a failed (hash, source) is not retried.
	FetchNegativeTTL time.Duration
	// FetchNegativeEntries caps that negative cache.
	FetchNegativeEntries int
	// FetchMaxConcurrent caps URL fetches in flight; FetchMaxPerHost those
	// to one host.
	FetchMaxConcurrent int
	FetchMaxPerHost    int

	// Peers are other registries' gRPC addresses, comma-separated. They are
	// asked for unknown hashes before sources, and SyncProtocols copies
	// from them.
	Peers string
	// PeerCA, when set, dials peers over TLS trusting this PEM bundle.
	PeerCA string
	// PeerSyncInterval, when positive, runs SyncProtocols from every peer
	// that often in the background.
	PeerSyncInterval time.Duration

	// OpenRegistration lets anyone create a client (rate-limited per
	// address), not only the operator.
	OpenRegistration bool
	// RegistrationBurst and RegistrationInterval rate-limit it.
	RegistrationBurst    int
	RegistrationInterval time.Duration
}

// RegisterFlags adds the registry's own flags (not the shared serving flags)
// to fs. The all-in-one `parley serve` calls it too, so names must not clash
// with other services' flags.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.Int64Var(&c.PDMaxBytes, "pd-max-bytes", 256<<10, "largest protocol document accepted, registered or fetched, in bytes")
	fs.BoolVar(&c.PDStrictMetadata, "pd-strict-metadata", false, "reject protocol documents whose metadata lacks name, description or multiround (default: apply defaults)")
	fs.Int64Var(&c.PDCacheBytes, "pd-cache-bytes", 64<<20, "memory for the cache of stored protocol documents, in bytes (0 disables it)")
	fs.BoolVar(&c.FetchAllowHTTP, "pd-fetch-allow-http", false, "allow plain http protocolSources (default: https and data: only)")
	fs.StringVar(&c.FetchAllow, "pd-fetch-allow", "", "comma-separated CIDRs, addresses, hosts or host:port that protocolSources may reach even if internal (default: none)")
	fs.DurationVar(&c.FetchConnectTimeout, "pd-fetch-connect-timeout", 2*time.Second, "time limit for connecting to a protocolSources URL")
	fs.DurationVar(&c.FetchTimeout, "pd-fetch-timeout", 5*time.Second, "time limit for resolving one protocol: peer registries and every protocolSources URL together, redirects and bodies included")
	fs.IntVar(&c.FetchMaxRedirects, "pd-fetch-max-redirects", 3, "redirects followed per protocolSources URL")
	fs.IntVar(&c.FetchMaxSources, "pd-fetch-max-sources", 3, "protocolSources tried per request")
	fs.DurationVar(&c.FetchNegativeTTL, "pd-fetch-negative-ttl", 30*time.Second, "how long a failed (hash, source) is not fetched again (0 disables)")
	fs.IntVar(&c.FetchNegativeEntries, "pd-fetch-negative-entries", 10000, "most failed (hash, source) pairs remembered for --pd-fetch-negative-ttl")
	fs.IntVar(&c.FetchMaxConcurrent, "pd-fetch-max-concurrent", 64, "protocolSources URL fetches in flight at once; more wait up to --pd-fetch-connect-timeout, then fail with RESOURCE_EXHAUSTED")
	fs.IntVar(&c.FetchMaxPerHost, "pd-fetch-max-per-host", 4, "protocolSources URL fetches in flight to one host at once; more wait as for --pd-fetch-max-concurrent")
	fs.StringVar(&c.Peers, "registry-peers", "", "comma-separated gRPC addresses of peer registries asked for unknown protocols and copied by SyncProtocols")
	fs.DurationVar(&c.PeerSyncInterval, "registry-peer-sync-interval", 0, "how often to copy missing protocols from every peer registry in the background (0 disables)")
	fs.StringVar(&c.PeerCA, "registry-peer-ca", "", "PEM CA bundle; when set, dial peer registries over TLS")
	fs.BoolVar(&c.OpenRegistration, "open-registration", false, "let anyone create a client, at most --open-registration-burst per address and then 1 per --open-registration-interval (default: only the operator)")
	fs.IntVar(&c.RegistrationBurst, "open-registration-burst", 3, "clients one remote address may create at once under --open-registration")
	fs.DurationVar(&c.RegistrationInterval, "open-registration-interval", time.Minute, "after the burst, one more client per remote address per this interval")
}

// PeerList returns the configured peer addresses.
func (c *Config) PeerList() []string { return splitList(c.Peers) }

// AllowList returns the fetch allowlist entries.
func (c *Config) AllowList() []string { return splitList(c.FetchAllow) }

func splitList(s string) []string {
	var out []string
	for _, e := range strings.Split(s, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

// maxPDBytes keeps a document, in a gRPC message, under the server's 4 MiB
// message limit.
const maxPDBytes = 3 << 20

// Validate reports every bad value at once.
func (c *Config) Validate() error {
	var errs []error
	if c.DataDir == "" {
		errs = append(errs, errors.New("--data must not be empty"))
	}
	if c.PDMaxBytes <= 0 || c.PDMaxBytes > maxPDBytes {
		errs = append(errs, fmt.Errorf("--pd-max-bytes must be between 1 and %d, got %d", maxPDBytes, c.PDMaxBytes))
	}
	if c.PDCacheBytes < 0 {
		errs = append(errs, fmt.Errorf("--pd-cache-bytes must not be negative, got %d", c.PDCacheBytes))
	}
	if c.FetchConnectTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--pd-fetch-connect-timeout must be positive, got %v", c.FetchConnectTimeout))
	}
	if c.FetchTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--pd-fetch-timeout must be positive, got %v", c.FetchTimeout))
	}
	if c.FetchMaxRedirects < 0 || c.FetchMaxRedirects > 10 {
		errs = append(errs, fmt.Errorf("--pd-fetch-max-redirects must be between 0 and 10, got %d", c.FetchMaxRedirects))
	}
	if c.FetchMaxSources < 1 || c.FetchMaxSources > 10 {
		errs = append(errs, fmt.Errorf("--pd-fetch-max-sources must be between 1 and 10, got %d", c.FetchMaxSources))
	}
	if c.FetchMaxConcurrent < 1 {
		errs = append(errs, fmt.Errorf("--pd-fetch-max-concurrent must be at least 1, got %d", c.FetchMaxConcurrent))
	}
	if c.FetchMaxPerHost < 1 || c.FetchMaxPerHost > c.FetchMaxConcurrent {
		errs = append(errs, fmt.Errorf("--pd-fetch-max-per-host must be between 1 and --pd-fetch-max-concurrent, got %d", c.FetchMaxPerHost))
	}
	if c.FetchNegativeEntries < 1 {
		errs = append(errs, fmt.Errorf("--pd-fetch-negative-entries must be positive, got %d", c.FetchNegativeEntries))
	}
	if c.RegistrationBurst < 1 {
		errs = append(errs, fmt.Errorf("--open-registration-burst must be positive, got %d", c.RegistrationBurst))
	}
	if c.RegistrationInterval <= 0 {
		errs = append(errs, fmt.Errorf("--open-registration-interval must be positive, got %v", c.RegistrationInterval))
	}
	if c.FetchNegativeTTL < 0 {
		errs = append(errs, fmt.Errorf("--pd-fetch-negative-ttl must not be negative, got %v", c.FetchNegativeTTL))
	}
	if c.PeerSyncInterval < 0 {
		errs = append(errs, fmt.Errorf("--registry-peer-sync-interval must not be negative, got %v", c.PeerSyncInterval))
	}
	if _, err := fetch.New(fetch.Options{Allow: c.AllowList()}); err != nil {
		errs = append(errs, fmt.Errorf("--pd-fetch-allow: %w", err))
	}
	return errors.Join(errs...)
}

// doc is the one-service binary's --help.
var doc = envflag.Doc{
	Usage:   "registry [flags]",
	Summary: "Run the Parley registry alone: protocol documents, discovery, the agent directory, clients and keys, follows and client groups.",
	Examples: []string{
		"registry --data /var/lib/parley --operator-token-file /run/parley/operator.token --grpc-addr :9090 --http-addr :8080",
		"PARLEY_DATA=./data/registry PARLEY_OPERATOR_TOKEN_FILE=./data/operator.token registry --grpc-addr 127.0.0.1:9090 --http-addr 127.0.0.1:8080",
	},
	Prefix: "PARLEY_",
}

// Load parses the one-service binary's flags from args, falling back to the
// environment (PARLEY_GRPC_ADDR, PARLEY_DATA, PARLEY_PD_MAX_BYTES, ...).
func Load(args []string, getenv func(string) string) (Config, error) {
	var c Config
	fs := flag.NewFlagSet("registry", flag.ContinueOnError)
	c.Flags.Register(fs, ":9090", ":8080", "/var/lib/parley")
	c.RegisterFlags(fs)
	pos, err := doc.ParseArgs(fs, args, getenv)
	if err != nil {
		return c, err
	}
	if len(pos) > 0 {
		return c, fmt.Errorf("registry takes no arguments, got %q", pos)
	}
	return c, c.Validate()
}
