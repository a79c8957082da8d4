package main

// Shared plumbing of the client subcommands (`parley protocol ...`,
// `parley agent ...`, and any later ones): the --server flag, dialing, flags
// after positional arguments, and repeatable flags.
//
// A subcommand uses it like this:
//
//	fs := flag.NewFlagSet("parley thing do", flag.ContinueOnError)
//	dial := dialServer(e, fs)                   // adds --server
//	args, err := parseArgs(e, fs, args, doc)    // flags may follow positionals; doc is the --help
//	conn, err := dial()
//	defer conn.Close()
//	ctx, cancel := callContext()
//	defer cancel()

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

	"github.com/parleyhq/parley/platform/envflag"
	"github.com/parleyhq/parley/platform/grpcclient"
	"github.com/parleyhq/parley/platform/grpcerr"
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
func dialServer(e env, fs *flag.FlagSet) func() (*serverConn, error) {
	def := e.getenv("PARLEY_SERVER")
	if def == "" {
		def = defaultServer
	}
	addr := fs.String("server", def, "gRPC `address` of a running Parley server")
	ca := fs.String("server-ca", e.getenv("PARLEY_SERVER_CA"), "PEM CA bundle `file`; when set, dial the server over TLS")
	cert := fs.String("client-cert", e.getenv("PARLEY_CLIENT_CERT"), "PEM client certificate `file`, with --server-ca and --client-key, for a server run with --tls-client-ca (mTLS)")
	key := fs.String("client-key", e.getenv("PARLEY_CLIENT_KEY"), "PEM private key `file` of --client-cert")
	// No default from $PARLEY_TOKEN: help prints defaults, and this one is
	// a secret. The variable is read when dialing instead.
	token := fs.String("token", "", "credential sent with every call: a client or agent key, or the operator token (`<data>/operator.token`)")
	return func() (*serverConn, error) {
		if *token == "" {
			*token = e.getenv("PARLEY_TOKEN")
		}
		conn, err := grpcclient.Dial(*addr, grpcclient.Options{CAFile: *ca, CertFile: *cert, KeyFile: *key, Token: strings.TrimSpace(*token)})
		if err != nil {
			return nil, fmt.Errorf("--server %s: %w", *addr, err)
		}
		return &serverConn{ClientConn: conn, addr: *addr}, nil
	}
}

// serverConn is the connection to --server. It rewrites the two errors a
// new user meets first, a server that is not there and a server that does
// not host the service called, into one line that says what to change.
type serverConn struct {
	*grpc.ClientConn
	addr string
}

func (c *serverConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	return c.explain(method, c.ClientConn.Invoke(ctx, method, args, reply, opts...))
}

func (c *serverConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	s, err := c.ClientConn.NewStream(ctx, desc, method, opts...)
	return s, c.explain(method, err)
}

// serviceHomes says, per gRPC service, which part of Parley hosts it.
var serviceHomes = map[string]string{
	"parley.registry.v1.RegistryService":     "the registry",
	"parley.dispatcher.v1.DispatcherService": "the dispatcher",
	"parley.negotiator.v1.NegotiatorService": "the negotiator",
	"parley.tasks.v1.TasksService":           "the tasks service",
}

// explain rewrites err from calling method (/pkg.Service/Method).
func (c *serverConn) explain(method string, err error) error {
	st, ok := status.FromError(err)
	if err == nil || !ok {
		return err
	}
	service := strings.TrimPrefix(method, "/")
	service, _, _ = strings.Cut(service, "/")
	switch {
	case st.Code() == codes.Unavailable && c.answered(err):
		// The server is there; something it needs (a peer service, its
		// shutdown) is not, and its message says what.
		return fmt.Errorf("the server at %s answered but cannot serve the call now: %s", c.addr, st.Message())
	case st.Code() == codes.Unavailable:
		return fmt.Errorf("cannot reach a Parley server at %s (%s): start one with 'parley serve', or point --server (or PARLEY_SERVER) at its gRPC address", c.addr, reachCause(st.Message()))
	case st.Code() == codes.Unimplemented && strings.HasPrefix(st.Message(), "unknown service"):
		home := serviceHomes[service]
		if home == "" {
			home = "another Parley service"
		}
		return fmt.Errorf("the server at %s does not host %s (%s): 'parley serve' hosts every service on its --grpc-addr address (default %s); in a split deployment, point --server (or PARLEY_SERVER) at the process running %s", c.addr, service, home, defaultServer, home)
	case st.Code() == codes.Unauthenticated:
		return fmt.Errorf("the server at %s refused the credential: %s; set --token (or PARLEY_TOKEN) to a key, or to the operator token in the server's data directory (operator.token)", c.addr, st.Message())
	}
	return err
}

