package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/envflag"
)

// runGroup is `parley group`: the agent network's hierarchical groups, as
// the agent whose key is in --token (like `parley follow`; --as names the
// agent for the operator token). PATH is client/name/... (acme/travel).
func runGroup(e env, args []string) error {
	return subcommand(e, "group", args, groupCommands())
}

func groupCommands() map[string]command {
	return map[string]command{
		"create":        {"create group PATH --access A --category C, your agent its first admin", groupCreate},
		"get":           {"print group PATH as JSON", groupGet},
		"join":          {"join PATH (open_public) or ask its admins (restricted_public)", groupJoin},
		"leave":         {"leave PATH", groupLeave},
		"search":        {"find non-private groups whose name or descriptions contain QUERY", groupSearch},
		"list":          {"list the groups your agent belongs to (--admin: administers)", groupList},
		"members":       {"list PATH's members (members only)", groupMembers},
		"requests":      {"list the pending join requests of PATH (admins only)", groupRequests},
		"invite":        {"invite AGENT into PATH (admins only) [--admin]", groupInvite},
		"accept":        {"accept AGENT's request to join PATH (admins only)", groupAnswer(true)},
		"reject":        {"reject AGENT's request to join PATH (admins only)", groupAnswer(false)},
		"invites":       {"list your agent's pending invites", groupInvites},
		"accept-invite": {"accept your agent's invite into PATH", groupAnswerInvite(true)},
		"reject-invite": {"decline your agent's invite into PATH", groupAnswerInvite(false)},
	}
}

var (
	argPath       = envflag.Arg{Name: "PATH", Help: "a group, client/name[/name...] (acme/travel/hotel)"}
	argOtherAgent = envflag.Arg{Name: "AGENT", Help: "another agent, as client:agent"}
)

// groupCall is one group subcommand: it parses flags and positional
// arguments, dials, finds the acting agent (the key's, or --as), and runs
// fn with the registry client and that agent.
type groupCall struct {
	name, summary string
	args          []envflag.Arg
	examples      []string
	// anyKey: the call needs no acting agent (search, get).
	anyKey bool
}

func (g groupCall) run(e env, fs *flag.FlagSet, args []string, fn func(ctx context.Context, c registryv1.RegistryServiceClient, actor string, pos []string) error) error {
	dial := dialServer(e, fs)
	var asAgent *string
	if !g.anyKey {
		asAgent = fs.String("as", "", "the acting agent, `CLIENT:AGENT` [the agent whose key is in --token]; needed only with the operator token")
	}
	pos, err := parseArgs(e, fs, args, clientDoc("parley group "+g.name, g.summary, g.args, g.examples...))
	if err != nil {
		return err
	}
	var actor string
	if asAgent != nil && *asAgent != "" {
		if actor, err = agentName(*asAgent); err != nil {
			return usageErrorf("--as: %v", err)
		}
	}
	conn, err := dial()
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := callContext()
	defer cancel()
	if !g.anyKey && actor == "" {
		actor, err = callerAgent(ctx, conn)
		if errors.Is(err, errNotAnAgent) {
			return usageErrorf("parley group acts as the agent whose key is in --token; %v: use an agent key, or name the agent with --as CLIENT:AGENT", err)
		}
		if err != nil {
			return err
		}
	}
	return fn(ctx, registryv1.NewRegistryServiceClient(conn), actor, pos)
}

func printProto(e env, m proto.Message) error {
	b, err := protojson.Marshal(m)
	if err != nil {
		return err
	}
	return writeIndented(e.stdout, b)
}

// enumValue maps a lowercase name (open_public) to the value of an enum
// whose names carry prefix (GROUP_ACCESS_).
func enumValue(flagName, v, prefix string, values map[string]int32) (int32, error) {
	n, ok := values[prefix+strings.ToUpper(v)]
	if !ok || n == 0 {
		var names []string
		for k, x := range values {
			if x != 0 {
				names = append(names, strings.ToLower(strings.TrimPrefix(k, prefix)))
			}
		}
		slices.Sort(names)
		return 0, usageErrorf("--%s %q: want one of %s", flagName, v, strings.Join(names, ", "))
	}
	return n, nil
}

// regionList is the repeatable --region COUNTRY[:STATE[:CITY]] flag.
type regionList []*registryv1.Region

