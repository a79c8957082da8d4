// Command parley is Parley's all-in-one binary: the server, the REST
// gateway, demos and a CLI client for a running server.
//
// Usage:
//
//	parley serve [--data ./data] [--http 127.0.0.1:8080] [--grpc 127.0.0.1:9090] [flags]
//	parley gateway --registry-addr A --dispatcher-addr A --negotiator-addr A --tasks-addr A
//	parley health (--server ADDR | --url URL)
//	parley version
//	parley protocol add|get|list|search|sync [--server ADDR] ...
//	parley agent create|get|update|list|delete|support|unsupport|forget [--server ADDR] ...
//	parley routine set|get|list [--server ADDR] ...
//	parley demo weather [--json] [--queries N] [--llm-provider P --llm-model M]
//
// Client subcommands take --server ADDR, the gRPC address of a running
// server (default 127.0.0.1:9090, environment PARLEY_SERVER).
//
// Server flags fall back to PARLEY_<FLAG> in the environment: PARLEY_DATA,
// PARLEY_HTTP, PARLEY_GRPC, PARLEY_TLS_CERT, and so on. `parley serve --help`
// lists them all.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"

	dispatcherapp "github.com/parleyhq/parley/services/dispatcher/app"
)

func main() {
	if dispatcherapp.IsRoutineWorker() { // the dispatcher's routine workers
		os.Exit(dispatcherapp.ServeRoutineWorker())
	}
	if err := run(os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "parley:", oneLine(err))
		}
		os.Exit(1)
	}
}

// env carries what a subcommand may touch of the outside world.
type env struct {
	getenv func(string) string
	stdout io.Writer
	stderr io.Writer
}

type command struct {
	summary string
	run     func(e env, args []string) error
}

func commands() map[string]command {
	return map[string]command{
		"agent":    {"manage hosted agents and the protocols they support", runAgent},
		"demo":     {"replay a story end to end: weather (Agora weather negotiation)", runDemo},
		"gateway":  {"run the REST gateway in front of separately running services", runGateway},
		"health":   {"check a server's gRPC or HTTP health; exit 0 when serving", runHealth},
		"protocol": {"manage protocol documents in a running registry", runProtocol},
		"routine":  {"set, get or list a hosted agent's routines on a running server", runRoutine},
		"serve":    {"run every service and the gateway in one process", runServe},
		"version":  {"print the version", runVersion},
	}
}

func run(args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	e := env{getenv: getenv, stdout: stdout, stderr: stderr}
	cmds := commands()
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr, cmds)
		if len(args) == 0 {
			return errors.New("missing command")
		}
		return flag.ErrHelp
	}
	c, ok := cmds[args[0]]
	if !ok {
		return fmt.Errorf("unknown command %q (run 'parley help')", args[0])
	}
	return c.run(e, args[1:])
}

func usage(w io.Writer, cmds map[string]command) {
	fmt.Fprintln(w, "Usage: parley <command> [flags]")
	fmt.Fprintln(w, "\nCommands:")
	listCommands(w, cmds)
	fmt.Fprintln(w, "\nRun 'parley <command> --help' for a command's flags.")
}

// listCommands prints cmds with their summaries, one a line, by name.
func listCommands(w io.Writer, cmds map[string]command) {
	for _, n := range slices.Sorted(maps.Keys(cmds)) {
		fmt.Fprintf(w, "  %-10s %s\n", n, cmds[n].summary)
	}
}

// oneLine keeps startup errors to a single line, as operators expect.
func oneLine(err error) string {
	return strings.ReplaceAll(err.Error(), "\n", "; ")
}