// answered reports whether err, an UNAVAILABLE status, came from the
// server rather than from failing to reach it: our services give their
// own UNAVAILABLE errors a reason (REGISTRY_UNAVAILABLE and the like), and
// a connection that is up means the server answered.
func (c *serverConn) answered(err error) bool {
	return grpcerr.Reason(err) != "" || c.GetState() == connectivity.Ready
}

// reachCause names why a dial failed in a few words, from the transport's
// message, without its addresses and resolver details.
func reachCause(msg string) string {
	cause := "unavailable"
	for _, k := range []string{"connection refused", "no such host", "i/o timeout", "deadline exceeded", "connection reset", "handshake"} {
		if strings.Contains(msg, k) {
			cause = k
		}
	}
	return cause
}

// callContext returns the context for one client call.
func callContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), callTimeout)
}

// clientEnv names the variables client subcommands read: only the
// connection flags, so that an unrelated PARLEY_* setting never changes
// what a command does.
var clientEnv = map[string]string{"server": "PARLEY_SERVER", "server-ca": "PARLEY_SERVER_CA", "client-cert": "PARLEY_CLIENT_CERT", "client-key": "PARLEY_CLIENT_KEY", "token": "PARLEY_TOKEN"}

// clientDoc is the help of a client subcommand.
func clientDoc(usage, summary string, args []envflag.Arg, examples ...string) envflag.Doc {
	return envflag.Doc{Usage: usage, Summary: summary, Args: args, Examples: examples, Env: clientEnv}
}

// The positional arguments client subcommands share.
var (
	argAgent = envflag.Arg{Name: "CLIENT:AGENT", Help: "a hosted agent, as client:agent (or clients/CLIENT/agents/AGENT)"}
	argHash  = envflag.Arg{Name: "HASH", Help: "a protocol document's SHA-1, 40 hex or 28 base64 characters"}
)

// parseArgs parses fs from args, allowing flags before, between and after
// positional arguments (`parley agent support a:b HASH --source URL`). An
// argument "--" ends flag parsing. It returns the positional arguments, of
// which there must be as many as doc.Args names. --help prints doc to
// stdout and returns flag.ErrHelp.
func parseArgs(e env, fs *flag.FlagSet, args []string, doc envflag.Doc) ([]string, error) {
	fs.SetOutput(e.stdout)
	pos, err := doc.ParseArgs(fs, args, e.getenv)
	if err != nil {
		return nil, err
	}
	if len(pos) != len(doc.Args) {
		return nil, usageErrorf("usage: %s (run '%s --help')", doc.Usage, fs.Name())
	}
	return pos, nil
}

// agentConn parses fs from args with doc's positional arguments, the first
// an agent, and dials --server. It returns the connection (the caller
// closes it), the agent's resource name and the positional arguments.
func agentConn(e env, fs *flag.FlagSet, args []string, doc envflag.Doc) (*serverConn, string, []string, error) {
	dial := dialServer(e, fs)
	args, err := parseArgs(e, fs, args, doc)
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
	if len(args) == 0 || isHelp(args[0]) {
		w := e.stdout
		if len(args) == 0 {
			w = e.stderr
		}
		fmt.Fprintf(w, "Usage: parley %s <command> [arguments] [flags]\n\nCommands:\n", group)
		listCommands(w, subs)
		fmt.Fprintf(w, "\nRun 'parley %s <command> --help' for a command's arguments, flags and examples.\n", group)
		if len(args) == 0 {
			return usageErrorf("parley %s needs a command", group)
		}
		return flag.ErrHelp
	}
	c, ok := subs[args[0]]
	if !ok {
		return usageErrorf("unknown command %q (run 'parley %s help')", "parley "+group+" "+args[0], group)
	}
	return c.run(e, args[1:])
}
