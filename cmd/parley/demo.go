package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/parleyhq/parley/platform/envflag"
	negotiatorconfig "github.com/parleyhq/parley/services/negotiator/config"
	"github.com/parleyhq/parley/services/negotiator/demo"
)

// runDemo runs a demo: `parley demo weather [--json] [--queries N]
// [--nl-queries N] [--llm-provider ... --llm-model ...]`.
func runDemo(e env, args []string) error {
	if len(args) == 0 || args[0] != "weather" {
		return fmt.Errorf("usage: parley demo weather [flags] (run 'parley demo weather --help')")
	}
	fs := flag.NewFlagSet("parley demo weather", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	asJSON := fs.Bool("json", false, "print one JSON summary on stdout instead of progress lines")
	queries := fs.Int("queries", 10, "structured queries after negotiation")
	nlQueries := fs.Int("nl-queries", 3, "natural-language queries before negotiation (needs --llm-provider)")
	var cfg negotiatorconfig.Config
	cfg.RegisterFlags(fs)
	if err := envflag.Parse(fs, args[1:], "PARLEY_", e.getenv); err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	if *queries < 1 || *nlQueries < 1 {
		return fmt.Errorf("--queries and --nl-queries must be at least 1")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	opts := demo.Options{LLM: cfg.LLM, NLQueries: *nlQueries, StructuredQueries: *queries}
	if !*asJSON {
		opts.Log = e.stdout
	}
	sum, err := demo.Weather(ctx, opts)
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
