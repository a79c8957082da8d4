package server

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/services/dispatcher/internal/carddata"
	"github.com/parleyhq/parley/services/dispatcher/internal/dialogue"
	"github.com/parleyhq/parley/services/dispatcher/internal/directory"
	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
	"github.com/parleyhq/parley/services/dispatcher/internal/serviceprotocol"
)

// Limits of the dialogue RPCs that are not flags: they bound one request's
// work, whatever the deployment.
const (
	maxDirect       = 1000 // direct recipients of one message
	maxGroups       = 50   // group addresses of one message
	maxRegions      = 50   // regions of one distribution list
	maxCloseTypes   = 50   // message types of one CloseDialogueMessages
	maxTokenLen     = 64   // a message type, recipient type or region part
	maxMessageIDLen = 64   // an in_reply_to
)

// reservedTypes are message types only the network sends.
var reservedTypes = map[string]bool{"protocol_error": true, "general_error": true}

// begin starts a dialogue call once its request is valid (v holds no
// violation) and the agent network is wired; its context carries the call's
// time limit, which the caller cancels.
func (s *Server) begin(ctx context.Context, v grpcerr.Violations) (context.Context, context.CancelFunc, error) {
	if err := v.Err("INVALID_ARGUMENT", Domain); err != nil {
		return nil, nil, err
	}
	if s.dialogues == nil {
		return nil, nil, status.Error(codes.Unavailable, "the agent network is not available on this server: it has no mailboxes")
	}
	ctx, cancel := context.WithTimeout(ctx, s.opts.MessageTimeout)
	return ctx, cancel, nil
}

// SendMessage implements DispatcherService.
func (s *Server) SendMessage(ctx context.Context, req *dispatcherv1.SendMessageRequest) (*dispatcherv1.SendMessageResponse, error) {
	var v grpcerr.Violations
	checkSender(&v, req.GetSender())
	list := checkList(&v, req.GetTo())
	m := s.checkMessage(&v, req.GetMessageType(), req.GetRecipientType(), req.GetBodyJson(), req.GetRequestId())
	if p := req.GetProtocol(); p != "" && !isHex40(p) {
		v.Add("protocol", "must be 40 lowercase hex characters (a PD's SHA-1)")
	} else if sp, ok := serviceprotocol.ByHash(p); ok {
		v.Add("protocol", "is the service protocol "+sp.Name+": open it with NewRequest")
	}
	m.Protocol = req.GetProtocol()
	return s.open(ctx, v, req.GetSender(), mailbox.CategoryMessage, list, m)
}

// BroadcastMessage implements DispatcherService.
func (s *Server) BroadcastMessage(ctx context.Context, req *dispatcherv1.BroadcastMessageRequest) (*dispatcherv1.SendMessageResponse, error) {
	var v grpcerr.Violations
	checkSender(&v, req.GetSender())
	list := checkList(&v, req.GetTo())
	typ := req.GetMessageType()
	if typ == "" {
		typ = "broadcast"
	}
	m := s.checkMessage(&v, typ, req.GetRecipientType(), req.GetBodyJson(), req.GetRequestId())
	return s.open(ctx, v, req.GetSender(), mailbox.CategorySubscription, list, m)
}

func (s *Server) open(ctx context.Context, v grpcerr.Violations, sender string, cat mailbox.Category, list dialogue.List, m dialogue.Message) (*dispatcherv1.SendMessageResponse, error) {
	ctx, cancel, err := s.begin(ctx, v)
	if err != nil {
		return nil, err
	}
	defer cancel()
	res, err := s.dialogues.Open(ctx, sender, cat, list, m)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return sendResponse(res), nil
}

