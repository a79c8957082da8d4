package main

import (
	"flag"
	"fmt"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/envflag"
)

// runFollow is `parley follow AGENT`: the agent whose key is in --token
// follows AGENT, so AGENT may start dialogues with it. The acting agent is
// the key's, found with GetCaller; --as CLIENT:AGENT names it instead, for
// the operator token (the server refuses an agent key acting as another).
func runFollow(e env, args []string) error { return followCall(e, args, true) }

// runUnfollow is `parley unfollow AGENT [--as CLIENT:AGENT]`.
func runUnfollow(e env, args []string) error { return followCall(e, args, false) }

func followCall(e env, args []string, follow bool) error {
	verb := map[bool]string{true: "follow", false: "unfollow"}[follow]
	fs := flag.NewFlagSet("parley "+verb, flag.ContinueOnError)
	dial := dialServer(e, fs)
	asAgent := asFlag(fs)
	summary := "Make the agent whose key is in --token follow AGENT, so that AGENT may start\ndialogues with it. Following again changes nothing."
	if !follow {
		summary = "Make the agent whose key is in --token stop following AGENT. Not following it\nis no error."
	}
	pos, err := parseArgs(e, fs, args, clientDoc("parley "+verb+" AGENT [flags]", summary,
		[]envflag.Arg{{Name: "AGENT", Help: "the agent to " + verb + ", as client:agent"}},
		"PARLEY_TOKEN=$BOB_KEY parley "+verb+" acme:alice",
		"PARLEY_TOKEN=$(cat data/operator.token) parley "+verb+" acme:alice --as beta:bob"))
	if err != nil {
		return err
	}
	target, err := agentName(pos[0])
	if err != nil {
		return usageErrorf("%v", err)
	}
	conn, err := dial()
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := callContext()
	defer cancel()
	follower, err := actingAgent(ctx, conn, *asAgent, verb)
	if err != nil {
		return err
	}
	c := registryv1.NewRegistryServiceClient(conn)
	if follow {
		_, err = c.FollowAgent(ctx, &registryv1.FollowAgentRequest{Name: follower, Agent: target})
	} else {
		_, err = c.UnfollowAgent(ctx, &registryv1.UnfollowAgentRequest{Name: follower, Agent: target})
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stderr, "%s %ss %s\n", wireName(follower), verb, wireName(target))
	return nil
}
