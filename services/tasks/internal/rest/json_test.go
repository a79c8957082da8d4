package rest

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/parleyhq/parley/platform/grpcerr"
)

// In `parley gateway` the backend is a gRPC client: when the tasks service
// cannot be reached, the status is the transport's, whose text names our
// addresses. Callers get one sentence; the service's own UNAVAILABLE
// answers (with a reason) keep their message.
func TestWriteStatus_transportErrorNamesNothingOfOurs(t *testing.T) {
	for _, tt := range []struct {
		name      string
		err       error
		want      string
		wantNotIn string
	}{
		{"transport", status.Error(codes.Unavailable, `connection error: desc = "transport: Error while dialing: dial tcp 10.1.2.3:9090: connect: connection refused"`),
			"the tasks service is unavailable; retry later", "10.1.2.3"},
		{"service's own", grpcerr.New(codes.Unavailable, "the server is shutting down; reconnect", "SHUTTING_DOWN", "tasks.parley.dev", nil),
			"the server is shutting down; reconnect", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			writeStatus(rec, tt.err)
			body := rec.Body.String()
			if rec.Code != http.StatusServiceUnavailable || !strings.Contains(body, tt.want) || (tt.wantNotIn != "" && strings.Contains(body, tt.wantNotIn)) {
				t.Errorf("writeStatus(%v) = %d %s, want 503 with %q", tt.err, rec.Code, body, tt.want)
			}
		})
	}
}
