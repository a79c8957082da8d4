package server

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/platform/resource"
	"github.com/parleyhq/parley/services/dispatcher/internal/dialogue"
	"github.com/parleyhq/parley/services/dispatcher/internal/directory"
	"github.com/parleyhq/parley/services/dispatcher/internal/hosted"
	"github.com/parleyhq/parley/services/dispatcher/internal/hub"
	"github.com/parleyhq/parley/services/dispatcher/internal/inbound"
	"github.com/parleyhq/parley/services/dispatcher/internal/llm"
	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
	"github.com/parleyhq/parley/services/dispatcher/internal/outbound"
	"github.com/parleyhq/parley/services/dispatcher/internal/payment"
	"github.com/parleyhq/parley/services/dispatcher/internal/routine"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

// statusRule maps a sentinel of the core to a code and an ErrorInfo
// reason. The error's own text is the message: the core writes it for the
// caller.
type statusRule struct {
	kind   error
	code   codes.Code
	reason string
}

// statusRules is the dispatcher's one table from core errors to statuses,
// most specific first.
var statusRules = []statusRule{
	{outbound.ErrUnknownAgent, codes.FailedPrecondition, "REFERENCE_NOT_FOUND"},
	{outbound.ErrUnknownProtocol, codes.FailedPrecondition, "REFERENCE_NOT_FOUND"},
	{outbound.ErrRegistry, codes.Unavailable, "REGISTRY_UNAVAILABLE"},
	{outbound.ErrNoSender, codes.FailedPrecondition, "NO_SENDER"},
	{outbound.ErrTargetRefused, codes.InvalidArgument, "TARGET_REFUSED"},
	{outbound.ErrTargetUnavailable, codes.Unavailable, "TARGET_UNAVAILABLE"},
	{llm.ErrLLMBudget, codes.ResourceExhausted, "LLM_BUDGET_EXHAUSTED"},
	{outbound.ErrLLM, codes.Unavailable, "LLM_FAILED"},
	{inbound.ErrUnknownAgent, codes.NotFound, "AGENT_NOT_FOUND"},
	{inbound.ErrRegistry, codes.Unavailable, "REGISTRY_UNAVAILABLE"},
	{inbound.ErrNoExecutor, codes.FailedPrecondition, "NO_EXECUTOR"},
	{inbound.ErrHandlerTimeout, codes.DeadlineExceeded, "HANDLER_TIMEOUT"},
	{inbound.ErrHandlerFailed, codes.Aborted, "HANDLER_FAILED"},
	{inbound.ErrRoutineFailed, codes.Aborted, "ROUTINE_FAILED"},
	{inbound.ErrLLM, codes.Unavailable, "LLM_FAILED"},
	{hosted.ErrInvalid, codes.InvalidArgument, "ROUTINE_INVALID"},
	{routine.ErrBusy, codes.ResourceExhausted, "ROUTINE_BUSY"},
	{hub.ErrNoHello, codes.InvalidArgument, "INVALID_ARGUMENT"},
	{hub.ErrBadHello, codes.InvalidArgument, "INVALID_ARGUMENT"},
	{hub.ErrDuplicateHello, codes.InvalidArgument, "DUPLICATE_HELLO"},
	{hub.ErrStopping, codes.Unavailable, "SHUTTING_DOWN"},
	{hub.ErrDropped, codes.ResourceExhausted, "AGENT_STUCK"},
	{errServiceProtocolsPending, codes.Unavailable, "SERVICE_PROTOCOLS_NOT_REGISTERED"},
	{directory.ErrNotFound, codes.NotFound, "NOT_FOUND"},
	{directory.ErrUnavailable, codes.Unavailable, "REGISTRY_UNAVAILABLE"},
	{directory.ErrRefused, codes.FailedPrecondition, "REFERENCE_INVALID"},
	{store.ErrLimit, codes.ResourceExhausted, "LIMIT_REACHED"},
	// The agent network's dialogues. A *dialogue.RefusedError (no
	// recipient accepted) wraps one of the recipient kinds; its metadata
	// names each refusal (toStatus).
	{dialogue.ErrNotReceived, codes.PermissionDenied, "MESSAGE_NOT_RECEIVED"},
	{dialogue.ErrRequestInProgress, codes.Aborted, "REQUEST_IN_PROGRESS"},
	{dialogue.ErrBroadcast, codes.PermissionDenied, "BROADCAST_NOT_ANSWERABLE"},
	{dialogue.ErrClosed, codes.FailedPrecondition, "DIALOGUE_CLOSED"},
	{dialogue.ErrUnknownProtocol, codes.FailedPrecondition, "REFERENCE_NOT_FOUND"},
	{dialogue.ErrUnavailable, codes.Unavailable, "REGISTRY_UNAVAILABLE"},
	{dialogue.ErrPermission, codes.PermissionDenied, "RECIPIENTS_REFUSED"},
	{dialogue.ErrUnknownAgent, codes.NotFound, "AGENT_NOT_FOUND"},
	{dialogue.ErrMailboxFull, codes.ResourceExhausted, "MAILBOX_FULL"},
	{dialogue.ErrProtocol, codes.FailedPrecondition, "PROTOCOL_ERROR"},
	{dialogue.ErrRecipientClosed, codes.FailedPrecondition, "RECIPIENT_CLOSED"},
	{dialogue.ErrGroupNotFound, codes.NotFound, "GROUP_NOT_FOUND"},
	{dialogue.ErrNoRecipient, codes.FailedPrecondition, "NO_RECIPIENT"},
	// Payments (the ledger provider).
	{payment.ErrNotPayee, codes.PermissionDenied, "NOT_PAYEE"},
	{payment.ErrNotReserved, codes.FailedPrecondition, "PAYMENT_NOT_RESERVED"},
	{payment.ErrRequestReused, codes.FailedPrecondition, "REQUEST_ID_REUSED"},
	{payment.ErrOpenLimit, codes.ResourceExhausted, "OPEN_PAYMENTS_LIMIT"},
	// Mailboxes.
	{mailbox.ErrReplaced, codes.Aborted, "STREAM_REPLACED"},
	{mailbox.ErrStopping, codes.Unavailable, "SHUTTING_DOWN"},
	{mailbox.ErrCursorAhead, codes.FailedPrecondition, "CURSOR_AHEAD"},
	{mailbox.ErrFull, codes.ResourceExhausted, "MAILBOX_FULL"},
	{mailbox.ErrInvalid, codes.InvalidArgument, "INVALID_ARGUMENT"},
}