// ReplyMessage implements DispatcherService.
func (s *Server) ReplyMessage(ctx context.Context, req *dispatcherv1.ReplyMessageRequest) (*dispatcherv1.SendMessageResponse, error) {
	var v grpcerr.Violations
	checkSender(&v, req.GetSender())
	if !validMessageID(req.GetInReplyTo()) {
		v.Add("in_reply_to", "must be a message id (letters, digits, - and _, at most 64)")
	}
	m := s.checkMessage(&v, req.GetMessageType(), req.GetRecipientType(), req.GetBodyJson(), req.GetRequestId())
	ctx, cancel, err := s.begin(ctx, v)
	if err != nil {
		return nil, err
	}
	defer cancel()
	money, err := s.checkMoney(ctx, req.GetSender(), req.GetInReplyTo(), m.Type, m.Body)
	if st, refused := moneyStatus(err); refused {
		return nil, st
	}
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	m.ID = money.id()
	res, err := s.dialogues.Reply(ctx, req.GetSender(), req.GetInReplyTo(), req.GetAll(), m)
	money.done(ctx, err == nil, res)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return sendResponse(res), nil
}

// CloseDialogue implements DispatcherService.
func (s *Server) CloseDialogue(ctx context.Context, req *dispatcherv1.CloseDialogueRequest) (*dispatcherv1.Dialogue, error) {
	var v grpcerr.Violations
	agent, id := checkDialogueName(&v, req.GetName())
	return s.closeOp(ctx, v, agent, func(ctx context.Context) (dialogue.View, error) {
		return s.dialogues.Close(ctx, agent, id)
	})
}

// CloseDialogueMessages implements DispatcherService.
func (s *Server) CloseDialogueMessages(ctx context.Context, req *dispatcherv1.CloseDialogueMessagesRequest) (*dispatcherv1.Dialogue, error) {
	var v grpcerr.Violations
	agent, id := checkDialogueName(&v, req.GetName())
	types := req.GetMessageTypes()
	if len(types) == 0 || len(types) > maxCloseTypes {
		v.Add("message_types", fmt.Sprintf("must list 1 to %d message types", maxCloseTypes))
	}
	for i, t := range types {
		if !validToken(t) {
			v.Add(fmt.Sprintf("message_types[%d]", i), "must be letters, digits, _ - or ., at most 64")
		}
	}
	return s.closeOp(ctx, v, agent, func(ctx context.Context) (dialogue.View, error) {
		return s.dialogues.CloseMessages(ctx, agent, id, types)
	})
}

// CloseDialogueAgent implements DispatcherService.
func (s *Server) CloseDialogueAgent(ctx context.Context, req *dispatcherv1.CloseDialogueAgentRequest) (*dispatcherv1.Dialogue, error) {
	var v grpcerr.Violations
	agent, id := checkDialogueName(&v, req.GetName())
	if !directory.ValidAgentName(req.GetCounterpart()) {
		v.Add("counterpart", "must be clients/{client}/agents/{agent}")
	}
	return s.closeOp(ctx, v, agent, func(ctx context.Context) (dialogue.View, error) {
		return s.dialogues.CloseAgent(ctx, agent, id, req.GetCounterpart())
	})
}

func (s *Server) closeOp(ctx context.Context, v grpcerr.Violations, agent string, op func(context.Context) (dialogue.View, error)) (*dispatcherv1.Dialogue, error) {
	ctx, cancel, err := s.begin(ctx, v)
	if err != nil {
		return nil, err
	}
	defer cancel()
	view, err := op(ctx)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return dialogueProto(agent, view), nil
}

// CloseAllDialogues implements DispatcherService.
func (s *Server) CloseAllDialogues(ctx context.Context, req *dispatcherv1.CloseAllDialoguesRequest) (*dispatcherv1.CloseAllDialoguesResponse, error) {
	var v grpcerr.Violations
	if !directory.ValidAgentName(req.GetAgent()) {
		v.Add("agent", "must be clients/{client}/agents/{agent}")
	}
	ctx, cancel, err := s.begin(ctx, v)
	if err != nil {
		return nil, err
	}
	defer cancel()
	n, err := s.dialogues.CloseAll(ctx, req.GetAgent())
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	return &dispatcherv1.CloseAllDialoguesResponse{ClosedCount: int32(n)}, nil //nolint:gosec // bounded by the agent's dialogues in one transaction
}

