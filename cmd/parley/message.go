package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"strings"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/platform/envflag"
)

// The agent network's sending commands: `parley send`, `parley broadcast`
// and `parley reply`. Each acts as the agent whose key is in --token (or
// --as, for the operator token), and prints what the message became as one
// JSON object on stdout:
//
//	{"dialogue":"…","message":"…","category":"message",
//	 "recipients":["beta:bob"],
//	 "refused":[{"agent":"gamma:carol","reason":"permission_denied","detail":"…"}]}

// requestIDFlag registers --request-id on fs.
func requestIDFlag(fs *flag.FlagSet) *string {
	return fs.String("request-id", "", "an `ID` that makes a retry safe: a repeat within a day prints the first result and sends nothing")
}

// asFlag registers --as on fs, as `parley follow` does.
func asFlag(fs *flag.FlagSet) *string {
	return fs.String("as", "", "the acting agent, `CLIENT:AGENT` [the agent whose key is in --token]; needed only with the operator token")
}

// actingAgent is the agent a command acts as: --as when given, else the
// agent whose key the connection carries (GetCaller).
func actingAgent(ctx context.Context, conn *serverConn, as, command string) (string, error) {
	if as != "" {
		name, err := agentName(as)
		if err != nil {
			return "", usageErrorf("--as: %v", err)
		}
		return name, nil
	}
	name, err := callerAgent(ctx, conn)
	if errors.Is(err, errNotAnAgent) {
		return "", usageErrorf("parley %s acts as the agent whose key is in --token; %v: use an agent key, or name the agent with --as CLIENT:AGENT", command, err)
	}
	return name, err
}

// listFlags are the distribution-list flags of send and broadcast.
type listFlags struct {
	to, groups, regions stringList
}

func (l *listFlags) register(fs *flag.FlagSet) {
	fs.Var(&l.to, "to", "a recipient, `CLIENT:AGENT` (repeatable)")
	fs.Var(&l.groups, "group", "a group and its scope, `PATH:SCOPE` with SCOPE direct, local, global or exclusive, e.g. acme/travel/hotel:local (repeatable)")
	fs.Var(&l.regions, "region", "keep group members of a region, `COUNTRY[/STATE[/CITY]]` (repeatable)")
}

var cliScopes = map[string]dispatcherv1.GroupScope{
	"direct":    dispatcherv1.GroupScope_GROUP_SCOPE_DIRECT,
	"local":     dispatcherv1.GroupScope_GROUP_SCOPE_LOCAL,
	"global":    dispatcherv1.GroupScope_GROUP_SCOPE_GLOBAL,
	"exclusive": dispatcherv1.GroupScope_GROUP_SCOPE_EXCLUSIVE,
}

func (l *listFlags) list() (*dispatcherv1.DistributionList, error) {
	out := &dispatcherv1.DistributionList{}
	for _, a := range l.to {
		name, err := agentName(a)
		if err != nil {
			return nil, usageErrorf("--to: %v", err)
		}
		out.Direct = append(out.Direct, name)
	}
	for _, g := range l.groups {
		i := strings.LastIndexByte(g, ':')
		scope, ok := cliScopes[g[i+1:]]
		if i < 0 || !ok {
			return nil, usageErrorf("--group %q must be PATH:SCOPE, SCOPE one of direct, local, global, exclusive", g)
		}
		out.Groups = append(out.Groups, &dispatcherv1.GroupAddress{Path: g[:i], Scope: scope})
	}
	for _, r := range l.regions {
		parts := strings.SplitN(r, "/", 3)
		rg := &dispatcherv1.Region{Country: parts[0]}
		if len(parts) > 1 {
			rg.State = parts[1]
		}
		if len(parts) > 2 {
			rg.City = parts[2]
		}
		out.Regions = append(out.Regions, rg)
	}
	if len(out.Direct) == 0 && len(out.Groups) == 0 {
		return nil, usageErrorf("name at least one recipient with --to CLIENT:AGENT or --group PATH:SCOPE")
	}
	return out, nil
}

