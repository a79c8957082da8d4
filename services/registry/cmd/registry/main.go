// Command registry runs the Parley registry service alone: protocol
// documents, discovery and the agent directory.
//
// Usage:
//
//	registry [--grpc-addr :9090] [--http-addr :8080] [--data /var/lib/parley] [flags]
//
// Every flag falls back to PARLEY_<FLAG> in the environment (PARLEY_DATA,
// PARLEY_GRPC_ADDR, ...). Run with --help for the full list.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/parleyhq/parley/platform/serve"
	"github.com/parleyhq/parley/platform/telemetry"
	"github.com/parleyhq/parley/services/registry/app"
	"github.com/parleyhq/parley/services/registry/config"
)

func main() {
	err := run(os.Args[1:], os.Getenv)
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return // --help is an answer, not a failure: exit 0
	}
	fmt.Fprintln(os.Stderr, "registry:", err)
	os.Exit(1)
}

func run(args []string, getenv func(string) string) error {
	cfg, err := config.Load(args, getenv)
	if err != nil {
		return err
	}
	logger := telemetry.NewLogger(os.Stderr, "registry", cfg.LogLevel)
	peers, err := app.DialPeers(cfg)
	if err != nil {
		return err
	}
	defer peers.Close()
	a, err := app.New(cfg, logger, peers)
	if err != nil {
		return err
	}
	defer a.Close()
	return serve.RunUntilSignal(cfg.Flags, logger, a)
}
