package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/parleyhq/parley/cmd/parley/internal/demo"
	"github.com/parleyhq/parley/platform/envflag"
)

// demoMarketDoc is the help of `parley demo market`.
var demoMarketDoc = envflag.Doc{
	Usage: "parley demo market [flags]",
	Summary: "Run the market story: a buyer and five suppliers (steady, slow, fickle, picky, premium) trade through " +
		"the network's service protocols, allocate then transact, with server-held deadlines, a revoked offer, a " +
		"declined invitation, and a paid order approved with the buyer's owner's signature. Without --server it " +
		"starts an in-process Parley server; with --server it runs on that one (with the operator token in --token) " +
		"and removes the agents it created.",
	Prefix: "PARLEY_",
	Examples: []string{
		"parley demo market",
		"parley demo market --json",
		"parley demo market --timeout 5m",
		"PARLEY_TOKEN=$(cat data/operator.token) parley demo market --server 127.0.0.1:9090",
	},
}

func runDemoMarket(e env, args []string) error {
	fs := flag.NewFlagSet("parley demo market", flag.ContinueOnError)
	fs.SetOutput(e.stdout)
	asJSON := fs.Bool("json", false, "print one JSON summary on stdout instead of the narration")
	server := fs.String("server", "", "gRPC address of a running parley serve to run on (default: an in-process server)")
	serverCA := fs.String("server-ca", e.getenv("PARLEY_SERVER_CA"), "with --server: PEM CA bundle to dial it over TLS")
	window := fs.Duration("window", 2*time.Second, "each deadline the buyer sets (whole seconds): how long suppliers have to answer")
	timeout := fs.Duration("timeout", 2*time.Minute, "the longest the whole run may take; past it the demo stops with an error saying so")
	if _, err := parseArgs(e, fs, args, demoMarketDoc); err != nil {
		return err
	}
	if *window < time.Second || *window%time.Second != 0 {
		return usageErrorf("--window must be whole seconds, at least 1s")
	}
	if *timeout <= 0 {
		return usageErrorf("--timeout must be positive")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeoutCause(ctx, *timeout, fmt.Errorf("the market demo did not finish within --timeout %s", *timeout))
	defer cancel()
	opts := demo.MarketOptions{Window: *window}
	if !*asJSON {
		opts.Log = e.stdout
	}
	var (
		sum demo.MarketSummary
		err error
	)
	if *server != "" {
		sum, err = marketOnServer(ctx, e, opts, *server, *serverCA)
	} else {
		sum, err = marketInProcess(ctx, opts)
	}
	if err != nil {
		if cause := context.Cause(ctx); cause != nil && ctx.Err() == context.DeadlineExceeded {
			return errors.Join(cause, err)
		}
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(sum)
	}
	fmt.Fprintf(e.stdout, "%d orders formed, %d deadlines expired, %d revocations, %d payments; %s\n",
		len(sum.Orders), len(sum.Expiries), len(sum.Revocations), len(sum.Payments), sum.Transport)
	return nil
}

func marketInProcess(ctx context.Context, opts demo.MarketOptions) (_ demo.MarketSummary, err error) {
	ctx, cancel := context.WithCancel(ctx)
	ep, stop, err := startDemoSuite(ctx, "market", func(*suiteConfig) {})
	defer func() {
		cancel()
		if stop != nil {
			err = errors.Join(err, stop())
		}
	}()
	if err != nil {
		return demo.MarketSummary{}, fmt.Errorf("start the server: %w", err)
	}
	opts.Conn = ep.Conn
	opts.Transport = "network messages through an in-process Parley server"
	return demo.Market(ctx, opts)
}

func marketOnServer(ctx context.Context, e env, opts demo.MarketOptions, addr, ca string) (demo.MarketSummary, error) {
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	dial := dialServer(e, fs)
	if err := fs.Parse([]string{"--server", addr, "--server-ca", ca}); err != nil {
		return demo.MarketSummary{}, err
	}
	conn, err := dial()
	if err != nil {
		return demo.MarketSummary{}, err
	}
	defer conn.Close()
	var b [4]byte
	_, _ = rand.Read(b[:])
	opts.Suffix = "-" + hex.EncodeToString(b[:]) // fresh agents each run
	opts.Conn = conn
	opts.Transport = "network messages through parley serve at " + addr
	sum, err := demo.Market(ctx, opts)
	cctx, cancel := callContext()
	defer cancel()
	removed, rerr := demo.RemoveMarketAgents(cctx, conn, opts.Suffix)
	w := opts.Log
	if w == nil {
		w = e.stderr
	}
	if len(removed) > 0 {
		var names []string
		for _, n := range removed {
			names = append(names, wireName(n))
		}
		fmt.Fprintf(w, "removed the agents it created: %s\n", strings.Join(names, ", "))
	}
	return sum, errors.Join(err, rerr)
}
