// Package grpcerr builds gRPC status errors that carry the AIP-193 details
// Parley's clients branch on: an ErrorInfo with a stable UPPER_SNAKE reason,
// and for invalid arguments a BadRequest listing every bad field.
package grpcerr

import (
	"errors"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/parleyhq/parley/platform/resource"
)

// New returns a status error with code, message and an ErrorInfo whose
// domain names the service (for example "registry.parley.dev").
func New(code codes.Code, msg, reason, domain string, metadata map[string]string) error {
	st := status.New(code, msg)
	if reason == "" {
		return st.Err()
	}
	withInfo, err := st.WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: domain, Metadata: metadata})
	if err != nil {
		return st.Err()
	}
	return withInfo.Err()
}

// FieldViolation names one bad field of a request.
type FieldViolation struct {
	Field       string
	Description string
}

// Violations collects field violations while validating a request.
type Violations []FieldViolation

// Add records a bad field.
func (v *Violations) Add(field, description string) {
	*v = append(*v, FieldViolation{Field: field, Description: description})
}

// Err returns nil when there are no violations, else an INVALID_ARGUMENT
// status whose message names the first field and whose BadRequest lists all.
func (v Violations) Err(reason, domain string) error {
	if len(v) == 0 {
		return nil
	}
	msg := v[0].Field + ": " + v[0].Description
	if len(v) > 1 {
		msg += " (and more, see details)"
	}
	return v.ErrWithMessage(msg, reason, domain)
}

// ErrWithMessage is Err with a message of the caller's, for a failure whose
// one sentence says more than its first field (every source of a document
// that could not be resolved, say).
func (v Violations) ErrWithMessage(msg, reason, domain string) error {
	if len(v) == 0 {
		return nil
	}
	st := status.New(codes.InvalidArgument, msg)
	br := &errdetails.BadRequest{}
	for _, f := range v {
		br.FieldViolations = append(br.FieldViolations, &errdetails.BadRequest_FieldViolation{Field: f.Field, Description: f.Description})
	}
	withDetails, err := st.WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: domain}, br)
	if err != nil {
		return st.Err()
	}
	return withDetails.Err()
}

// Reason returns the ErrorInfo reason of a status error, or "".
func Reason(err error) string {
	var se interface{ GRPCStatus() *status.Status }
	if !errors.As(err, &se) {
		return ""
	}
	for _, d := range se.GRPCStatus().Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetReason()
		}
	}
	return ""
}

// FromResource turns a store's *resource.Error into NOT_FOUND or
// ALREADY_EXISTS with the reason it derives (AGENT_NOT_FOUND) and the name
// in metadata under its kind ({"agent": "clients/a/agents/b"}).
func FromResource(e *resource.Error, domain string) error {
	code := codes.NotFound
	if errors.Is(e, resource.ErrAlreadyExists) {
		code = codes.AlreadyExists
	}
	return New(code, e.Error(), e.Reason(), domain, map[string]string{e.MetadataKey(): e.Name})
}

// Reasons of FromStore.
const (
	ReasonStoreUnavailable = "STORE_UNAVAILABLE"
	ReasonStoreContention  = "STORE_CONTENTION"
)

// FromStore is the status of a transient store failure, or nil when err is
// none: UNAVAILABLE STORE_UNAVAILABLE when the store's database could not
// be reached or lost its connection (resource.Unavailable), ABORTED
// STORE_CONTENTION when a write kept conflicting with concurrent ones
// (resource.ErrContention). Both are safe to retry.
func FromStore(err error, domain string) error {
	switch {
	case errors.Is(err, resource.ErrContention):
		return New(codes.Aborted, "too many concurrent writes to the same data; retry", ReasonStoreContention, domain, nil)
	case resource.Unavailable(err):
		return New(codes.Unavailable, "the service's database is unavailable; retry shortly", ReasonStoreUnavailable, domain, nil)
	}
	return nil
}