func (l *regionList) String() string { return fmt.Sprint(len(*l), " regions") }
func (l *regionList) Set(v string) error {
	parts := strings.Split(v, ":")
	if len(parts) > 3 || parts[0] == "" {
		return fmt.Errorf("region %q must be COUNTRY[:STATE[:CITY]]", v)
	}
	r := &registryv1.Region{Country: parts[0]}
	if len(parts) > 1 {
		r.State = parts[1]
	}
	if len(parts) > 2 {
		r.City = parts[2]
	}
	*l = append(*l, r)
	return nil
}

func groupCreate(e env, args []string) error {
	fs := flag.NewFlagSet("parley group create", flag.ContinueOnError)
	access := fs.String("access", "", "who may join and address it: open_public, restricted_public or restricted_private (required)")
	category := fs.String("category", "", "its message category: message, subscription or service (required)")
	protocol := fs.String("protocol", "", "the SHA-1 (40 hex) of the protocol its members speak")
	description := fs.String("description", "", "what it is for, for people")
	agentDescription := fs.String("agent-description", "", "what it is for, for agents")
	displayName := fs.String("name", "", "a display name")
	g := groupCall{name: "create PATH --access A --category C [flags]", summary: "Create a group; your agent becomes its first member and admin. A sub-group\n(acme/travel/hotel) needs your agent to administer its parent and must match\nthe parent's access, category and protocol.",
		args: []envflag.Arg{argPath}, examples: []string{"parley group create acme/travel --access open_public --category message --description 'Travel offers'"}}
	return g.run(e, fs, args, func(ctx context.Context, c registryv1.RegistryServiceClient, actor string, pos []string) error {
		a, err := enumValue("access", *access, "GROUP_ACCESS_", registryv1.GroupAccess_value)
		if err != nil {
			return err
		}
		cat, err := enumValue("category", *category, "GROUP_CATEGORY_", registryv1.GroupCategory_value)
		if err != nil {
			return err
		}
		grp, err := c.CreateGroup(ctx, &registryv1.CreateGroupRequest{Name: actor, Group: &registryv1.Group{
			Path: pos[0], Access: registryv1.GroupAccess(a), Category: registryv1.GroupCategory(cat), Protocol: strings.ToLower(*protocol),
			Description: *description, AgentDescription: *agentDescription, DisplayName: *displayName,
		}})
		if err != nil {
			return err
		}
		return printProto(e, grp)
	})
}

func groupGet(e env, args []string) error {
	fs := flag.NewFlagSet("parley group get", flag.ContinueOnError)
	g := groupCall{name: "get PATH [flags]", summary: "Print a group as JSON.", args: []envflag.Arg{argPath}, anyKey: true,
		examples: []string{"parley group get acme/travel"}}
	return g.run(e, fs, args, func(ctx context.Context, c registryv1.RegistryServiceClient, _ string, pos []string) error {
		grp, err := c.GetGroup(ctx, &registryv1.GetGroupRequest{Path: pos[0]})
		if err != nil {
			return err
		}
		return printProto(e, grp)
	})
}

func groupJoin(e env, args []string) error {
	fs := flag.NewFlagSet("parley group join", flag.ContinueOnError)
	var regions regionList
	fs.Var(&regions, "region", "where your agent operates, `COUNTRY[:STATE[:CITY]]`; repeatable")
	g := groupCall{name: "join PATH [flags]", summary: "Join an open_public group at once, or send a join request to every admin of a\nrestricted_public one. Prints the membership or the pending request.",
		args: []envflag.Arg{argPath}, examples: []string{"parley group join acme/travel --region FR:IDF:Paris"}}
	return g.run(e, fs, args, func(ctx context.Context, c registryv1.RegistryServiceClient, actor string, pos []string) error {
		resp, err := c.JoinGroup(ctx, &registryv1.JoinGroupRequest{Name: actor, Group: pos[0], Regions: regions})
		if err != nil {
			return err
		}
		if resp.GetRequest() != nil {
			fmt.Fprintf(e.stderr, "%s asked to join %s; its admins decide\n", wireName(actor), pos[0])
		} else {
			fmt.Fprintf(e.stderr, "%s is a member of %s\n", wireName(actor), pos[0])
		}
		return printProto(e, resp)
	})
}

