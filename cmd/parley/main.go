// Command parley is Parley's all-in-one binary: the server, the REST
// gateway, demos and a CLI client for a running server.
//
// Usage:
//
//	parley serve [--data ./data] [--http-addr 127.0.0.1:8080] [--grpc-addr 127.0.0.1:9090] [flags]
//	parley gateway --registry-addr A --dispatcher-addr A --negotiator-addr A --tasks-addr A
//	parley health (--server ADDR | --url URL)
//	parley version
//	parley protocol add|get|list|search|sync [--server ADDR] ...
//	parley agent create|get|update|owner|list|delete|support|unsupport|forget [--server ADDR] ...
//	parley routine set|get|list [--server ADDR] ...
//	parley whoami [--token T]   who the credential is (GetCaller)
//	parley keygen FILE; parley approve --key FILE --dialogue D --payee C:A --amount-micros N
//	parley follow|unfollow CLIENT:AGENT [--as CLIENT:AGENT]
//	parley group create|get|join|leave|search|list|members|requests|invite|accept|reject|invites|accept-invite|reject-invite ...
//	parley demo weather [--json] [--queries N] [--llm-provider P --llm-model M]
//	parley demo market [--json] [--window 2s] [--server ADDR]
//
// Client subcommands take --server ADDR, the gRPC address of a running
// server (default 127.0.0.1:9090, environment PARLEY_SERVER).
//
// Server flags fall back to PARLEY_<FLAG> in the environment: PARLEY_DATA,
// PARLEY_HTTP, PARLEY_GRPC, PARLEY_TLS_CERT, and so on. `parley serve --help`
// lists them all. `parley serve` re-executes itself once at start (same PID)
// with schedtrace=2147483647 added to GODEBUG, keeping Go's sysmon out of
// deep sleep (platform/sysmon); GODEBUG=schedtrace=0 keeps the runtime's
// default.
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

	"github.com/parleyhq/parley/platform/envflag"
	"github.com/parleyhq/parley/platform/sysmon"
	dispatcherapp "github.com/parleyhq/parley/services/dispatcher/app"
)

func main() {
	if dispatcherapp.IsRoutineWorker() { // the dispatcher's routine workers
		os.Exit(dispatcherapp.ServeRoutineWorker())
	}
	if len(os.Args) > 1 && os.Args[1] == "serve" {
		// Sysmon's deep sleep costs a server idle between requests
		// many thread switches per request (platform/sysmon).
		if err := sysmon.Reexec(); err != nil {
			fmt.Fprintln(os.Stderr, "parley: going on with sysmon's deep sleep:", err)
		}
	}
	err := run(os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "parley:", oneLine(err))
	}
	os.Exit(exitCode(err))
}

// exitCode is 0 for success and --help, 2 for a command line the command
// cannot accept, and 1 for a failure.
func exitCode(err error) int {
	var ue *envflag.UsageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		return 2
	default:
		return 1
	}
}

// usageErrorf is a command-line mistake: exit status 2.
func usageErrorf(format string, args ...any) error {
	return &envflag.UsageError{Err: fmt.Errorf(format, args...)}
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

// groups are the commands that take a subcommand, with their subcommands.
func groups() map[string]map[string]command {
	return map[string]map[string]command{
		"agent":    agentCommands(),
		"client":   clientCommands(),
		"demo":     demoCommands(),
		"group":    groupCommands(),
		"protocol": protocolCommands(),
		"routine":  routineCommands(),
	}
}

func commands() map[string]command {
	return map[string]command{
		"agent":     {"manage hosted agents and the protocols they support", runAgent},
		"approve":   {"sign an owner's approval of an acceptance with a key from parley keygen; prints it as JSON", runApprove},
		"broadcast": {"broadcast a one-way message from your agent to groups", runBroadcast},
		"client":    {"create clients, the accounts that own agents", runClient},
		"demo":      {"replay a story end to end: weather (Agora weather negotiation)", runDemo},
		"follow":    {"make your agent (its key in --token) follow AGENT, so AGENT may start dialogues with it", runFollow},
		"gateway":   {"run the REST gateway in front of separately running services", runGateway},
		"group":     {"create, join, search and administer the agent network's groups, as your agent", runGroup},
		"health":    {"check a server's gRPC or HTTP health; exit 0 when serving", runHealth},
		"keygen":    {"make an owner's Ed25519 approval key pair (private key file, public key on stdout)", runKeygen},
		"listen":    {"receive your agent's messages (its key in --token), one JSON object per line, acknowledging each", runListen},
		"protocol":  {"manage protocol documents in a running registry", runProtocol},
		"reply":     {"answer a message your agent received (--all: every recipient of it too)", runReply},
		"send":      {"send a message from your agent, opening a dialogue; prints its ids and refusals as JSON", runSend},
		"unfollow":  {"make your agent (its key in --token) stop following AGENT", runUnfollow},
		"routine":   {"set, get or list a hosted agent's routines on a running server", runRoutine},
		"serve":     {"run every service and the gateway in one process", runServe},
		"version":   {"print the version", runVersion},
		"whoami":    {"print who --token (or PARLEY_TOKEN) identifies: agent, client or operator", runWhoami},
	}
}

func run(args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	e := env{getenv: getenv, stdout: stdout, stderr: stderr}
	cmds := commands()
	if len(args) == 0 {
		usage(stderr, cmds)
		return usageErrorf("missing command")
	}
	if isHelp(args[0]) {
		usage(stdout, cmds)
		return flag.ErrHelp
	}
	c, ok := cmds[args[0]]
	if !ok {
		return usageErrorf("unknown command %q (run 'parley help')", args[0])
	}
	return c.run(e, args[1:])
}

// isHelp reports whether arg asks for help.
func isHelp(arg string) bool {
	return arg == "-h" || arg == "--help" || arg == "help"
}

func usage(w io.Writer, cmds map[string]command) {
	fmt.Fprintln(w, "Usage: parley <command> [flags]")
	fmt.Fprintln(w, "\nCommands:")
	listCommands(w, cmds)
	fmt.Fprintln(w, "\nExamples:")
	fmt.Fprintln(w, "  parley serve --data ./data          # every service on 127.0.0.1:9090 (gRPC) and :8080 (HTTP)")
	fmt.Fprintln(w, "  parley agent create acme:weather   # a hosted agent on that server")
	fmt.Fprintln(w, "  parley demo weather                # the Agora story end to end, in process")
	fmt.Fprintln(w, "  parley demo market --json          # allocate and transact among five suppliers, in process")
	fmt.Fprintln(w, "\nRun 'parley <command> --help' for a command's arguments and flags.")
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
