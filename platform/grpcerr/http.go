package grpcerr

import (
	"net/http"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// HTTPStatus is the one table from gRPC status to HTTP status that every
// Parley HTTP route uses: the gateway's, the hand-written REST routes' and
// the Agora routes'. It follows the grpc-gateway's mapping, with one
// exception: RESOURCE_EXHAUSTED whose ErrorInfo reason ends in _TOO_LARGE (a
// document or upload over a size limit) is 413, not 429. An error that is
// not a status is 500.
func HTTPStatus(err error) int {
	if err == nil {
		return http.StatusOK
	}
	switch status.Code(err) {
	case codes.OK:
		return http.StatusOK
	case codes.Canceled:
		return 499 // client closed request; nobody reads it
	case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange:
		return http.StatusBadRequest
	case codes.DeadlineExceeded:
		return http.StatusGatewayTimeout
	case codes.NotFound:
		return http.StatusNotFound
	case codes.AlreadyExists, codes.Aborted:
		return http.StatusConflict
	case codes.PermissionDenied:
		return http.StatusForbidden
	case codes.Unauthenticated:
		return http.StatusUnauthorized
	case codes.ResourceExhausted:
		if strings.HasSuffix(Reason(err), "_TOO_LARGE") {
			return http.StatusRequestEntityTooLarge
		}
		return http.StatusTooManyRequests
	case codes.Unimplemented:
		return http.StatusNotImplemented
	case codes.Unavailable:
		return http.StatusServiceUnavailable
	default: // Unknown, Internal, DataLoss
		return http.StatusInternalServerError
	}
}
