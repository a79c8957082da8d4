package grpcerr

import (
	"net/http"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
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

// statusJSON is the gateway's default marshaling of a status.
var statusJSON = protojson.MarshalOptions{EmitUnpopulated: true}

// WriteHTTP writes st as the gateway writes errors, with HTTP status code:
// the JSON of google.rpc.Status ({"code", "message", "details"}).
func WriteHTTP(w http.ResponseWriter, code int, st *status.Status) {
	body, err := statusJSON.Marshal(st.Proto())
	if err != nil {
		body = []byte(`{"code":13,"message":"internal error","details":[]}`)
		code = http.StatusInternalServerError
	}
	w.Header().Del("Trailer")
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(body)
}