func checkSender(v *grpcerr.Violations, sender string) {
	if !directory.ValidAgentName(sender) {
		v.Add("sender", "must be clients/{client}/agents/{agent}")
	}
}

// checkList validates a distribution list and returns it in the core's
// terms.
func checkList(v *grpcerr.Violations, to *dispatcherv1.DistributionList) dialogue.List {
	var l dialogue.List
	if len(to.GetDirect()) == 0 && len(to.GetGroups()) == 0 {
		v.Add("to", "must name at least one recipient in direct or groups")
	}
	if len(to.GetDirect()) > maxDirect {
		v.Add("to.direct", fmt.Sprintf("must list at most %d agents", maxDirect))
	}
	for i, a := range to.GetDirect() {
		if !directory.ValidAgentName(a) {
			v.Add(fmt.Sprintf("to.direct[%d]", i), "must be clients/{client}/agents/{agent}")
		}
		l.Direct = append(l.Direct, a)
	}
	if len(to.GetGroups()) > maxGroups {
		v.Add("to.groups", fmt.Sprintf("must list at most %d groups", maxGroups))
	}
	// The registry owns the rules of paths and regions (ResolveRecipients
	// checks them, and its verdict comes back naming our fields); only the
	// scope needs translating here.
	for i, g := range to.GetGroups() {
		scope, ok := scopes[g.GetScope()]
		if !ok {
			v.Add(fmt.Sprintf("to.groups[%d].scope", i), "must be GROUP_SCOPE_DIRECT, _LOCAL, _GLOBAL or _EXCLUSIVE")
		}
		l.Groups = append(l.Groups, dialogue.GroupAddress{Path: g.GetPath(), Scope: scope})
	}
	if len(to.GetRegions()) > maxRegions {
		v.Add("to.regions", fmt.Sprintf("must list at most %d regions", maxRegions))
	}
	for _, r := range to.GetRegions() {
		l.Regions = append(l.Regions, dialogue.Region{Country: r.GetCountry(), State: r.GetState(), City: r.GetCity()})
	}
	return l
}

var scopes = map[dispatcherv1.GroupScope]dialogue.Scope{
	dispatcherv1.GroupScope_GROUP_SCOPE_DIRECT:    dialogue.ScopeDirect,
	dispatcherv1.GroupScope_GROUP_SCOPE_LOCAL:     dialogue.ScopeLocal,
	dispatcherv1.GroupScope_GROUP_SCOPE_GLOBAL:    dialogue.ScopeGlobal,
	dispatcherv1.GroupScope_GROUP_SCOPE_EXCLUSIVE: dialogue.ScopeExclusive,
}

// checkMessage validates what the sender chooses of a message.
func (s *Server) checkMessage(v *grpcerr.Violations, typ, recipientType, body, requestID string) dialogue.Message {
	switch {
	case !validToken(typ):
		v.Add("message_type", "is required: letters, digits, _ - or ., at most 64")
	case reservedTypes[typ]:
		v.Add("message_type", typ+" is sent by the network only")
	}
	if recipientType == "" {
		recipientType = "recipient"
	} else if !validToken(recipientType) {
		v.Add("recipient_type", "must be letters, digits, _ - or ., at most 64")
	}
	switch {
	case body == "":
		v.Add("body_json", "is required: one JSON value, such as \"\\\"hello\\\"\"")
	case int64(len(body)) > s.opts.MessageMaxBodyBytes:
		v.Add("body_json", fmt.Sprintf("is %d bytes, over the limit of %d", len(body), s.opts.MessageMaxBodyBytes))
	case !json.Valid([]byte(body)):
		v.Add("body_json", "must be one JSON value")
	default:
		if at, ok := carddata.Find([]byte(body)); ok {
			v.Add("body_json", fmt.Sprintf("holds card data at %q (a card number or verification code): only payment references may pass through the network", at))
		}
	}
	if requestID != "" && !validMessageID(requestID) {
		v.Add("request_id", "must be letters, digits, - and _, at most 64")
	}
	return dialogue.Message{Type: typ, RecipientType: recipientType, Body: []byte(body), RequestID: requestID}
}

