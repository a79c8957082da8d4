package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/parleyhq/parley/cmd/parley/internal/demo"
	"github.com/parleyhq/parley/platform/envflag"
	negotiatorconfig "github.com/parleyhq/parley/services/negotiator/config"
)

// runDemo runs a demo: `parley demo weather [--json] [--queries N]
// [--nl-queries N] [--negotiation deterministic|llm] [--server ADDR --http URL]
// [--llm-provider ... --llm-model ...]`.
//
// Without --server it starts two in-process Parley suites, Alice's and
// Bob's, each with its own data directory, gRPC and HTTP listeners on
// loopback, and the LLM flags given; the envelopes between them are real
// Agora HTTP. With --server it runs both agents on that running `parley
// serve` (started with --send-allow-private, since Alice sends to its own
// loopback address), whose LLM configuration then applies.
//
// --negotiation llm drops the task's schemas so that the LLMs negotiate the
// PD and write the routines after the natural-language queries: in process
// the demo sets both suites' negotiate threshold to --nl-queries + 1 (unless
// --negotiation-thresholds is given) and promotes LLM-written routines at
// once (--routine-shadow-calls 0) so that the phases stay separate: with the
// default, each routine would first shadow the LLM for 5 calls. A --server
// must be configured the same way (--negotiation-thresholds
// '*@*=1/<nl+1>/10' --routine-shadow-calls 0).
func runDemo(e env, args []string) error {
	if len(args) > 0 && isHelp(args[0]) {
		// One demo so far: its whole help is the group's.
		fmt.Fprintf(e.stdout, "Usage: parley demo <command> [flags]\n\nCommands:\n")
		listCommands(e.stdout, demoCommands())
		fmt.Fprintln(e.stdout)
		return runDemoWeather(e, []string{"--help"})
	}
	return subcommand(e, "demo", args, demoCommands())
}

func demoCommands() map[string]command {
	return map[string]command{
		"weather": {"Alice asks Bob for forecasts: natural language, then a negotiated protocol and routines", runDemoWeather},
	}
}

// demoWeatherDoc is the help of `parley demo weather`.
var demoWeatherDoc = envflag.Doc{
	Usage: "parley demo weather [flags]",
	Summary: "Replay the weather story: Alice's agent asks Bob's for forecasts in natural language (through the LLM), " +
		"they negotiate a protocol, Bob's side writes a routine, and the remaining queries run without the LLM. " +
		"Without --server it starts two in-process Parley servers; with --server it runs both agents on that one, " +
		"which must run with --send-allow-private since Alice sends to its own loopback address.",
	Prefix: "PARLEY_",
	Examples: []string{
		"parley demo weather",
		"parley demo weather --json --queries 100",
		"parley demo weather --server 127.0.0.1:9090 --http http://127.0.0.1:8080   # against parley serve --send-allow-private",
	},
}

func runDemoWeather(e env, args []string) error {
	fs := flag.NewFlagSet("parley demo weather", flag.ContinueOnError)
	fs.SetOutput(e.stdout)
	asJSON := fs.Bool("json", false, "print one JSON summary on stdout instead of progress lines")
	queries := fs.Int("queries", 10, "structured queries after negotiation")
	nlQueries := fs.Int("nl-queries", 3, "natural-language queries before negotiation (need an LLM)")
	server := fs.String("server", "", "gRPC address of a running parley serve to replay the story on (default: two in-process suites)")
	httpURL := fs.String("http", "http://127.0.0.1:8080", "with --server: its HTTP base URL, as the server itself can reach it")
	serverCA := fs.String("server-ca", e.getenv("PARLEY_SERVER_CA"), "with --server: PEM CA bundle to dial it over TLS")
	negotiation := fs.String("negotiation", demo.NegotiationDeterministic, "how the PD is negotiated: deterministic (from the task's JSON Schemas, no LLM) or llm (no schemas: the LLMs negotiate and write the routines; needs an LLM)")
	var cfg negotiatorconfig.Config
	cfg.RegisterFlags(fs)
	if _, err := parseArgs(e, fs, args, demoWeatherDoc); err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	if *queries < 1 || *nlQueries < 1 {
		return fmt.Errorf("--queries and --nl-queries must be at least 1")
	}
	if *negotiation != demo.NegotiationDeterministic && *negotiation != demo.NegotiationLLM {
		return fmt.Errorf("--negotiation must be %s or %s", demo.NegotiationDeterministic, demo.NegotiationLLM)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	opts := demo.Options{NLQueries: *nlQueries, StructuredQueries: *queries, Negotiation: *negotiation}
	if !*asJSON {
		opts.Log = e.stdout
	}
	var sum demo.Summary
	var err error
	if *server != "" {
		sum, err = demoOnServer(ctx, e, opts, *server, *serverCA, *httpURL)
	} else {
		if *negotiation == demo.NegotiationLLM {
			if cfg.LLM.Provider == "" {
				return fmt.Errorf("--negotiation llm needs an LLM (--llm-provider, --llm-model)")
			}
			if cfg.Thresholds == "" {
				cfg.Thresholds = fmt.Sprintf("*@*=1/%d/10", *nlQueries+1)
			}
			cfg.RoutineShadowCalls = 0
		}
		sum, err = demoInProcess(ctx, opts, cfg)
	}
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(sum)
	}
	fmt.Fprintf(e.stdout, "Alice and Bob hold protocol %s (same hash: %v); %s\n", sum.Protocol.AliceSHA1, sum.Protocol.SameHash, sum.Transport)
	return nil
}

