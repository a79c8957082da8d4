package main

// Shared plumbing of the client subcommands (`parley protocol ...`,
// `parley agent ...`, and any later ones): the --server flag, dialing, flags
// after positional arguments, and repeatable flags.
//
// A subcommand uses it like this:
//
//	fs := flag.NewFlagSet("parley thing do", flag.ContinueOnError)
//	dial := dialServer(e, fs)                               // adds --server
//	args, err := parseArgs(fs, args, e.stderr, 1, "THING")  // flags may follow positionals
//	conn, err := dial()
//	defer conn.Close()
//	ctx, cancel := callContext()
//	defer cancel()

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"google.golang.org/grpc"

	"github.com/parleyhq/parley/platform/grpcclient"
)

// defaultServer is the gRPC address client subcommands dial without
// --server or PARLEY_SERVER: where `parley serve` listens by default.
const defaultServer = "127.0.0.1:9090"

// callTimeout bounds one client call.
const callTimeout = 30 * time.Second

// dialServer registers --server (default $PARLEY_SERVER, else
// 127.0.0.1:9090) and --server-ca on fs, and returns a function that dials
// the server once fs is parsed. The connection is plaintext unless
// --server-ca names a PEM CA bundle. The caller closes it.
func dialServer(e env, fs *flag.FlagSet) func() (*grpc.ClientConn, error) {
	def := e.getenv("PARLEY_SERVER")
	if def == "" {
		def = defaultServer
	}
	addr := fs.String("server", def, "gRPC address of a running Parley server (environment PARLEY_SERVER)")
	ca := fs.String("server-ca", e.getenv("PARLEY_SERVER_CA"), "PEM CA bundle; when set, dial the server over TLS (environment PARLEY_SERVER_CA)")
	return func() (*grpc.ClientConn, error) {
		conn, err := grpcclient.Dial(*addr, grpcclient.Options{CAFile: *ca})
		if err != nil {
			return nil, fmt.Errorf("--server %s: %w", *addr, err)
		}
		return conn, nil
	}
}

// callContext returns the context for one client call.
func callContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), callTimeout)
}

// parseArgs parses fs from args, allowing flags before, between and after
// positional arguments (`parley agent support a:b HASH --source URL`). An
// argument "--" ends flag parsing. It returns the positional arguments, of
// which there must be n (usage names them for the error). Usage errors and
// -h print fs's defaults to stderr.
func parseArgs(fs *flag.FlagSet, args []string, stderr io.Writer, n int, usage string) ([]string, error) {
	fs.SetOutput(stderr)
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		if rest[0] == "--" {
			pos = append(pos, rest[1:]...)
			break
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
	if len(pos) != n {
		return nil, fmt.Errorf("usage: %s %s", fs.Name(), usage)
	}
	return pos, nil
}

// agentConn parses fs from args with nargs positional arguments, the first
// an AGENT, and dials --server. It returns the connection (the caller
// closes it), the agent's resource name and the positional arguments.
func agentConn(e env, fs *flag.FlagSet, args []string, nargs int, usage string) (*grpc.ClientConn, string, []string, error) {
	dial := dialServer(e, fs)
	args, err := parseArgs(fs, args, e.stderr, nargs, usage)
	if err != nil {
		return nil, "", nil, err
	}
	name, err := agentName(args[0])
	if err != nil {
		return nil, "", nil, err
	}
	conn, err := dial()
	if err != nil {
		return nil, "", nil, err
	}
	return conn, name, args, nil
}

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

// subcommand dispatches `parley <group> <sub> ...` to subs.
func subcommand(e env, group string, args []string, subs map[string]command) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprintf(e.stderr, "Usage: parley %s <command> [flags]\n\nCommands:\n", group)
		listCommands(e.stderr, subs)
		if len(args) == 0 {
			return fmt.Errorf("parley %s needs a command", group)
		}
		return flag.ErrHelp
	}
	c, ok := subs[args[0]]
	if !ok {
		return fmt.Errorf("unknown command %q (run 'parley %s help')", "parley "+group+" "+args[0], group)
	}
	return c.run(e, args[1:])
}
