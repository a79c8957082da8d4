package server

import (
	"context"
	"errors"
	"log/slog"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

// toStatus maps store and context errors to gRPC statuses; notFoundReason
// names the missing resource's ErrorInfo reason.
func (s *Server) toStatus(ctx context.Context, err error, notFoundReason string) error {
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	case errors.Is(err, store.ErrNotFound):
		return grpcerr.New(codes.NotFound, err.Error(), notFoundReason, Domain, nil)
	case errors.Is(err, store.ErrLimit):
		return grpcerr.New(codes.ResourceExhausted, err.Error(), "LIMIT_REACHED", Domain, nil)
	default:
		if _, ok := status.FromError(err); ok && status.Code(err) != codes.Unknown {
			return err
		}
		s.logger.ErrorContext(ctx, "unexpected error", slog.Any("err", err))
		return status.Error(codes.Internal, "internal error")
	}
}

// peerError translates a registry error for our callers: NOT_FOUND of a
// referenced resource is FAILED_PRECONDITION, UNAVAILABLE and deadlines
// pass through, the rest is logged and INTERNAL.
func (s *Server) peerError(ctx context.Context, err error, what string) error {
	switch status.Code(err) {
	case codes.NotFound:
		return grpcerr.New(codes.FailedPrecondition, what+" is not registered", "REFERENCE_NOT_FOUND", Domain, nil)
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		return status.Error(status.Code(err), what+": registry unavailable, retry later")
	}
	s.logger.ErrorContext(ctx, "registry call failed", slog.Any("err", err))
	return status.Error(codes.Internal, "internal error")
}

func invalid(field, desc string) error {
	var v grpcerr.Violations
	v.Add(field, desc)
	return v.Err("INVALID_ARGUMENT", Domain)
}
