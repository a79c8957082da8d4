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
)

// runRoutine is `parley routine`: a hosted agent's routines on a running
// server. AGENT is `<client>:<agent>`; HASH is the protocol's SHA-1 (40 hex
// or 28 base64 characters) or "steps".
func runRoutine(e env, args []string) error {
	return subcommand(e, "routine", args, map[string]command{
		"set":  {"store FILE as the next version of AGENT's routine for HASH", routineSet},
		"get":  {"print the current version of AGENT's routine for HASH", routineGet},
		"list": {"list AGENT's routines", routineList},
	})
}

// routineCall parses flags and the positional arguments, dials, and runs fn
// with a client and the agent's resource name (args[0]).
func routineCall(e env, name string, args []string, nargs int, usage string, fn func(ctx context.Context, c dispatcherv1.DispatcherServiceClient, agent string, args []string) error) error {
	fs := flag.NewFlagSet("parley routine "+name, flag.ContinueOnError)
	conn, agent, args, err := agentConn(e, fs, args, nargs, usage)
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := callContext()
	defer cancel()
	return fn(ctx, dispatcherv1.NewDispatcherServiceClient(conn), agent, args)
}

func routineSet(e env, args []string) error {
	return routineCall(e, "set", args, 3, "AGENT HASH FILE", func(ctx context.Context, c dispatcherv1.DispatcherServiceClient, agent string, args []string) error {
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
	return routineCall(e, "get", args, 2, "AGENT HASH", func(ctx context.Context, c dispatcherv1.DispatcherServiceClient, agent string, args []string) error {
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
	return routineCall(e, "list", args, 1, "AGENT", func(ctx context.Context, c dispatcherv1.DispatcherServiceClient, agent string, _ []string) error {
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
