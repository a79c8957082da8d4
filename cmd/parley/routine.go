package main

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"strings"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/platform/envflag"
)

// runRoutine is `parley routine`: a hosted agent's routines on a running
// server. AGENT is `<client>:<agent>`; HASH is the protocol's SHA-1 (40 hex
// or 28 base64 characters) or "steps".
func runRoutine(e env, args []string) error {
	return subcommand(e, "routine", args, routineCommands())
}

func routineCommands() map[string]command {
	return map[string]command{
		"set":  {"store FILE as the next version of AGENT's routine for HASH", routineSet},
		"get":  {"print the current version of AGENT's routine for HASH", routineGet},
		"list": {"list AGENT's routines", routineList},
	}
}

// argRoutine is the HASH of a routine: a protocol or "steps".
var argRoutine = envflag.Arg{Name: "HASH", Help: "the protocol's SHA-1 (40 hex or 28 base64 characters), or steps for the Agent Protocol step routine"}

// routineCall parses flags and the positional arguments, dials, and runs fn
// with a client and the agent's resource name (args[0]).
func routineCall(e env, name string, args []string, doc envflag.Doc, fn func(ctx context.Context, c dispatcherv1.DispatcherServiceClient, agent string, args []string) error) error {
	fs := flag.NewFlagSet("parley routine "+name, flag.ContinueOnError)
	conn, agent, args, err := agentConn(e, fs, args, doc)
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := callContext()
	defer cancel()
	return fn(ctx, dispatcherv1.NewDispatcherServiceClient(conn), agent, args)
}

func routineSet(e env, args []string) error {
	return routineCall(e, "set", args, clientDoc("parley routine set CLIENT:AGENT HASH FILE [flags]",
		"Store a Starlark file as the next version of the agent's routine for a protocol; prints the routine's name and version.",
		[]envflag.Arg{argAgent, argRoutine, {Name: "FILE", Help: "the Starlark source"}},
		"parley routine set acme:weather 0f3c...e9 weather.star",
		"parley routine set acme:weather steps echo.star"), func(ctx context.Context, c dispatcherv1.DispatcherServiceClient, agent string, args []string) error {
		id, err := routineID(args[1])
		if err != nil {
			return err
		}
		src, err := os.ReadFile(args[2])
		if err != nil {
			return err
		}
		r, err := c.SetRoutine(ctx, &dispatcherv1.SetRoutineRequest{Routine: &dispatcherv1.Routine{Name: agent + "/routines/" + id, Source: string(src)}})
		if err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "%s v%d\n", r.GetName(), r.GetVersion())
		return nil
	})
}

func routineGet(e env, args []string) error {
	return routineCall(e, "get", args, clientDoc("parley routine get CLIENT:AGENT HASH [flags]",
		"Print the current version of a routine: a header line (name, version, state, failures, last error), then the source.",
		[]envflag.Arg{argAgent, argRoutine},
		"parley routine get acme:weather steps"), func(ctx context.Context, c dispatcherv1.DispatcherServiceClient, agent string, args []string) error {
		id, err := routineID(args[1])
		if err != nil {
			return err
		}
		r, err := c.GetRoutine(ctx, &dispatcherv1.GetRoutineRequest{Name: agent + "/routines/" + id})
		if err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "# %s v%d %s failures=%d %s\n%s\n", r.GetName(), r.GetVersion(), routineState(r), r.GetConsecutiveFailures(), r.GetLastError(), r.GetSource())
		return nil
	})
}

func routineList(e env, args []string) error {
	return routineCall(e, "list", args, clientDoc("parley routine list CLIENT:AGENT [flags]",
		"List an agent's routines: name, version, state, consecutive failures.",
		[]envflag.Arg{argAgent},
		"parley routine list acme:weather"), func(ctx context.Context, c dispatcherv1.DispatcherServiceClient, agent string, _ []string) error {
		tok := ""
		for {
			resp, err := c.ListRoutines(ctx, &dispatcherv1.ListRoutinesRequest{Parent: agent, PageToken: tok})
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
	})
}

func routineState(r *dispatcherv1.Routine) string {
	return strings.ToLower(strings.TrimPrefix(r.GetState().String(), "STATE_"))
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
