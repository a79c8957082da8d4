package main

import (
	"flag"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/envflag"
)

// Commands that create a credential print its secret alone on stdout, and
// everything else on stderr, so that `KEY=$(parley ...)` captures it. The
// server shows a secret once: it cannot be read again.

// runClient is `parley client`: clients, the accounts that own agents.
func runClient(e env, args []string) error {
	return subcommand(e, "client", args, clientCommands())
}

func clientCommands() map[string]command {
	return map[string]command{
		"create": {"create client NAME; prints its client key alone on stdout", clientCreate},
	}
}

func clientCreate(e env, args []string) error {
	fs := flag.NewFlagSet("parley client create", flag.ContinueOnError)
	dial := dialServer(e, fs)
	display := fs.String("display-name", "", "human-readable name")
	pos, err := parseArgs(e, fs, args, clientDoc("parley client create NAME [flags]",
		"Create a client (an account that owns agents) with the operator token, or on a server\nrunning --open-registration. Prints the client key alone on stdout; it is not shown again.",
		[]envflag.Arg{{Name: "NAME", Help: "the client's id: lowercase letters, digits and hyphens"}},
		"CLIENT_KEY=$(PARLEY_TOKEN=$(cat data/operator.token) parley client create acme)"))
	if err != nil {
		return err
	}
	conn, err := dial()
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := callContext()
	defer cancel()
	resp, err := registryv1.NewRegistryServiceClient(conn).CreateClient(ctx, &registryv1.CreateClientRequest{ClientId: pos[0], Client: &registryv1.Client{DisplayName: *display}})
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stderr, "created client %s; its key (%s) follows on stdout and is not shown again\n", strings.TrimPrefix(resp.GetClient().GetName(), "clients/"), resp.GetKey().GetName())
	fmt.Fprintln(e.stdout, resp.GetKey().GetSecret())
	return nil
}

// agentKey is `parley agent key create|list|revoke CLIENT:AGENT [KEY]`.
func agentKey(e env, args []string) error {
	if len(args) == 0 || isHelp(args[0]) {
		w := e.stdout
		if len(args) == 0 {
			w = e.stderr
		}
		fmt.Fprint(w, `Usage: parley agent key create|list|revoke CLIENT:AGENT [KEY] [flags]

Manage a hosted agent's keys (parley_ak_...): create prints a new key alone on stdout
(it is not shown again), list prints ids and creation times (never secrets), revoke
deletes a key at once. Needs the client's key or the operator token in --token.

Arguments:
  CLIENT:AGENT   a hosted agent, as client:agent (or clients/CLIENT/agents/AGENT)
  KEY            with revoke: the key id from list (16 hex digits)

Examples:
  KEY=$(parley agent key create acme:weather)
  parley agent key list acme:weather
  parley agent key revoke acme:weather 3f2a9c0d1e4b5a69

Run 'parley agent key create --help' for the flags.
`)
		if len(args) == 0 {
			return usageErrorf("parley agent key needs create, list or revoke")
		}
		return flag.ErrHelp
	}
	switch args[0] {
	case "create":
		return agentKeyCreate(e, args[1:])
	case "list":
		return agentKeyList(e, args[1:])
	case "revoke":
		return agentKeyRevoke(e, args[1:])
	}
	return usageErrorf("unknown command %q (run 'parley agent key --help')", "parley agent key "+args[0])
}

func agentKeyCreate(e env, args []string) error {
	fs := flag.NewFlagSet("parley agent key create", flag.ContinueOnError)
	return agentCall(e, fs, args, clientDoc("parley agent key create CLIENT:AGENT [flags]",
		"Create a key for a hosted agent. Prints it alone on stdout; it is not shown again.",
		[]envflag.Arg{argAgent},
		"KEY=$(parley agent key create acme:weather)"), func(c registryv1.RegistryServiceClient, name string, _ []string) error {
		ctx, cancel := callContext()
		defer cancel()
		k, err := c.CreateKey(ctx, &registryv1.CreateKeyRequest{Parent: name})
		if err != nil {
			return err
		}
		fmt.Fprintf(e.stderr, "created key %s\n", keyID(k.GetName()))
		fmt.Fprintln(e.stdout, k.GetSecret())
		return nil
	})
}

func agentKeyList(e env, args []string) error {
	fs := flag.NewFlagSet("parley agent key list", flag.ContinueOnError)
	return agentCall(e, fs, args, clientDoc("parley agent key list CLIENT:AGENT [flags]",
		"List a hosted agent's live keys: id and creation time, never the secret.",
		[]envflag.Arg{argAgent},
		"parley agent key list acme:weather"), func(c registryv1.RegistryServiceClient, name string, _ []string) error {
		ctx, cancel := callContext()
		defer cancel()
		resp, err := c.ListKeys(ctx, &registryv1.ListKeysRequest{Parent: name})
		if err != nil {
			return err
		}
		tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
		for _, k := range resp.GetKeys() {
			fmt.Fprintf(tw, "%s\t%s\n", keyID(k.GetName()), k.GetCreateTime().AsTime().UTC().Format(time.RFC3339))
		}
		return tw.Flush()
	})
}

func agentKeyRevoke(e env, args []string) error {
	fs := flag.NewFlagSet("parley agent key revoke", flag.ContinueOnError)
	return agentCall(e, fs, args, clientDoc("parley agent key revoke CLIENT:AGENT KEY [flags]",
		"Revoke one of a hosted agent's keys at once; streams using it end within seconds.",
		[]envflag.Arg{argAgent, {Name: "KEY", Help: "the key id, as 'parley agent key list' prints it"}},
		"parley agent key revoke acme:weather 3f2a9c0d1e4b5a69"), func(c registryv1.RegistryServiceClient, name string, rest []string) error {
		ctx, cancel := callContext()
		defer cancel()
		if _, err := c.DeleteKey(ctx, &registryv1.DeleteKeyRequest{Name: name + "/keys/" + rest[0]}); err != nil {
			return err
		}
		fmt.Fprintf(e.stderr, "revoked key %s\n", rest[0])
		return nil
	})
}

// keyID is the last segment of a key's resource name.
func keyID(name string) string { return name[strings.LastIndex(name, "/")+1:] }
