package grpcerr

import (
	"errors"
	"fmt"
	"io"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/parleyhq/parley/platform/resource"
)

func TestViolations_listEveryField(t *testing.T) {
	var v Violations
	if err := v.Err("BAD", "x.parley.dev"); err != nil {
		t.Fatalf("empty Violations.Err() = %v, want nil", err)
	}
	v.Add("name", "must not be empty")
	v.Add("page_size", "must not be negative")
	err := v.Err("BAD", "x.parley.dev")
	st := status.Convert(err)
	if st.Code() != codes.InvalidArgument {
		t.Fatalf("code = %v, want InvalidArgument", st.Code())
	}
	var fields []string
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, f := range br.GetFieldViolations() {
				fields = append(fields, f.GetField())
			}
		}
	}
	if len(fields) != 2 || fields[0] != "name" || fields[1] != "page_size" {
		t.Errorf("BadRequest fields = %v, want [name page_size]", fields)
	}
	if got := Reason(err); got != "BAD" {
		t.Errorf("Reason() = %q, want BAD", got)
	}
}

// FromStore gives transient store failures a retryable code and a reason,
// and leaves every other error to the caller.
func TestFromStore(t *testing.T) {
	tests := []struct {
		name       string
		err        error
		wantCode   codes.Code
		wantReason string
	}{
		{"contention", fmt.Errorf("update: %w", resource.ErrContention), codes.Aborted, ReasonStoreContention},
		{"unreachable", fmt.Errorf("connect: %w", io.ErrUnexpectedEOF), codes.Unavailable, ReasonStoreUnavailable},
		{"other", errors.New("boom"), codes.OK, ""},
		{"not found", resource.NotFound("agent", "clients/a/agents/b"), codes.OK, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := FromStore(tt.err, "test.parley.dev")
			if tt.wantCode == codes.OK {
				if got != nil {
					t.Errorf("FromStore(%v) = %v, want nil", tt.err, got)
				}
				return
			}
			if status.Code(got) != tt.wantCode || Reason(got) != tt.wantReason {
				t.Errorf("FromStore(%v) = %v (reason %q), want %v %s", tt.err, got, Reason(got), tt.wantCode, tt.wantReason)
			}
		})
	}
}
