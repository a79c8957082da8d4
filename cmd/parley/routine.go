package main

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/platform/grpcclient"
)

const routineUsage = `usage:
  parley routine set  [--server ADDR] CLIENT:AGENT HASH FILE   store FILE as the next version
  parley routine get  [--server ADDR] CLIENT:AGENT HASH        print the current version
  parley routine list [--server ADDR] CLIENT:AGENT             list the agent's routines
HASH is the protocol's SHA-1 (40 hex or 28 base64 characters) or "steps".`

// runRoutine manages a hosted agent's routines on a running server.
func runRoutine(e env, args []string) error {
	if len(args) == 0 {
		fmt.Fprintln(e.stderr, routineUsage)
		return errors.New("parley routine needs a subcommand: set, get or list")
	}
	sub := args[0]
	fs := flag.NewFlagSet("parley routine "+sub, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	server := fs.String("server", "127.0.0.1:9090", "gRPC address of a running server (env PARLEY_SERVER)")
	timeout := fs.Duration("timeout", 10*time.Second, "how long to wait for the server")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if !isFlagSet(fs, "server") {
		if v := e.getenv("PARLEY_SERVER"); v != "" {
			*server = v
		}
	}
	want := map[string]int{"set": 3, "get": 2, "list": 1}[sub]
	if want == 0 {
		fmt.Fprintln(e.stderr, routineUsage)
		return fmt.Errorf("unknown routine subcommand %q", sub)
	}
	if fs.NArg() != want {
		fmt.Fprintln(e.stderr, routineUsage)
		return fmt.Errorf("parley routine %s takes %d arguments, got %d", sub, want, fs.NArg())
	}
	agent, err := agentResourceName(fs.Arg(0))
	if err != nil {
		return err
	}
	conn, err := dialRoutineServer(*server)
	if err != nil {
		return err
	}
	defer conn.Close()
	client := dispatcherv1.NewDispatcherServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()

	switch sub {
	case "list":
		tok := ""
		for {
			resp, err := client.ListRoutines(ctx, &dispatcherv1.ListRoutinesRequest{Parent: agent, PageToken: tok})
			if err != nil {
				return err
			}
			for _, r := range resp.GetRoutines() {
				fmt.Fprintf(e.stdout, "%s\tv%d\t%s\tfailures=%d\n", r.GetName(), r.GetVersion(), routineState(r), r.GetConsecutiveFailures())
			}
			if tok = resp.GetNextPageToken(); tok == "" {
				return nil
			}
		}
	case "get":
		id, err := routineID(fs.Arg(1))
		if err != nil {
			return err
		}
		r, err := client.GetRoutine(ctx, &dispatcherv1.GetRoutineRequest{Name: agent + "/routines/" + id})
		if err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "# %s v%d %s failures=%d %s\n%s\n", r.GetName(), r.GetVersion(), routineState(r), r.GetConsecutiveFailures(), r.GetLastError(), r.GetSource())
		return nil
	default: // set
		id, err := routineID(fs.Arg(1))
		if err != nil {
			return err
		}
		src, err := os.ReadFile(fs.Arg(2))
		if err != nil {
			return err
		}
		r, err := client.SetRoutine(ctx, &dispatcherv1.SetRoutineRequest{Routine: &dispatcherv1.Routine{Name: agent + "/routines/" + id, Source: string(src)}})
		if err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "%s v%d\n", r.GetName(), r.GetVersion())
		return nil
	}
}

func routineState(r *dispatcherv1.Routine) string {
	return strings.ToLower(strings.TrimPrefix(r.GetState().String(), "STATE_"))
}

// agentResourceName turns CLIENT:AGENT into clients/{client}/agents/{agent}.
func agentResourceName(s string) (string, error) {
	c, a, ok := strings.Cut(s, ":")
	if !ok || c == "" || a == "" || strings.Contains(a, ":") {
		return "", fmt.Errorf("agent %q must be CLIENT:AGENT", s)
	}
	return "clients/" + c + "/agents/" + a, nil
}

// routineID normalises a protocol hash to lowercase hex; "steps" passes.
func routineID(s string) (string, error) {
	if s == "steps" {
		return s, nil
	}
	if len(s) == 40 {
		if b, err := hex.DecodeString(s); err == nil {
			return hex.EncodeToString(b), nil
		}
	}
	if len(s) == 28 {
		if b, err := base64.StdEncoding.DecodeString(s); err == nil && len(b) == 20 {
			return hex.EncodeToString(b), nil
		}
	}
	return "", fmt.Errorf("hash %q is neither 40 hex nor 28 base64 characters, nor \"steps\"", s)
}

// dialRoutineServer dials a running server for the routine subcommands.
// TODO(dispatcher): switch to the shared CLI dial helper once
// cmd/parley/client.go lands.
func dialRoutineServer(addr string) (*grpc.ClientConn, error) {
	conn, err := grpcclient.Dial(addr, grpcclient.Options{})
	if err != nil {
		return nil, fmt.Errorf("--server: %w", err)
	}
	return conn, nil
}

func isFlagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
