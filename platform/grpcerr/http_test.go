package grpcerr

import (
	"errors"
	"net/http"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestHTTPStatus_everyCode(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want int
	}{
		{"nil", nil, http.StatusOK},
		{"canceled", status.Error(codes.Canceled, "x"), 499},
		{"unknown", status.Error(codes.Unknown, "x"), http.StatusInternalServerError},
		{"plain error", errors.New("x"), http.StatusInternalServerError},
		{"invalid argument", status.Error(codes.InvalidArgument, "x"), http.StatusBadRequest},
		{"deadline", status.Error(codes.DeadlineExceeded, "x"), http.StatusGatewayTimeout},
		{"not found", status.Error(codes.NotFound, "x"), http.StatusNotFound},
		{"already exists", status.Error(codes.AlreadyExists, "x"), http.StatusConflict},
		{"permission denied", status.Error(codes.PermissionDenied, "x"), http.StatusForbidden},
		{"unauthenticated", status.Error(codes.Unauthenticated, "x"), http.StatusUnauthorized},
		{"resource exhausted", New(codes.ResourceExhausted, "x", "QUOTA", "d", nil), http.StatusTooManyRequests},
		{"too large", New(codes.ResourceExhausted, "x", "ARTIFACT_TOO_LARGE", "d", nil), http.StatusRequestEntityTooLarge},
		{"failed precondition", status.Error(codes.FailedPrecondition, "x"), http.StatusBadRequest},
		{"aborted", status.Error(codes.Aborted, "x"), http.StatusConflict},
		{"out of range", status.Error(codes.OutOfRange, "x"), http.StatusBadRequest},
		{"unimplemented", status.Error(codes.Unimplemented, "x"), http.StatusNotImplemented},
		{"internal", status.Error(codes.Internal, "x"), http.StatusInternalServerError},
		{"unavailable", status.Error(codes.Unavailable, "x"), http.StatusServiceUnavailable},
		{"data loss", status.Error(codes.DataLoss, "x"), http.StatusInternalServerError},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := HTTPStatus(tt.err); got != tt.want {
				t.Errorf("HTTPStatus(%v) = %d, want %d", tt.err, got, tt.want)
			}
		})
	}
}
