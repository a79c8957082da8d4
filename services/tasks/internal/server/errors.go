package server

import (
	"context"
	"errors"
	"log/slog"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/platform/resource"
	"github.com/parleyhq/parley/services/tasks/internal/artifactfs"
)

var (
	// errTaskFinished reports an action a finished task does not allow.
	errTaskFinished = errors.New("the task is finished")
	// errTooManyWaiting reports an agent at its cap of pending steps.
	errTooManyWaiting = errors.New("too many steps waiting")
)

// toStatus maps store, file and domain errors to gRPC statuses, once. The
// reason of NOT_FOUND and ALREADY_EXISTS comes from the store's error, which
// names the resource (TASK_NOT_FOUND).
func (s *Server) toStatus(ctx context.Context, err error) error {
	if _, ok := status.FromError(err); ok {
		return err
	}
	var re *resource.Error
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	case errors.As(err, &re):
		return grpcerr.FromResource(re, Domain)
	case errors.Is(err, errTaskFinished):
		return grpcerr.New(codes.FailedPrecondition, "the task is finished and can no longer be cancelled", "TASK_FINISHED", Domain, nil)
	case errors.Is(err, artifactfs.ErrBadName):
		return grpcerr.New(codes.InvalidArgument, err.Error(), "INVALID_ARTIFACT_NAME", Domain, nil)
	case errors.Is(err, artifactfs.ErrTooLarge):
		return grpcerr.New(codes.ResourceExhausted, "the artifact is larger than this server accepts", "ARTIFACT_TOO_LARGE", Domain, nil)
	case grpcerr.FromStore(err, Domain) != nil:
		s.logger.WarnContext(ctx, "transient store failure; the caller may retry", slog.Any("err", err))
		return grpcerr.FromStore(err, Domain)
	default: // the caller sees only "internal error", so log it here
		s.logger.ErrorContext(ctx, "unexpected store error", slog.Any("err", err))
		return status.Error(codes.Internal, "internal error")
	}
}
