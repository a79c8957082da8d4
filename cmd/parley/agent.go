package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/envflag"
)

// runAgent is `parley agent`: hosted agents and the protocols they support.
// AGENT is `<client>:<agent>` (or the resource name
// clients/{client}/agents/{agent}).
func runAgent(e env, args []string) error {
	return subcommand(e, "agent", args, agentCommands())
}

func agentCommands() map[string]command {
	return map[string]command{
		"create":    {"create a hosted agent CLIENT:AGENT", agentCreate},
		"get":       {"print a hosted agent as JSON", agentGet},
		"update":    {"change AGENT's --display-name, --description, --dialect, --policy or --ap-access", agentUpdate},
		"list":      {"list hosted agents (--client to filter)", agentList},
		"delete":    {"delete a hosted agent", agentDelete},
		"support":   {"declare AGENT supports protocol HASH [--source URL ...]", agentSupport},
		"unsupport": {"declare AGENT refuses protocol HASH [--comment TEXT]", agentUnsupport},
		"forget":    {"remove protocol HASH from both of AGENT's lists", agentForget},
		"key":       {"create, list or revoke AGENT's keys", agentKey},
		"owner":     {"set AGENT's owner approval key and spending limits", agentOwner},
	}
}

// agentName turns `client:agent` into clients/{client}/agents/{agent}.
func agentName(s string) (string, error) {
	if strings.HasPrefix(s, "clients/") {
		return s, nil
	}
	client, agent, ok := strings.Cut(s, ":")
	if !ok || client == "" || agent == "" {
		return "", fmt.Errorf("agent %q must be written CLIENT:AGENT", s)
	}
	return "clients/" + client + "/agents/" + agent, nil
}

// wireName turns clients/{client}/agents/{agent} into `client:agent`.
func wireName(name string) string {
	parts := strings.Split(name, "/")
	if len(parts) != 4 {
		return name
	}
	return parts[1] + ":" + parts[3]
}

// agentCall parses flags and the positional arguments, dials, and runs fn
// with a client and the agent's resource name (args[0]).
func agentCall(e env, fs *flag.FlagSet, args []string, doc envflag.Doc, fn func(c registryv1.RegistryServiceClient, name string, args []string) error) error {
	conn, name, args, err := agentConn(e, fs, args, doc)
	if err != nil {
		return err
	}
	defer conn.Close()
	return fn(registryv1.NewRegistryServiceClient(conn), name, args[1:])
}

var dialects = map[string]registryv1.Dialect{
	"":         registryv1.Dialect_DIALECT_UNSPECIFIED,
	"spec2024": registryv1.Dialect_DIALECT_SPEC2024,
	"std":      registryv1.Dialect_DIALECT_STD,
	"pylib":    registryv1.Dialect_DIALECT_PYLIB,
}

var apAccess = map[string]registryv1.AgentProtocolAccess{
	"public": registryv1.AgentProtocolAccess_AGENT_PROTOCOL_ACCESS_PUBLIC,
	"token":  registryv1.AgentProtocolAccess_AGENT_PROTOCOL_ACCESS_TOKEN,
}

var policies = map[string]registryv1.SupportPolicy{
	"":            registryv1.SupportPolicy_SUPPORT_POLICY_UNSPECIFIED,
	"explicit":    registryv1.SupportPolicy_SUPPORT_POLICY_EXPLICIT,
	"implemented": registryv1.SupportPolicy_SUPPORT_POLICY_IMPLEMENTED,
}

func agentCreate(e env, args []string) error {
	fs := flag.NewFlagSet("parley agent create", flag.ContinueOnError)
	display := fs.String("display-name", "", "human-readable name")
	desc := fs.String("description", "", "what the agent does")
	dialect := fs.String("dialect", "", "Agora reply dialect: spec2024 (default), std or pylib")
	policy := fs.String("policy", "", "support policy: explicit (default) or implemented")
	return agentCall(e, fs, args, clientDoc("parley agent create CLIENT:AGENT [flags]",
		"Create a hosted agent on the server with its first key, which it prints alone on stdout\n(not shown again); the agent's name goes to stderr.",
		[]envflag.Arg{argAgent},
		"KEY=$(parley agent create acme:weather --display-name 'Acme weather' --dialect std)"), func(c registryv1.RegistryServiceClient, name string, _ []string) error {
		d, ok := dialects[*dialect]
		if !ok {
			return fmt.Errorf("--dialect %q must be spec2024, std or pylib", *dialect)
		}
		p, ok := policies[*policy]
		if !ok {
			return fmt.Errorf("--policy %q must be explicit or implemented", *policy)
		}
		parts := strings.Split(name, "/")
		ctx, cancel := callContext()
		defer cancel()
		a, err := c.CreateAgent(ctx, &registryv1.CreateAgentRequest{
			Parent:  "clients/" + parts[1],
			AgentId: parts[3],
			Agent:   &registryv1.Agent{DisplayName: *display, Description: *desc, Dialect: d, SupportPolicy: p},
		})
		if err != nil {
			return err
		}
		fmt.Fprintf(e.stderr, "created agent %s; its key follows on stdout and is not shown again\n", wireName(a.GetName()))
		fmt.Fprintln(e.stdout, a.GetInitialKey().GetSecret())
		return nil
	})
}

