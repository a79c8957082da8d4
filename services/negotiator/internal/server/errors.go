package server

import (
	"context"
	"errors"
	"log/slog"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/platform/resource"
	"github.com/parleyhq/parley/services/negotiator/internal/ledger"
	"github.com/parleyhq/parley/services/negotiator/internal/llm"
	"github.com/parleyhq/parley/services/negotiator/internal/negotiation"
	"github.com/parleyhq/parley/services/negotiator/internal/protocol"
	"github.com/parleyhq/parley/services/negotiator/internal/routine"
)

// Errors of the server's own making.
var (
	errLLMUnavailable = errors.New("the LLM provider is unavailable")
	errOutputInvalid  = errors.New("the LLM's answer is not valid")
	errRoutineFailed  = errors.New("the routine failed its check")
	errNotInShadow    = errors.New("the routine candidate is not in shadow")
	errConflict       = errors.New("the negotiation changed concurrently")
)

func withReason(code codes.Code, msg, reason string) error {
	return grpcerr.New(code, msg, reason, Domain, nil)
}

// toStatus maps domain and store errors to gRPC statuses, once.
func (s *Server) toStatus(ctx context.Context, err error) error {
	var be *ledger.BudgetError
	var missing *resource.Error
	switch {
	case err == nil:
		return nil
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	case errors.Is(err, llm.ErrNotConfigured):
		return withReason(codes.FailedPrecondition, "no LLM is configured for the negotiator; set --llm-provider and --llm-model, or use schemas for the deterministic path", "LLM_NOT_CONFIGURED")
	case errors.As(err, &be):
		return grpcerr.New(codes.ResourceExhausted, be.Error(), "LLM_BUDGET_EXHAUSTED", Domain, map[string]string{"scope": be.Scope, "who": be.Who})
	case errors.Is(err, errLLMUnavailable):
		s.logger.WarnContext(ctx, "llm provider failed; the caller may retry", slog.Any("err", err))
		return withReason(codes.Unavailable, "the LLM provider is unavailable; retry later", "LLM_UNAVAILABLE")
	case errors.Is(err, errOutputInvalid):
		return withReason(codes.FailedPrecondition, err.Error(), "LLM_OUTPUT_INVALID")
	case errors.Is(err, errRoutineFailed):
		return withReason(codes.FailedPrecondition, err.Error(), "ROUTINE_FAILED_EXAMPLES")
	case errors.Is(err, errNotInShadow):
		return withReason(codes.FailedPrecondition, err.Error(), "ROUTINE_NOT_IN_SHADOW")
	case errors.Is(err, errConflict):
		return withReason(codes.Aborted, err.Error()+"; retry", "NEGOTIATION_CONFLICT")
	case errors.Is(err, routine.ErrSchemaMismatch):
		return withReason(codes.FailedPrecondition, err.Error(), "SCHEMA_MISMATCH")
	case errors.Is(err, negotiation.ErrNoSchemas), errors.Is(err, negotiation.ErrInvalidTask), errors.Is(err, routine.ErrNoSchemas):
		return withReason(codes.InvalidArgument, err.Error(), "INVALID_TASK")
	case errors.Is(err, protocol.ErrMalformed):
		return withReason(codes.InvalidArgument, err.Error(), "MALFORMED_PROTOCOL")
	case errors.Is(err, negotiation.ErrMalformed):
		return withReason(codes.InvalidArgument, err.Error(), "MALFORMED_NEGOTIATION_MESSAGE")
	case errors.Is(err, negotiation.ErrClosed):
		return withReason(codes.FailedPrecondition, "the negotiation is closed", "NEGOTIATION_CLOSED")
	case errors.Is(err, negotiation.ErrOutOfTurn), errors.Is(err, negotiation.ErrHashDiffer):
		return withReason(codes.FailedPrecondition, err.Error(), "NEGOTIATION_OUT_OF_TURN")
	case errors.As(err, &missing):
		return grpcerr.FromResource(missing, Domain)
	case grpcerr.FromStore(err, Domain) != nil:
		s.logger.WarnContext(ctx, "transient store failure; the caller may retry", slog.Any("err", err))
		return grpcerr.FromStore(err, Domain)
	default: // the caller sees only "internal error", so log it here
		s.logger.ErrorContext(ctx, "unexpected error", slog.Any("err", err))
		return status.Error(codes.Internal, "internal error")
	}
}
