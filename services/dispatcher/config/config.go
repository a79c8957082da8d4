// Package config loads the dispatcher's configuration from flags, with
// PARLEY_* environment variables as fallbacks.
package config

import (
	"errors"
	"flag"

	"github.com/parleyhq/parley/platform/envflag"
	"github.com/parleyhq/parley/platform/serve"
)

// Config is the dispatcher's configuration.
type Config struct {
	serve.Flags

	// RegistryAddr is the registry gRPC address (one-service binary only;
	// `parley serve` connects in-process).
	RegistryAddr string
	// NegotiatorAddr is the negotiator gRPC address (one-service binary only;
	// `parley serve` connects in-process).
	NegotiatorAddr string
}

// RegisterFlags adds the dispatcher's own flags (not the shared serving flags)
// to fs. The all-in-one `parley serve` calls it too, so names must not clash
// with other services' flags.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {}

// Validate reports every bad value at once.
func (c *Config) Validate() error {
	var errs []error
	if c.DataDir == "" {
		errs = append(errs, errors.New("--data must not be empty"))
	}
	return errors.Join(errs...)
}

// Load parses the one-service binary's flags from args, falling back to the
// environment (PARLEY_GRPC_ADDR, PARLEY_DATA, ...).
func Load(args []string, getenv func(string) string) (Config, error) {
	var c Config
	fs := flag.NewFlagSet("dispatcher", flag.ContinueOnError)
	c.Flags.Register(fs, "grpc-addr", ":9090", "http-addr", ":8080", "/var/lib/parley")
	c.RegisterFlags(fs)
	fs.StringVar(&c.RegistryAddr, "registry-addr", "dns:///registry:9090", "registry gRPC address")
	fs.StringVar(&c.NegotiatorAddr, "negotiator-addr", "dns:///negotiator:9090", "negotiator gRPC address")
	if err := envflag.Parse(fs, args, "PARLEY_", getenv); err != nil {
		return c, err
	}
	return c, c.Validate()
}
