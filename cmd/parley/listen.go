package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
)

// listenedMessage is one line of `parley listen`: a NetworkMessage with the
// body as the JSON value it is.
type listenedMessage struct {
	Cursor        uint64          `json:"cursor"`
	MessageID     string          `json:"messageId"`
	DialogueID    string          `json:"dialogueId"`
	Sender        string          `json:"sender,omitempty"`
	Recipient     string          `json:"recipient"`
	Category      string          `json:"category"`
	MessageType   string          `json:"messageType"`
	Protocol      string          `json:"protocol,omitempty"`
	RecipientType string          `json:"recipientType,omitempty"`
	Body          json.RawMessage `json:"body"`
	InReplyTo     string          `json:"inReplyTo,omitempty"`
	CreateTime    string          `json:"createTime,omitempty"`
}

var categoryNames = map[dispatcherv1.MessageCategory]string{
	dispatcherv1.MessageCategory_MESSAGE_CATEGORY_MESSAGE:       "message",
	dispatcherv1.MessageCategory_MESSAGE_CATEGORY_SUBSCRIPTION:  "subscription",
	dispatcherv1.MessageCategory_MESSAGE_CATEGORY_SERVICE:       "service",
	dispatcherv1.MessageCategory_MESSAGE_CATEGORY_NOTIFICATIONS: "notifications",
}

func listened(m *dispatcherv1.NetworkMessage) listenedMessage {
	body := json.RawMessage(m.GetBodyJson())
	if !json.Valid(body) {
		body, _ = json.Marshal(string(m.GetBodyJson()))
	}
	out := listenedMessage{
		Cursor: m.GetCursor(), MessageID: m.GetMessageId(), DialogueID: m.GetDialogueId(), Sender: m.GetSender(),
		Recipient: m.GetRecipient(), Category: categoryNames[m.GetCategory()], MessageType: m.GetMessageType(),
		Protocol: m.GetProtocol(), RecipientType: m.GetRecipientType(), Body: body, InReplyTo: m.GetInReplyTo(),
	}
	if t := m.GetCreateTime(); t.IsValid() {
		out.CreateTime = t.AsTime().UTC().Format(time.RFC3339Nano)
	}
	return out
}

// runListen is `parley listen`: the agent whose key is in --token receives
// its mailbox and prints one JSON object per message on stdout,
// acknowledging each once printed.
func runListen(e env, args []string) error {
	fs := flag.NewFlagSet("parley listen", flag.ContinueOnError)
	dial := dialServer(e, fs)
	after := fs.Uint64("after", 0, "start after this `cursor` [after the acknowledged cursor]")
	clearBacklog := fs.Bool("clear-backlog", false, "acknowledge what waits first; print only messages sent from now on")
	count := fs.Int("count", 0, "stop after `N` messages [0: never]")
	timeout := fs.Duration("timeout", 0, "stop after this long [0: never]; with --count, fewer than N messages by then is an error")
	asAgent := fs.String("as", "", "the receiving agent, `CLIENT:AGENT` [the agent whose key is in --token]; needed only with the operator token")
	if _, err := parseArgs(e, fs, args, clientDoc("parley listen [flags]",
		"Receive the mailbox of the agent whose key is in --token: print one JSON object per\nmessage on stdout, in mailbox order, and acknowledge each once printed, so that\nthe next listen resumes after it. Another receiver of the same agent takes over\nfrom this one, which then exits with an error.",
		nil,
		"PARLEY_TOKEN=$BOB_KEY parley listen --count 1 --timeout 30s",
		"PARLEY_TOKEN=$BOB_KEY parley listen --clear-backlog | jq .body")); err != nil {
		return err
	}
	if *count < 0 || *timeout < 0 {
		return usageErrorf("--count and --timeout must not be negative")
	}
	var agent string
	if *asAgent != "" {
		var err error
		if agent, err = agentName(*asAgent); err != nil {
			return usageErrorf("--as: %v", err)
		}
	}
	conn, err := dial()
	if err != nil {
		return err
	}
	defer conn.Close()
	if agent == "" {
		ctx, cancel := callContext()
		agent, err = callerAgent(ctx, conn)
		cancel()
		if errors.Is(err, errNotAnAgent) {
			return usageErrorf("parley listen acts as the agent whose key is in --token; %v: use an agent key, or name the agent with --as CLIENT:AGENT", err)
		}
		if err != nil {
			return err
		}
	}
	ctx := context.Background()
	if *timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *timeout)
		defer cancel()
	}
	c := dispatcherv1.NewDispatcherServiceClient(conn)
	stream, err := c.ReceiveMessages(ctx, &dispatcherv1.ReceiveMessagesRequest{Agent: agent, AfterCursor: *after, ClearBacklog: *clearBacklog})
	if err != nil {
		return err
	}
	enc := json.NewEncoder(e.stdout)
	printed := 0
	for *count == 0 || printed < *count {
		resp, err := stream.Recv()
		if err != nil {
			// The server may end the stream at the deadline it was sent a
			// moment before the local context expires.
			if ctx.Err() == nil && status.Code(err) == codes.DeadlineExceeded && *timeout > 0 {
				<-ctx.Done()
			}
			if ctx.Err() != nil && *count == 0 {
				return nil // --timeout with no --count: listening ends there
			}
			if ctx.Err() != nil {
				return fmt.Errorf("--timeout %s passed after %d of %d messages", *timeout, printed, *count)
			}
			return err
		}
		for _, m := range resp.GetMessages() {
			if *count > 0 && printed == *count {
				break
			}
			if err := enc.Encode(listened(m)); err != nil {
				return err
			}
			printed++
			ackCtx, cancel := callContext()
			_, err := c.AcknowledgeMessages(ackCtx, &dispatcherv1.AcknowledgeMessagesRequest{Agent: agent, Cursor: m.GetCursor()})
			cancel()
			if err != nil {
				return fmt.Errorf("acknowledge cursor %d: %w", m.GetCursor(), err)
			}
		}
	}
	return nil
}