func groupLeave(e env, args []string) error {
	fs := flag.NewFlagSet("parley group leave", flag.ContinueOnError)
	g := groupCall{name: "leave PATH [flags]", summary: "Leave a group.", args: []envflag.Arg{argPath}, examples: []string{"parley group leave acme/travel"}}
	return g.run(e, fs, args, func(ctx context.Context, c registryv1.RegistryServiceClient, actor string, pos []string) error {
		if _, err := c.LeaveGroup(ctx, &registryv1.LeaveGroupRequest{Name: actor, Group: pos[0]}); err != nil {
			return err
		}
		fmt.Fprintf(e.stderr, "%s left %s\n", wireName(actor), pos[0])
		return nil
	})
}

func groupSearch(e env, args []string) error {
	fs := flag.NewFlagSet("parley group search", flag.ContinueOnError)
	pageSize := fs.Int("page-size", 50, "results per page")
	pageToken := fs.String("page-token", "", "a next_page_token from an earlier search")
	g := groupCall{name: "search QUERY [flags]", summary: "List the open and restricted_public groups whose path, name or descriptions\ncontain QUERY (case-insensitive), at most 350 in all.",
		args: []envflag.Arg{{Name: "QUERY", Help: "the text to find"}}, anyKey: true, examples: []string{"parley group search travel"}}
	return g.run(e, fs, args, func(ctx context.Context, c registryv1.RegistryServiceClient, _ string, pos []string) error {
		resp, err := c.SearchGroups(ctx, &registryv1.SearchGroupsRequest{Query: pos[0], PageSize: int32(min(max(*pageSize, 0), 1000)), PageToken: *pageToken}) //nolint:gosec // clamped
		if err != nil {
			return err
		}
		return printProto(e, resp)
	})
}

func groupList(e env, args []string) error {
	fs := flag.NewFlagSet("parley group list", flag.ContinueOnError)
	admin := fs.Bool("admin", false, "only the groups your agent administers")
	g := groupCall{name: "list [flags]", summary: "List the groups your agent belongs to, with its member type and regions.", examples: []string{"parley group list --admin"}}
	return g.run(e, fs, args, func(ctx context.Context, c registryv1.RegistryServiceClient, actor string, _ []string) error {
		all := &registryv1.ListAgentGroupsResponse{}
		token := ""
		for {
			resp, err := c.ListAgentGroups(ctx, &registryv1.ListAgentGroupsRequest{Parent: actor, AdminOnly: *admin, PageSize: 1000, PageToken: token})
			if err != nil {
				return err
			}
			all.Members = append(all.Members, resp.GetMembers()...)
			if token = resp.GetNextPageToken(); token == "" {
				return printProto(e, all)
			}
		}
	})
}

func groupMembers(e env, args []string) error {
	fs := flag.NewFlagSet("parley group members", flag.ContinueOnError)
	g := groupCall{name: "members PATH [flags]", summary: "List a group's members (its members may).", args: []envflag.Arg{argPath}, examples: []string{"parley group members acme/travel"}}
	return g.run(e, fs, args, func(ctx context.Context, c registryv1.RegistryServiceClient, actor string, pos []string) error {
		all := &registryv1.ListGroupMembersResponse{}
		token := ""
		for {
			resp, err := c.ListGroupMembers(ctx, &registryv1.ListGroupMembersRequest{Name: actor, Group: pos[0], PageSize: 1000, PageToken: token})
			if err != nil {
				return err
			}
			all.Members = append(all.Members, resp.GetMembers()...)
			if token = resp.GetNextPageToken(); token == "" {
				return printProto(e, all)
			}
		}
	})
}

func groupRequests(e env, args []string) error {
	fs := flag.NewFlagSet("parley group requests", flag.ContinueOnError)
	g := groupCall{name: "requests PATH [flags]", summary: "List the pending requests to join a group your agent administers.", args: []envflag.Arg{argPath},
		examples: []string{"parley group requests acme/club"}}
	return g.run(e, fs, args, func(ctx context.Context, c registryv1.RegistryServiceClient, actor string, pos []string) error {
		resp, err := c.ListGroupJoinRequests(ctx, &registryv1.ListGroupJoinRequestsRequest{Parent: actor, Group: pos[0]})
		if err != nil {
			return err
		}
		return printProto(e, resp)
	})
}

