package server

import (
	"context"
	"errors"
	"log/slog"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/services/tasks/internal/artifactfs"
	"github.com/parleyhq/parley/services/tasks/internal/store"
)

var (
	// errTaskFinished reports an action a finished task does not allow.
	errTaskFinished = errors.New("the task is finished")
	// errTooManyWaiting reports an agent at its cap of pending steps.
	errTooManyWaiting = errors.New("too many steps waiting")
)

// toStatus maps store, file and domain errors to gRPC statuses; resource
// (TASK, STEP, ARTIFACT) prefixes the NOT_FOUND reason.
func (s *Server) toStatus(ctx context.Context, err error, resource string) error {
	if _, ok := status.FromError(err); ok {
		return err
	}
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	case errors.Is(err, store.ErrNotFound):
		return grpcerr.New(codes.NotFound, err.Error(), resource+"_NOT_FOUND", Domain, nil)
	case errors.Is(err, store.ErrAlreadyExists):
		return grpcerr.New(codes.AlreadyExists, err.Error(), resource+"_ALREADY_EXISTS", Domain, nil)
	case errors.Is(err, errTaskFinished):
		return grpcerr.New(codes.FailedPrecondition, "the task is finished and can no longer be cancelled", "TASK_FINISHED", Domain, nil)
	case errors.Is(err, artifactfs.ErrBadName):
		return grpcerr.New(codes.InvalidArgument, err.Error(), "INVALID_ARTIFACT_NAME", Domain, nil)
	case errors.Is(err, artifactfs.ErrTooLarge):
		return grpcerr.New(codes.ResourceExhausted, "the artifact is larger than this server accepts", "ARTIFACT_TOO_LARGE", Domain, nil)
	default: // the caller sees only "internal error", so log it here
		s.logger.ErrorContext(ctx, "unexpected store error", slog.Any("err", err))
		return status.Error(codes.Internal, "internal error")
	}
}