func demoOnServer(ctx context.Context, e env, opts demo.Options, addr, ca, httpURL string) (demo.Summary, error) {
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	dial := dialServer(e, fs)
	if err := fs.Parse([]string{"--server", addr, "--server-ca", ca}); err != nil {
		return demo.Summary{}, err
	}
	conn, err := dial()
	if err != nil {
		return demo.Summary{}, err
	}
	defer conn.Close()
	var b [4]byte
	_, _ = rand.Read(b[:])
	opts.AgentSuffix = "-" + hex.EncodeToString(b[:]) // fresh agents each run
	opts.Alice = demo.Endpoint{Conn: conn, HTTPURL: httpURL}
	opts.Bob = opts.Alice
	opts.Transport = "Agora over HTTP through parley serve at " + httpURL + " (Alice and Bob on one server)"
	return demo.Weather(ctx, opts)
}

// demoInProcess runs the story between two in-process suites.
func demoInProcess(ctx context.Context, opts demo.Options, neg negotiatorconfig.Config) (_ demo.Summary, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var stops []func() error
	defer func() {
		cancel()
		for _, stop := range stops {
			err = errors.Join(err, stop())
		}
	}()
	start := func(name string) (demo.Endpoint, error) {
		dir, err := os.MkdirTemp("", "parley-demo-"+name)
		if err != nil {
			return demo.Endpoint{}, err
		}
		stops = append(stops, func() error { return os.RemoveAll(dir) })
		cfg, err := loadSuiteConfig(env{getenv: func(string) string { return "" }, stdout: io.Discard}, []string{"--data", dir, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--log-level", "error", "--send-allow-private"})
		if err != nil {
			return demo.Endpoint{}, err
		}
		cfg.negotiator.LLM = neg.LLM
		cfg.negotiator.Thresholds, cfg.negotiator.RoutineShadowCalls = neg.Thresholds, neg.RoutineShadowCalls
		s, err := newSuite(ctx, cfg)
		if err != nil {
			return demo.Endpoint{}, err
		}
		gl, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			s.Close()
			return demo.Endpoint{}, err
		}
		hl, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			gl.Close()
			s.Close()
			return demo.Endpoint{}, err
		}
		done := make(chan error, 1)
		go func() { done <- s.srv.Run(ctx, gl, hl) }()
		conn, err := s.srv.InProcessConn()
		if err != nil {
			return demo.Endpoint{}, err
		}
		// Stops run after cancel: close the client, wait for Run, close the suite.
		stops = append([]func() error{func() error { conn.Close(); return errors.Join(<-done, s.Close()) }}, stops...)
		return demo.Endpoint{Conn: conn, HTTPURL: "http://" + hl.Addr().String()}, nil
	}
	if opts.Alice, err = start("alice"); err != nil {
		return demo.Summary{}, fmt.Errorf("start Alice's server: %w", err)
	}
	if opts.Bob, err = start("bob"); err != nil {
		return demo.Summary{}, fmt.Errorf("start Bob's server: %w", err)
	}
	opts.Transport = "Agora over HTTP between two in-process Parley suites (Alice's at " + opts.Alice.HTTPURL + ", Bob's at " + opts.Bob.HTTPURL + ")"
	return demo.Weather(ctx, opts)
}
