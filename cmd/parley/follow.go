package main

import (
	"flag"
	"fmt"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/envflag"
)

// runFollow is `parley follow AGENT --as CLIENT:AGENT`: the --as agent
// follows AGENT, so AGENT may start dialogues with it. The key in --token
// must be the --as agent's (or the operator token): the server refuses
// any other.
func runFollow(e env, args []string) error { return followCall(e, args, true) }

// runUnfollow is `parley unfollow AGENT --as CLIENT:AGENT`.
func runUnfollow(e env, args []string) error { return followCall(e, args, false) }

func followCall(e env, args []string, follow bool) error {
	verb := map[bool]string{true: "follow", false: "unfollow"}[follow]
	fs := flag.NewFlagSet("parley "+verb, flag.ContinueOnError)
	dial := dialServer(e, fs)
	asAgent := fs.String("as", "", "the acting agent, `CLIENT:AGENT`, whose key is in --token (required)")
	summary := "Make the --as agent follow AGENT, so that AGENT may start dialogues with it.\nFollowing again changes nothing."
	if !follow {
		summary = "Make the --as agent stop following AGENT. Not following it is no error."
	}
	pos, err := parseArgs(e, fs, args, clientDoc("parley "+verb+" AGENT [flags]", summary,
		[]envflag.Arg{{Name: "AGENT", Help: "the agent to " + verb + ", as client:agent"}},
		"PARLEY_TOKEN=$BOB_KEY parley "+verb+" acme:alice --as beta:bob"))
	if err != nil {
		return err
	}
	if *asAgent == "" {
		return usageErrorf("parley %s needs --as CLIENT:AGENT, the agent whose key is in --token", verb)
	}
	follower, err := agentName(*asAgent)
	if err != nil {
		return usageErrorf("--as: %v", err)
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