func validToken(s string) bool {
	if s == "" || len(s) > maxTokenLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

func validMessageID(s string) bool {
	if s == "" || len(s) > maxMessageIDLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// checkDialogueName parses clients/{c}/agents/{a}/dialogues/{id}.
func checkDialogueName(v *grpcerr.Violations, name string) (agent, id string) {
	agent, id, ok := strings.Cut(name, "/dialogues/")
	if !ok || !directory.ValidAgentName(agent) || !validMessageID(id) {
		v.Add("name", "must be clients/{client}/agents/{agent}/dialogues/{dialogue}")
	}
	return agent, id
}

var categories = map[string]dispatcherv1.MessageCategory{
	string(mailbox.CategoryMessage):       dispatcherv1.MessageCategory_MESSAGE_CATEGORY_MESSAGE,
	string(mailbox.CategorySubscription):  dispatcherv1.MessageCategory_MESSAGE_CATEGORY_SUBSCRIPTION,
	string(mailbox.CategoryService):       dispatcherv1.MessageCategory_MESSAGE_CATEGORY_SERVICE,
	string(mailbox.CategoryNotifications): dispatcherv1.MessageCategory_MESSAGE_CATEGORY_NOTIFICATIONS,
}

var refusalReasons = map[dialogue.Reason]dispatcherv1.RefusalReason{
	dialogue.ReasonPermission:    dispatcherv1.RefusalReason_REFUSAL_REASON_PERMISSION_DENIED,
	dialogue.ReasonUnknownAgent:  dispatcherv1.RefusalReason_REFUSAL_REASON_UNKNOWN_AGENT,
	dialogue.ReasonMailboxFull:   dispatcherv1.RefusalReason_REFUSAL_REASON_MAILBOX_FULL,
	dialogue.ReasonClosed:        dispatcherv1.RefusalReason_REFUSAL_REASON_CLOSED,
	dialogue.ReasonProtocol:      dispatcherv1.RefusalReason_REFUSAL_REASON_PROTOCOL_ERROR,
	dialogue.ReasonGroupNotFound: dispatcherv1.RefusalReason_REFUSAL_REASON_GROUP_NOT_FOUND,
}

func sendResponse(res dialogue.Result) *dispatcherv1.SendMessageResponse {
	out := &dispatcherv1.SendMessageResponse{
		DialogueId: res.DialogueID, MessageId: res.MessageID, CreateTime: timestamppb.New(res.Time),
		Category: categories[string(res.Category)], Recipients: res.Recipients,
	}
	for _, r := range res.Refusals {
		out.Refusals = append(out.Refusals, &dispatcherv1.RecipientRefusal{Agent: r.Agent, Group: r.Group, Reason: refusalReasons[r.Reason], Detail: r.Detail})
	}
	return out
}

func dialogueProto(agent string, v dialogue.View) *dispatcherv1.Dialogue {
	return &dispatcherv1.Dialogue{
		Name: agent + "/dialogues/" + v.Dialogue.ID, Initiator: v.Dialogue.Initiator, Category: categories[v.Dialogue.Category],
		Protocol: v.Dialogue.Protocol, CreateTime: timestamppb.New(v.Dialogue.CreateTime), Closed: v.Dialogue.Closed,
		ClosedForAgent: v.Participant.Closed, ClosedMessageTypes: v.Participant.ClosedTypes, ClosedAgents: v.Participant.ClosedAgents,
	}
}
