package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"

	"google.golang.org/grpc"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
)

// runWhoami is `parley whoami`: who the server says --token (or
// PARLEY_TOKEN) identifies, one line on stdout: "agent acme:bot",
// "client acme" or "operator".
func runWhoami(e env, args []string) error {
	fs := flag.NewFlagSet("parley whoami", flag.ContinueOnError)
	dial := dialServer(e, fs)
	if _, err := parseArgs(e, fs, args, clientDoc("parley whoami [flags]",
		"Print who the credential in --token (or PARLEY_TOKEN) is, as the server sees it:\n'agent CLIENT:AGENT', 'client CLIENT' or 'operator' (the GetCaller RPC).",
		nil, "PARLEY_TOKEN=$BOT_KEY parley whoami")); err != nil {
		return err
	}
	conn, err := dial()
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := callContext()
	defer cancel()
	c, err := registryv1.NewRegistryServiceClient(conn).GetCaller(ctx, &registryv1.GetCallerRequest{})
	if err != nil {
		return err
	}
	switch c.GetKind() {
	case registryv1.PrincipalKind_PRINCIPAL_KIND_AGENT:
		fmt.Fprintln(e.stdout, "agent", wireName(c.GetAgent()))
	case registryv1.PrincipalKind_PRINCIPAL_KIND_CLIENT:
		fmt.Fprintln(e.stdout, "client", strings.TrimPrefix(c.GetClient(), "clients/"))
	default:
		fmt.Fprintln(e.stdout, "operator")
	}
	return nil
}

// errNotAnAgent is callerAgent's refusal of a credential that is not an
// agent key.
var errNotAnAgent = errors.New("the credential in --token (or PARLEY_TOKEN) is not an agent key")

// callerAgent is the agent whose key the connection's credential is
// (clients/{client}/agents/{agent}), asked of the server with GetCaller.
// Commands that act as "me" use it instead of asking for the agent's name;
// a client key or the operator token fails with errNotAnAgent, as it acts
// for no one agent.
func callerAgent(ctx context.Context, conn grpc.ClientConnInterface) (string, error) {
	c, err := registryv1.NewRegistryServiceClient(conn).GetCaller(ctx, &registryv1.GetCallerRequest{})
	if err != nil {
		return "", err
	}
	if c.GetKind() != registryv1.PrincipalKind_PRINCIPAL_KIND_AGENT {
		return "", errNotAnAgent
	}
	return c.GetAgent(), nil
}