// maxRefusalMetadata caps the refusals a status's ErrorInfo names.
const maxRefusalMetadata = 20

// refusalMetadata names a refused message's id and its first refusals,
// refused_0 = "clients/b/agents/x permission_denied", and so on; for a
// state machine's refusal also refused_0_rule (PAIR_ENDED, ...) and, when
// the rule names them, refused_0_state (the pair's state: the type of the
// last message it accepted) and refused_0_deadline. Clients branch on
// these, never on the message text.
func refusalMetadata(err error) map[string]string {
	var re *dialogue.RefusedError
	if !errors.As(err, &re) {
		return nil
	}
	md := map[string]string{"message_id": re.MessageID, "refused_count": strconv.Itoa(len(re.Refusals))}
	for i, r := range re.Refusals[:min(len(re.Refusals), maxRefusalMetadata)] {
		who := r.Agent
		if who == "" {
			who = r.Group
		}
		k := "refused_" + strconv.Itoa(i)
		md[k] = who + " " + string(r.Reason)
		for _, f := range []struct{ key, v string }{{"_rule", r.Rule}, {"_state", r.State}, {"_deadline", r.Deadline}} {
			if f.v != "" {
				md[k+f.key] = f.v
			}
		}
	}
	return md
}

// toStatus maps an error of the core to a gRPC status, deriving the code
// and reason from the sentinel it wraps. Anything unexpected is logged and
// INTERNAL.
func (s *Server) toStatus(ctx context.Context, err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return status.FromContextError(err).Err()
	}
	// A missing or taken resource (the store's, or an agent the registry
	// does not know) names its kind: ROUTINE_NOT_FOUND, AGENT_NOT_FOUND.
	var re *resource.Error
	if errors.As(err, &re) {
		return grpcerr.FromResource(re, Domain)
	}
	for _, r := range statusRules {
		if errors.Is(err, r.kind) {
			msg := err.Error()
			if errors.Is(r.kind, hosted.ErrInvalid) {
				msg = "routine.source does not run: " + strings.TrimPrefix(msg, hosted.ErrInvalid.Error()+": ")
			}
			return grpcerr.New(r.code, msg, r.reason, Domain, refusalMetadata(err))
		}
	}
	if st, ok := status.FromError(err); ok && st.Code() != codes.Unknown {
		return err
	}
	if st := grpcerr.FromStore(err, Domain); st != nil {
		s.logger.WarnContext(ctx, "transient store failure; the caller may retry", slog.Any("err", err))
		return st
	}
	s.logger.ErrorContext(ctx, "unexpected error", slog.Any("err", err))
	return status.Error(codes.Internal, "internal error")
}

func invalid(field, desc string) error {
	var v grpcerr.Violations
	v.Add(field, desc)
	return v.Err("INVALID_ARGUMENT", Domain)
}
