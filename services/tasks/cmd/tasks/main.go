// Command tasks runs the Parley tasks service alone: the Agent Protocol's tasks, steps and artifacts.
//
// Usage:
//
//	tasks [--grpc-addr :9090] [--http-addr :8080] [--data /var/lib/parley] [flags]
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
	"github.com/parleyhq/parley/services/tasks/app"
	"github.com/parleyhq/parley/services/tasks/config"
)

func main() {
	err := run(os.Args[1:], os.Getenv)
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return // --help is an answer, not a failure: exit 0
	}
	fmt.Fprintln(os.Stderr, "tasks:", err)
	os.Exit(1)
}

func run(args []string, getenv func(string) string) error {
	cfg, err := config.Load(args, getenv)
	if err != nil {
		return err
	}
	logger := telemetry.NewLogger(os.Stderr, "tasks", cfg.LogLevel)
	peer, err := serve.PeerOptions(cfg.Flags)
	if err != nil {
		return err
	}
	dispatcherConn, err := grpcclient.Dial(cfg.DispatcherAddr, peer)
	if err != nil {
		return fmt.Errorf("--dispatcher-addr: %w", err)
	}
	defer dispatcherConn.Close()
	peers := app.Peers{Dispatcher: dispatcherConn}
	if cfg.RegistryAddr != "" {
		registryConn, err := grpcclient.Dial(cfg.RegistryAddr, peer)
		if err != nil {
			return fmt.Errorf("--registry-addr: %w", err)
		}
		defer registryConn.Close()
		peers.Registry = registryConn
	}
	a, err := app.New(cfg, logger, peers)
	if err != nil {
		return err
	}
	defer a.Close()
	return serve.RunUntilSignal(cfg.Flags, logger, a)
}
