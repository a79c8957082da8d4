// Command negotiator runs the Parley negotiator service alone: LLM providers, protocol negotiation and the cost ledger.
//
// Usage:
//
//	negotiator [--grpc-addr :9090] [--http-addr :8080] [--data /var/lib/parley] [flags]
//
// Every flag falls back to PARLEY_<FLAG> in the environment (PARLEY_DATA,
// PARLEY_GRPC_ADDR, ...). Run with --help for the full list.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/parleyhq/parley/platform/grpcclient"
	"github.com/parleyhq/parley/platform/serve"
	"github.com/parleyhq/parley/platform/telemetry"
	"github.com/parleyhq/parley/services/negotiator/app"
	"github.com/parleyhq/parley/services/negotiator/config"
)

func main() {
	err := run(os.Args[1:], os.Getenv)
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return // --help is an answer, not a failure: exit 0
	}
	fmt.Fprintln(os.Stderr, "negotiator:", err)
	os.Exit(1)
}

func run(args []string, getenv func(string) string) error {
	cfg, err := config.Load(args, getenv)
	if err != nil {
		return err
	}
	logger := telemetry.NewLogger(os.Stderr, "negotiator", cfg.LogLevel)
	a, err := app.New(cfg, logger)
	if err != nil {
		return err
	}
	defer a.Close()
	if cfg.Auth && cfg.RegistryAddr != "" {
		peer, err := serve.PeerOptions(cfg.Flags)
		if err != nil {
			return err
		}
		conn, err := grpcclient.Dial(cfg.RegistryAddr, peer)
		if err != nil {
			return fmt.Errorf("--registry-addr: %w", err)
		}
		defer conn.Close()
		a.CheckKeysAt(conn)
	}
	return serve.RunUntilSignal(cfg.Flags, logger, a)
}
