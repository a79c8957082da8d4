// Command negotiator benchmarks what Parley saves against natural language
// on a scaled-down version of the Agora paper's agent network: 20 agents
// (5 servers with tools, 15 users), 300 queries, per-user budgets drawn
// from a Pareto distribution with a fixed seed, three LLMs at the paper's
// prices, and the scripted LLM fixture counting tokens from the request
// and reply text. See bench/negotiator/benchnet for the strategies.
//
// Usage:
//
//	go run ./negotiator [--agents 20] [--servers 5] [--free-text-servers 0]
//	    [--queries 300] [--seed 1] [--alpha 1.16] [--window 50] [--json]
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strings"

	"github.com/parleyhq/parley/bench/negotiator/benchnet"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "negotiator bench:", err)
		os.Exit(1)
	}
}

// run writes the report to stdout and progress to stderr.
func run(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("negotiator", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o benchnet.Options
	fs.IntVar(&o.Agents, "agents", 20, "agents, servers included")
	fs.IntVar(&o.Servers, "servers", 5, "servers (agents with tools)")
	fs.IntVar(&o.FreeTextServers, "free-text-servers", 0, "servers without schemas, which stay on natural language")
	fs.IntVar(&o.Queries, "queries", 300, "queries in total")
	fs.Uint64Var(&o.Seed, "seed", 1, "random seed")
	fs.Float64Var(&o.ParetoAlpha, "alpha", 1.16, "Pareto shape of the users' budgets")
	fs.IntVar(&o.Window, "window", 50, "queries per window for the share of queries needing an LLM")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if !*asJSON {
		o.Log = stderr
	}
	rep, err := benchnet.Run(context.Background(), o)
	if err != nil {
		return err
	}
	if *asJSON {
		for k, v := range rep.Ratio {
			if math.IsInf(v, 1) {
				rep.Ratio[k] = -1
			}
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	fmt.Fprintf(stdout, "%d agents (%d servers, %d free-text; %d users), %d queries, seed %d\n", rep.Agents, rep.Servers, rep.FreeTextServers, rep.Users, rep.Queries, rep.Seed)
	fmt.Fprintf(stdout, "user budgets (Pareto): %v\n\n", rep.Budgets)
	fmt.Fprintln(stdout, "| strategy | cost USD | vs NL | LLM calls | tokens in/out | queries needing an LLM | negotiations | share needing an LLM per window |")
	fmt.Fprintln(stdout, "|---|---|---|---|---|---|---|---|")
	for _, r := range rep.Results {
		ratio := "1.0×"
		if v, ok := rep.Ratio[r.Strategy]; ok {
			ratio = fmt.Sprintf("%.1f×", v)
			if math.IsInf(v, 1) {
				ratio = "∞ (no LLM call)"
			}
		}
		var shares []string
		for _, s := range r.LLMShareByWindow {
			shares = append(shares, fmt.Sprintf("%.0f%%", 100*s))
		}
		fmt.Fprintf(stdout, "| %s | %.4f | %s | %d | %d/%d | %d (%.0f%%) | %d | %s |\n", r.Strategy, r.CostUSD, ratio, r.LLMCalls, r.PromptTokens, r.CompletionTokens,
			r.QueriesNeedingLLM, 100*float64(r.QueriesNeedingLLM)/float64(rep.Queries), r.Negotiations, strings.Join(shares, " "))
	}
	return nil
}
