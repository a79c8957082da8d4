package grpcerr

import (
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
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