// agentUpdate changes only the fields whose flags are given; --etag makes
// the change conditional on the agent being unchanged since it was read.
func agentUpdate(e env, args []string) error {
	fs := flag.NewFlagSet("parley agent update", flag.ContinueOnError)
	agent := &registryv1.Agent{}
	fs.StringVar(&agent.DisplayName, "display-name", "", "human-readable name")
	fs.StringVar(&agent.Description, "description", "", "what the agent does")
	dialect := fs.String("dialect", "", "Agora reply dialect: spec2024, std or pylib")
	policy := fs.String("policy", "", "support policy: explicit or implemented")
	access := fs.String("ap-access", "", "who may call the agent's Agent Protocol routes: public (anyone) or token (its key, its client's key, the operator)")
	fs.StringVar(&agent.Etag, "etag", "", "apply only if the agent's etag is still this one")
	return agentCall(e, fs, args, clientDoc("parley agent update CLIENT:AGENT [flags]",
		"Change the fields of a hosted agent whose flags are given; prints the agent as JSON.",
		[]envflag.Arg{argAgent},
		"parley agent update acme:weather --description 'forecasts by city' --policy implemented",
		"parley agent update acme:weather --ap-access token"), func(c registryv1.RegistryServiceClient, name string, _ []string) error {
		var ok bool
		if agent.Dialect, ok = dialects[*dialect]; !ok {
			return fmt.Errorf("--dialect %q must be spec2024, std or pylib", *dialect)
		}
		if agent.SupportPolicy, ok = policies[*policy]; !ok {
			return fmt.Errorf("--policy %q must be explicit or implemented", *policy)
		}
		if *access != "" {
			if agent.AgentProtocolAccess, ok = apAccess[*access]; !ok {
				return fmt.Errorf("--ap-access %q must be public or token", *access)
			}
		}
		paths := map[string]string{"display-name": "display_name", "description": "description", "dialect": "dialect", "policy": "support_policy", "ap-access": "agent_protocol_access"}
		mask := &fieldmaskpb.FieldMask{}
		fs.Visit(func(f *flag.Flag) {
			if p, ok := paths[f.Name]; ok {
				mask.Paths = append(mask.Paths, p)
			}
		})
		if len(mask.Paths) == 0 {
			return errors.New("give at least one of --display-name, --description, --dialect, --policy, --ap-access")
		}
		agent.Name = name
		ctx, cancel := callContext()
		defer cancel()
		a, err := c.UpdateAgent(ctx, &registryv1.UpdateAgentRequest{Agent: agent, UpdateMask: mask})
		if err != nil {
			return err
		}
		return printAgent(e, a)
	})
}

func printAgent(e env, a *registryv1.Agent) error {
	b, err := protojson.Marshal(a)
	if err != nil {
		return err
	}
	return writeIndented(e.stdout, b)
}

// writeIndented prints JSON with encoding/json's two-space indentation and
// a final newline. protojson varies its whitespace from build to build on
// purpose; output meant for people and scripts must not.
func writeIndented(w io.Writer, b []byte) error {
	var buf bytes.Buffer
	if err := json.Indent(&buf, b, "", "  "); err != nil {
		return err
	}
	buf.WriteByte('\n')
	_, err := w.Write(buf.Bytes())
	return err
}

func agentGet(e env, args []string) error {
	fs := flag.NewFlagSet("parley agent get", flag.ContinueOnError)
	return agentCall(e, fs, args, clientDoc("parley agent get CLIENT:AGENT [flags]",
		"Print a hosted agent as JSON.",
		[]envflag.Arg{argAgent},
		"parley agent get acme:weather"), func(c registryv1.RegistryServiceClient, name string, _ []string) error {
		ctx, cancel := callContext()
		defer cancel()
		a, err := c.GetAgent(ctx, &registryv1.GetAgentRequest{Name: name})
		if err != nil {
			return err
		}
		return printAgent(e, a)
	})
}

