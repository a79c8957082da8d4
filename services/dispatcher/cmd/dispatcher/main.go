// Command dispatcher runs the Parley dispatcher service alone: Agora envelopes in and out, conversations and routines.
//
// Usage:
//
//	dispatcher [--grpc-addr :9090] [--http-addr :8080] [--data /var/lib/parley] [flags]
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
	"github.com/parleyhq/parley/platform/sysmon"
	"github.com/parleyhq/parley/platform/telemetry"
	"github.com/parleyhq/parley/services/dispatcher/app"
	"github.com/parleyhq/parley/services/dispatcher/config"
)

func main() {
	if app.IsRoutineWorker() {
		os.Exit(app.ServeRoutineWorker())
	}
	// Sysmon's deep sleep costs a server idle between requests many
	// thread switches per request (platform/sysmon).
	if err := sysmon.Reexec(); err != nil {
		fmt.Fprintln(os.Stderr, "dispatcher: going on with sysmon's deep sleep:", err)
	}
	err := run(os.Args[1:], os.Getenv)
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return // --help is an answer, not a failure: exit 0
	}
	fmt.Fprintln(os.Stderr, "dispatcher:", err)
	os.Exit(1)
}

func run(args []string, getenv func(string) string) error {
	cfg, err := config.Load(args, getenv)
	if err != nil {
		return err
	}
	logger := telemetry.NewLogger(os.Stderr, "dispatcher", cfg.LogLevel)
	peer, err := serve.PeerOptions(cfg.Flags)
	if err != nil {
		return err
	}
	registryConn, err := grpcclient.Dial(cfg.RegistryAddr, peer)
	if err != nil {
		return fmt.Errorf("--registry-addr: %w", err)
	}
	defer registryConn.Close()
	negotiatorConn, err := grpcclient.Dial(cfg.NegotiatorAddr, peer)
	if err != nil {
		return fmt.Errorf("--negotiator-addr: %w", err)
	}
	defer negotiatorConn.Close()
	a, err := app.New(cfg, logger, app.Peers{Registry: registryConn, Negotiator: negotiatorConn})
	if err != nil {
		return err
	}
	defer a.Close()
	return serve.RunUntilSignal(cfg.Flags, logger, a)
}
