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
	"math"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/parleyhq/parley/cmd/parley/internal/demo"
	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/envflag"
	"github.com/parleyhq/parley/platform/grpcerr"
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
		// Two demos: the group's help is both of theirs.
		fmt.Fprintf(e.stdout, "Usage: parley demo <command> [flags]\n\nCommands:\n")
		listCommands(e.stdout, demoCommands())
		fmt.Fprintln(e.stdout)
		if err := runDemoWeather(e, []string{"--help"}); !errors.Is(err, flag.ErrHelp) {
			return err
		}
		fmt.Fprintln(e.stdout)
		return runDemoMarket(e, []string{"--help"})
	}
	return subcommand(e, "demo", args, demoCommands())
}

func demoCommands() map[string]command {
	return map[string]command{
		"weather": {"Alice asks Bob for forecasts: natural language, then a negotiated protocol and routines", runDemoWeather},
		"market":  {"a buyer and five suppliers trade: allocate, then transact with fallbacks, payment and a signed approval", runDemoMarket},
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
		"PARLEY_TOKEN=$(cat data/operator.token) parley demo weather --server 127.0.0.1:9090 --http http://127.0.0.1:8080   # against parley serve --send-allow-private",
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
	saved := computeSavings(sum)
	if *asJSON {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(struct {
			demo.Summary
			Saved savings `json:"saved"`
		}{sum, saved})
	}
	fmt.Fprintf(e.stdout, "Alice and Bob hold protocol %s (same hash: %v); %s\n", sum.Protocol.AliceSHA1, sum.Protocol.SameHash, sum.Transport)
	fmt.Fprintln(e.stdout, saved)
	return nil
}

// nlCallsPerQuery is the LLM calls one natural-language weather exchange
// takes: Alice composes, Bob asks for his tool, then replies (counted by
// TestDemoWeather_scriptedLLM).
const nlCallsPerQuery = 3

// savings is what the negotiated protocol saved against natural language
// over the queries that followed negotiation (the first structured query
// included): positive when Parley was cheaper.
type savings struct {
	Queries  int     `json:"queries"`
	LLMCalls int64   `json:"llmCalls"`
	USD      float64 `json:"usd"`
	// Basis says where the natural-language figures come from.
	Basis string `json:"basis"`
}

// computeSavings compares what the queries after negotiation cost
// (negotiation, routines, structured queries) with what natural language
// would have cost for as many queries: the measured per-query cost and
// calls when the natural-language phase ran, else the paper's 0.020 USD
// and the demo's 3 calls per exchange.
func computeSavings(sum demo.Summary) savings {
	var s savings
	var spentCalls int64
	var spentUSD float64
	callsPerQuery := float64(nlCallsPerQuery)
	s.Basis = fmt.Sprintf("natural language at the paper's %.3f USD and %d LLM calls per query", demo.PaperNLCostUSD, nlCallsPerQuery)
	for _, p := range sum.Phases {
		switch p.Name {
		case "natural-language":
			if !p.Skipped && p.Queries > 0 && p.CostUSD > 0 {
				callsPerQuery = float64(p.LLMCalls) / float64(p.Queries)
				s.Basis = fmt.Sprintf("natural language as measured: %.4f USD and %.1f LLM calls per query", sum.NLCostPerQueryUSD, callsPerQuery)
			}
		case "negotiation", "structured":
			s.Queries += p.Queries
			fallthrough
		case "routines":
			spentCalls += p.LLMCalls
			spentUSD += p.CostUSD
		}
	}
	s.LLMCalls = int64(math.Round(callsPerQuery*float64(s.Queries))) - spentCalls
	s.USD = sum.NLCostPerQueryUSD*float64(s.Queries) - spentUSD
	return s
}

// String is the demo's closing line.
func (s savings) String() string {
	if s.USD >= 0 {
		return fmt.Sprintf("Saved over the %d queries after negotiation: %d LLM calls and %.4f USD (%s).", s.Queries, s.LLMCalls, s.USD, s.Basis)
	}
	return fmt.Sprintf("Not saving yet over the %d queries after negotiation: %d LLM calls saved, but %.4f USD more than natural language (%s); see the break-even query.", s.Queries, s.LLMCalls, -s.USD, s.Basis)
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
	sum, err := demo.Weather(ctx, opts)
	if err != nil && (grpcerr.Reason(err) == "TARGET_REFUSED" || strings.Contains(err.Error(), "refused: internal address")) {
		err = fmt.Errorf("%w; Alice sends to Bob at %s, an address the server refuses as internal: start that server with --send-allow-private (labs and tests only), or give --http a URL the server may send to", err, httpURL)
	}
	// Progress goes where the run's log went, stderr with --json, so that
	// --json output stays one document.
	w := opts.Log
	if w == nil {
		w = e.stderr
	}
	return sum, errors.Join(err, removeDemoAgents(w, conn, opts.AgentSuffix))
}

// removeDemoAgents deletes the agents a run on --server created, so the
// user's server keeps none of them, and says so; if that fails, it names
// them for the user to delete.
func removeDemoAgents(w io.Writer, conn *serverConn, suffix string) error {
	reg := registryv1.NewRegistryServiceClient(conn)
	ctx, cancel := callContext()
	defer cancel()
	var removed, left []string
	var errs []error
	for _, a := range []string{demo.Alice + suffix, demo.Bob + suffix} {
		_, err := reg.DeleteAgent(ctx, &registryv1.DeleteAgentRequest{Name: a})
		switch {
		case err == nil:
			removed = append(removed, wireName(a))
		case status.Code(err) != codes.NotFound: // NotFound: never created
			left = append(left, wireName(a))
			errs = append(errs, err)
		}
	}
	if len(removed) > 0 {
		fmt.Fprintf(w, "removed the agents it created: %s\n", strings.Join(removed, ", "))
	}
	if len(left) > 0 {
		return fmt.Errorf("could not remove the agents the demo created (%s); delete them with 'parley agent delete': %w", strings.Join(left, ", "), errors.Join(errs...))
	}
	return nil
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
		ep, stop, err := startDemoSuite(ctx, name, func(cfg *suiteConfig) {
			cfg.negotiator.LLM = neg.LLM
			cfg.negotiator.Thresholds, cfg.negotiator.RoutineShadowCalls = neg.Thresholds, neg.RoutineShadowCalls
		})
		if stop != nil {
			stops = append([]func() error{stop}, stops...)
		}
		return ep, err
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

// startDemoSuite starts an in-process suite on loopback with its own
// temporary data directory, configured by tune. stop (set even on an
// error, once there is something to undo) runs after ctx is cancelled:
// it closes the client, waits for the suite to stop, closes it and
// removes the directory.
func startDemoSuite(ctx context.Context, name string, tune func(*suiteConfig)) (_ demo.Endpoint, stop func() error, err error) {
	dir, err := os.MkdirTemp("", "parley-demo-"+name)
	if err != nil {
		return demo.Endpoint{}, nil, err
	}
	stop = func() error { return os.RemoveAll(dir) }
	cfg, err := loadSuiteConfig(env{getenv: func(string) string { return "" }, stdout: io.Discard}, []string{"--data", dir, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--log-level", "error", "--send-allow-private"})
	if err != nil {
		return demo.Endpoint{}, stop, err
	}
	tune(&cfg)
	s, err := newSuite(ctx, cfg)
	if err != nil {
		return demo.Endpoint{}, stop, err
	}
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return demo.Endpoint{}, func() error { return errors.Join(s.Close(), os.RemoveAll(dir)) }, err
	}
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		gl.Close()
		return demo.Endpoint{}, func() error { return errors.Join(s.Close(), os.RemoveAll(dir)) }, err
	}
	done := make(chan error, 1)
	go func() { done <- s.srv.Run(ctx, gl, hl) }()
	conn, err := s.srv.InProcessConn()
	if err != nil {
		return demo.Endpoint{}, func() error { return errors.Join(<-done, s.Close(), os.RemoveAll(dir)) }, err
	}
	stop = func() error { conn.Close(); return errors.Join(<-done, s.Close(), os.RemoveAll(dir)) }
	ep := demo.Endpoint{Conn: conn, HTTPURL: "http://" + hl.Addr().String()}
	if err := waitReady(ctx, ep.HTTPURL+"/readyz", done); err != nil {
		return demo.Endpoint{}, stop, err
	}
	return ep, stop, nil
}

// waitReady polls url (a /readyz) until it answers 200: the dispatcher
// has stored the built-in service protocols in the registry, which it
// does in the background once the server runs, and refuses service
// requests until then. It fails when ctx ends or the server stopped
// (done).
func waitReady(ctx context.Context, url string, done chan error) error {
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the server to be ready: %w", context.Cause(ctx))
		case err := <-done:
			done <- err // for stop, which waits for it
			return fmt.Errorf("the server stopped before it was ready: %w", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