// bodyJSON is the message body: TEXT as a JSON string, or with --json
// TEXT itself, which must then be one JSON value.
func bodyJSON(text string, raw bool) (string, error) {
	if !raw {
		b, _ := json.Marshal(text) // a string always marshals
		return string(b), nil
	}
	if !json.Valid([]byte(text)) {
		return "", usageErrorf("--json: TEXT is not one JSON value")
	}
	return text, nil
}

// sendOutput is what the sending commands print.
type sendOutput struct {
	Dialogue   string       `json:"dialogue"`
	Message    string       `json:"message"`
	Category   string       `json:"category"`
	Recipients []string     `json:"recipients"`
	Refused    []refusedOut `json:"refused"`
}

type refusedOut struct {
	Agent  string `json:"agent,omitempty"`
	Group  string `json:"group,omitempty"`
	Reason string `json:"reason"`
	Detail string `json:"detail"`
}

func printSent(e env, r *dispatcherv1.SendMessageResponse) error {
	out := sendOutput{
		Dialogue: r.GetDialogueId(), Message: r.GetMessageId(),
		Category:   strings.ToLower(strings.TrimPrefix(r.GetCategory().String(), "MESSAGE_CATEGORY_")),
		Recipients: []string{}, Refused: []refusedOut{},
	}
	for _, a := range r.GetRecipients() {
		out.Recipients = append(out.Recipients, wireName(a))
	}
	for _, f := range r.GetRefusals() {
		agent := ""
		if f.GetAgent() != "" {
			agent = wireName(f.GetAgent())
		}
		out.Refused = append(out.Refused, refusedOut{
			Agent: agent, Group: f.GetGroup(), Detail: f.GetDetail(),
			Reason: strings.ToLower(strings.TrimPrefix(f.GetReason().String(), "REFUSAL_REASON_")),
		})
	}
	b, err := json.Marshal(out)
	if err != nil {
		return err
	}
	fmt.Fprintln(e.stdout, string(b))
	return nil
}

// messageCall parses a sending command, dials, finds the acting agent and
// runs call with it; it prints the result.
func messageCall(e env, fs *flag.FlagSet, args []string, doc envflag.Doc, as *string, call func(context.Context, dispatcherv1.DispatcherServiceClient, string, []string) (*dispatcherv1.SendMessageResponse, error)) error {
	dial := dialServer(e, fs)
	pos, err := parseArgs(e, fs, args, doc)
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
	sender, err := actingAgent(ctx, conn, *as, strings.TrimPrefix(fs.Name(), "parley "))
	if err != nil {
		return err
	}
	res, err := call(ctx, dispatcherv1.NewDispatcherServiceClient(conn), sender, pos)
	if err != nil {
		return err
	}
	return printSent(e, res)
}

var argText = envflag.Arg{Name: "TEXT", Help: "the message: sent as a JSON string, or as is with --json"}

// runSend is `parley send [--to AGENT]... [--group PATH:SCOPE]... TEXT`.
func runSend(e env, args []string) error {
	fs := flag.NewFlagSet("parley send", flag.ContinueOnError)
	var l listFlags
	l.register(fs)
	as := asFlag(fs)
	typ := fs.String("type", "new_message", "the message `type`")
	protocol := fs.String("protocol", "", "the dialogue's protocol, a PD's SHA-1 (`HASH`, 40 hex); its state machine, if any, is enforced")
	recipientType := fs.String("recipient-type", "", "the role addressed, e.g. supplier [recipient]")
	raw := fs.Bool("json", false, "TEXT is one JSON value, sent as is")
	requestID := requestIDFlag(fs)
	doc := clientDoc("parley send [flags] TEXT",
		"Open a dialogue: send TEXT from the agent whose key is in --token to the agents\n(--to) and groups (--group) named. Prints the dialogue id, the message id, the\nrecipients and every recipient refused (and why) as JSON.",
		[]envflag.Arg{argText},
		"PARLEY_TOKEN=$ALICE_KEY parley send --to beta:bob 'Hello, Bob'",
		"PARLEY_TOKEN=$ALICE_KEY parley send --group acme/travel:local --type new_task_request --json '{\"city\":\"Rome\"}'")
	return messageCall(e, fs, args, doc, as, func(ctx context.Context, c dispatcherv1.DispatcherServiceClient, sender string, pos []string) (*dispatcherv1.SendMessageResponse, error) {
		to, err := l.list()
		if err != nil {
			return nil, err
		}
		body, err := bodyJSON(pos[0], *raw)
		if err != nil {
			return nil, err
		}
		return c.SendMessage(ctx, &dispatcherv1.SendMessageRequest{
			Sender: sender, To: to, MessageType: *typ, Protocol: strings.ToLower(*protocol), RecipientType: *recipientType, BodyJson: body,
			RequestId: *requestID,
		})
	})
}