func agentList(e env, args []string) error {
	fs := flag.NewFlagSet("parley agent list", flag.ContinueOnError)
	dial := dialServer(e, fs)
	client := fs.String("client", "", "list only this client's agents")
	if _, err := parseArgs(e, fs, args, clientDoc("parley agent list [flags]",
		"List hosted agents: name, number of supported protocols, display name.", nil,
		"parley agent list --client acme")); err != nil {
		return err
	}
	parent := "clients/-"
	if *client != "" {
		parent = "clients/" + *client
	}
	conn, err := dial()
	if err != nil {
		return err
	}
	defer conn.Close()
	c := registryv1.NewRegistryServiceClient(conn)
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	token := ""
	for {
		ctx, cancel := callContext()
		resp, err := c.ListAgents(ctx, &registryv1.ListAgentsRequest{Parent: parent, PageSize: 1000, PageToken: token})
		cancel()
		if err != nil {
			return err
		}
		for _, a := range resp.GetAgents() {
			fmt.Fprintf(tw, "%s\t%d supported\t%s\n", wireName(a.GetName()), len(a.GetSupportedProtocols()), a.GetDisplayName())
		}
		if token = resp.GetNextPageToken(); token == "" {
			return tw.Flush()
		}
	}
}

func agentDelete(e env, args []string) error {
	fs := flag.NewFlagSet("parley agent delete", flag.ContinueOnError)
	return agentCall(e, fs, args, clientDoc("parley agent delete CLIENT:AGENT [flags]",
		"Delete a hosted agent.",
		[]envflag.Arg{argAgent},
		"parley agent delete acme:weather"), func(c registryv1.RegistryServiceClient, name string, _ []string) error {
		ctx, cancel := callContext()
		defer cancel()
		_, err := c.DeleteAgent(ctx, &registryv1.DeleteAgentRequest{Name: name})
		return err
	})
}

func agentSupport(e env, args []string) error {
	fs := flag.NewFlagSet("parley agent support", flag.ContinueOnError)
	var sources stringList
	fs.Var(&sources, "source", "a `URL` or data: URI peers can fetch the document from; repeatable (default: this registry's /protocols/{hash})")
	return agentCall(e, fs, args, clientDoc("parley agent support CLIENT:AGENT HASH [flags]",
		"Declare that the agent supports a protocol; prints the agent as JSON.",
		[]envflag.Arg{argAgent, argHash},
		"parley agent support acme:weather 0f3c...e9 --source https://example.com/weather.md"), func(c registryv1.RegistryServiceClient, name string, rest []string) error {
		ctx, cancel := callContext()
		defer cancel()
		a, err := c.AddSupportedProtocol(ctx, &registryv1.AddSupportedProtocolRequest{Name: name, Protocol: rest[0], Sources: sources})
		if err != nil {
			return err
		}
		return printAgent(e, a)
	})
}

func agentUnsupport(e env, args []string) error {
	fs := flag.NewFlagSet("parley agent unsupport", flag.ContinueOnError)
	comment := fs.String("comment", "", "why the agent refuses it, shown in /.wellknown?detail=full")
	return agentCall(e, fs, args, clientDoc("parley agent unsupport CLIENT:AGENT HASH [flags]",
		"Declare that the agent refuses a protocol; prints the agent as JSON.",
		[]envflag.Arg{argAgent, argHash},
		"parley agent unsupport acme:weather 0f3c...e9 --comment 'superseded by v2'"), func(c registryv1.RegistryServiceClient, name string, rest []string) error {
		ctx, cancel := callContext()
		defer cancel()
		a, err := c.AddUnsupportedProtocol(ctx, &registryv1.AddUnsupportedProtocolRequest{Name: name, Protocol: rest[0], Comment: *comment})
		if err != nil {
			return err
		}
		return printAgent(e, a)
	})
}

func agentForget(e env, args []string) error {
	fs := flag.NewFlagSet("parley agent forget", flag.ContinueOnError)
	return agentCall(e, fs, args, clientDoc("parley agent forget CLIENT:AGENT HASH [flags]",
		"Remove a protocol from both the agent's supported and refused lists; prints the agent as JSON.",
		[]envflag.Arg{argAgent, argHash},
		"parley agent forget acme:weather 0f3c...e9"), func(c registryv1.RegistryServiceClient, name string, rest []string) error {
		ctx, cancel := callContext()
		defer cancel()
		if _, err := c.RemoveSupportedProtocol(ctx, &registryv1.RemoveSupportedProtocolRequest{Name: name, Protocol: rest[0]}); err != nil {
			return err
		}
		a, err := c.RemoveUnsupportedProtocol(ctx, &registryv1.RemoveUnsupportedProtocolRequest{Name: name, Protocol: rest[0]})
		if err != nil {
			return err
		}
		return printAgent(e, a)
	})
}