func groupInvite(e env, args []string) error {
	fs := flag.NewFlagSet("parley group invite", flag.ContinueOnError)
	admin := fs.Bool("admin", false, "make the invitee an admin on acceptance")
	conditions := fs.String("conditions", "", "free-form conditions (a fee, say)")
	payment := fs.Bool("payment-required", false, "the invitee must pay to accept")
	human := fs.Bool("human-authorization-required", false, "a human must authorise the acceptance")
	g := groupCall{name: "invite PATH AGENT [flags]", summary: "Invite an agent into a group your agent administers. The invitee must follow\nyour agent, share its client group, or have asked to join (the invite then\nanswers the request).",
		args: []envflag.Arg{argPath, argOtherAgent}, examples: []string{"parley group invite acme/club beta:bob --admin"}}
	return g.run(e, fs, args, func(ctx context.Context, c registryv1.RegistryServiceClient, actor string, pos []string) error {
		invitee, err := agentName(pos[1])
		if err != nil {
			return usageErrorf("%v", err)
		}
		t := registryv1.MemberType_MEMBER_TYPE_MEMBER
		if *admin {
			t = registryv1.MemberType_MEMBER_TYPE_ADMIN
		}
		inv, err := c.InviteToGroup(ctx, &registryv1.InviteToGroupRequest{Name: actor, Group: pos[0], Agent: invitee, MemberType: t,
			Conditions: *conditions, PaymentRequired: *payment, HumanAuthorizationRequired: *human})
		if err != nil {
			return err
		}
		return printProto(e, inv)
	})
}

func groupAnswer(accept bool) func(env, []string) error {
	verb := map[bool]string{true: "accept", false: "reject"}[accept]
	return func(e env, args []string) error {
		fs := flag.NewFlagSet("parley group "+verb, flag.ContinueOnError)
		g := groupCall{name: verb + " PATH AGENT [flags]", summary: "Answer AGENT's request to join a group your agent administers: " + verb + " it.\nThe first admin to answer decides.",
			args: []envflag.Arg{argPath, argOtherAgent}, examples: []string{"parley group " + verb + " acme/club beta:bob"}}
		return g.run(e, fs, args, func(ctx context.Context, c registryv1.RegistryServiceClient, actor string, pos []string) error {
			agent, err := agentName(pos[1])
			if err != nil {
				return usageErrorf("%v", err)
			}
			if _, err := c.AnswerGroupJoinRequest(ctx, &registryv1.AnswerGroupJoinRequestRequest{Name: actor, Group: pos[0], Agent: agent, Accept: accept}); err != nil {
				return err
			}
			fmt.Fprintf(e.stderr, "%s %sed %s's request to join %s\n", wireName(actor), strings.TrimSuffix(verb, "e"), wireName(agent), pos[0])
			return nil
		})
	}
}

func groupInvites(e env, args []string) error {
	fs := flag.NewFlagSet("parley group invites", flag.ContinueOnError)
	g := groupCall{name: "invites [flags]", summary: "List your agent's pending invites.", examples: []string{"parley group invites"}}
	return g.run(e, fs, args, func(ctx context.Context, c registryv1.RegistryServiceClient, actor string, _ []string) error {
		resp, err := c.ListGroupInvites(ctx, &registryv1.ListGroupInvitesRequest{Parent: actor})
		if err != nil {
			return err
		}
		return printProto(e, resp)
	})
}

func groupAnswerInvite(accept bool) func(env, []string) error {
	verb := map[bool]string{true: "accept-invite", false: "reject-invite"}[accept]
	return func(e env, args []string) error {
		fs := flag.NewFlagSet("parley group "+verb, flag.ContinueOnError)
		payment := fs.String("payment", "", "a payment reference for the inviter to verify (never card data)")
		human := fs.String("human-authorization", "", "a human authorisation for the inviter to verify")
		var regions regionList
		fs.Var(&regions, "region", "where your agent operates, `COUNTRY[:STATE[:CITY]]`; repeatable")
		g := groupCall{name: verb + " PATH [flags]", summary: "Answer your agent's invite into a group; accepting starts the membership.",
			args: []envflag.Arg{argPath}, examples: []string{"parley group " + verb + " acme/club"}}
		return g.run(e, fs, args, func(ctx context.Context, c registryv1.RegistryServiceClient, actor string, pos []string) error {
			resp, err := c.AnswerGroupInvite(ctx, &registryv1.AnswerGroupInviteRequest{Name: actor, Group: pos[0], Accept: accept,
				Payment: *payment, HumanAuthorization: *human, Regions: regions})
			if err != nil {
				return err
			}
			return printProto(e, resp)
		})
	}
}