// runBroadcast is `parley broadcast --group PATH:SCOPE TEXT`.
func runBroadcast(e env, args []string) error {
	fs := flag.NewFlagSet("parley broadcast", flag.ContinueOnError)
	var l listFlags
	l.register(fs)
	as := asFlag(fs)
	typ := fs.String("type", "broadcast", "the message `type`")
	raw := fs.Bool("json", false, "TEXT is one JSON value, sent as is")
	requestID := requestIDFlag(fs)
	doc := clientDoc("parley broadcast [flags] TEXT",
		"Broadcast TEXT from the agent whose key is in --token to the groups (and agents)\nnamed (--group, --to): a one-way message nobody can answer. Prints the result\nas JSON.",
		[]envflag.Arg{argText},
		"PARLEY_TOKEN=$ALICE_KEY parley broadcast --group acme/news:local 'Prices drop on Monday'")
	return messageCall(e, fs, args, doc, as, func(ctx context.Context, c dispatcherv1.DispatcherServiceClient, sender string, pos []string) (*dispatcherv1.SendMessageResponse, error) {
		to, err := l.list()
		if err != nil {
			return nil, err
		}
		body, err := bodyJSON(pos[0], *raw)
		if err != nil {
			return nil, err
		}
		return c.BroadcastMessage(ctx, &dispatcherv1.BroadcastMessageRequest{Sender: sender, To: to, MessageType: *typ, BodyJson: body, RequestId: *requestID})
	})
}

// runReply is `parley reply MESSAGE_ID [--all] TEXT`.
func runReply(e env, args []string) error {
	fs := flag.NewFlagSet("parley reply", flag.ContinueOnError)
	as := asFlag(fs)
	all := fs.Bool("all", false, "reply to the message's sender and every other recipient of it")
	typ := fs.String("type", "message_response", "the message `type`")
	recipientType := fs.String("recipient-type", "", "the role addressed [recipient]")
	raw := fs.Bool("json", false, "TEXT is one JSON value, sent as is")
	requestID := requestIDFlag(fs)
	doc := clientDoc("parley reply MESSAGE_ID [--all] [flags] TEXT",
		"Answer a message the agent whose key is in --token received: to its sender, or\nwith --all to every recipient of it too. Prints the result as JSON.",
		[]envflag.Arg{{Name: "MESSAGE_ID", Help: "the message answered (its id, as parley listen prints it)"}, argText},
		"PARLEY_TOKEN=$BOB_KEY parley reply Xq2v9k1mYb3sPz0aT4wLhA 'Hi Alice'")
	return messageCall(e, fs, args, doc, as, func(ctx context.Context, c dispatcherv1.DispatcherServiceClient, sender string, pos []string) (*dispatcherv1.SendMessageResponse, error) {
		body, err := bodyJSON(pos[1], *raw)
		if err != nil {
			return nil, err
		}
		return c.ReplyMessage(ctx, &dispatcherv1.ReplyMessageRequest{
			Sender: sender, InReplyTo: pos[0], All: *all, MessageType: *typ, RecipientType: *recipientType, BodyJson: body,
			RequestId: *requestID,
		})
	})
}
