package server

import (
	"context"
	"errors"
	"log/slog"
	"strconv"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/platform/resource"
	"github.com/parleyhq/parley/services/registry/internal/fetch"
	"github.com/parleyhq/parley/services/registry/internal/pd"
	"github.com/parleyhq/parley/services/registry/internal/resolve"
	"github.com/parleyhq/parley/services/registry/internal/store"
)

// Reasons (ErrorInfo.reason) callers branch on.
const (
	reasonInvalidArgument    = "INVALID_ARGUMENT"
	reasonNotFound           = "NOT_FOUND"
	reasonInvalidMetadata    = "INVALID_PROTOCOL_METADATA"
	reasonTooLarge           = "PROTOCOL_TOO_LARGE"
	reasonCollision          = "PROTOCOL_SHA1_COLLISION"
	reasonProtocolNotFound   = "PROTOCOL_NOT_FOUND"
	reasonUnresolved         = "PROTOCOL_UNRESOLVED"
	reasonSourceInvalid      = "PROTOCOL_SOURCE_INVALID"
	reasonEtagMismatch       = "AGENT_ETAG_MISMATCH"
	reasonProtocolMissing    = "PROTOCOL_UNAVAILABLE"
	reasonTooManyProtocols   = "AGENT_PROTOCOLS_LIMIT"
	reasonPeerNotConfigured  = "PEER_NOT_CONFIGURED"
	reasonPeerUnavailable    = "PEER_UNAVAILABLE"
	reasonFetchBusy          = "FETCH_CAPACITY_EXHAUSTED"
	reasonClientExists       = "CLIENT_ALREADY_EXISTS"
	reasonClientNotFound     = "CLIENT_NOT_FOUND"
	reasonRegistrationClosed = "REGISTRATION_CLOSED"
	reasonRegistrationLimit  = "REGISTRATION_RATE_LIMITED"
	reasonKeyNotFound        = "KEY_NOT_FOUND"
	reasonKeyOwnerNotFound   = "KEY_OWNER_NOT_FOUND"
	reasonKeyLimit           = "KEY_LIMIT"
)

// toStatus maps domain and store errors to gRPC status errors.
func (s *Server) toStatus(ctx context.Context, err error) error {
	var nf *resolve.NotFoundError
	var missing *resource.Error
	var me *metadataError
	switch {
	case err == nil:
		return nil
	case isStatus(err):
		return err
	case errors.Is(err, errClosed):
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	case errors.As(err, &nf):
		return resolveStatus(nf)
	case errors.As(err, &me):
		v := grpcerr.Violations{{Field: me.field, Description: me.err.Error()}}
		return v.Err(reasonInvalidMetadata, Domain)
	case errors.Is(err, pd.ErrInvalidMetadata):
		return grpcerr.New(codes.InvalidArgument, err.Error(), reasonInvalidMetadata, Domain, nil)
	case errors.Is(err, errPeerTooLarge):
		return grpcerr.New(codes.ResourceExhausted, err.Error(), reasonTooLarge, Domain, nil)
	case errors.Is(err, store.ErrConflict):
		return grpcerr.New(codes.AlreadyExists, "a different document with the same SHA-1 is already stored; the stored one is kept ("+err.Error()+")", reasonCollision, Domain, nil)
	case errors.As(err, &missing):
		return grpcerr.FromResource(missing, Domain)
	case errors.Is(err, store.ErrNotFound): // a store error that does not name its kind
		return grpcerr.New(codes.NotFound, err.Error(), reasonNotFound, Domain, nil)
	case grpcerr.FromStore(err, Domain) != nil:
		s.logger.WarnContext(ctx, "transient store failure; the caller may retry", slog.Any("err", err))
		return grpcerr.FromStore(err, Domain)
	default: // the caller sees only "internal error", so log it here
		s.logger.ErrorContext(ctx, "unexpected error", slog.Any("err", err))
		return status.Error(codes.Internal, "internal error")
	}
}

func isStatus(err error) bool {
	_, ok := status.FromError(err)
	return ok
}

// metadataError is a document failing metadata validation, with the request
// field that carried it.
type metadataError struct {
	field string
	err   error
}

func (e *metadataError) Error() string { return e.field + ": " + e.err.Error() }
func (e *metadataError) Unwrap() error { return e.err }

// resolveStatus picks one code for a failed resolution. Input the caller
// can fix (malformed or refused sources, wrong bytes, bad metadata) is
// INVALID_ARGUMENT; else a document over the limit is RESOURCE_EXHAUSTED
// PROTOCOL_TOO_LARGE; else a source not tried for want of a fetch slot is
// RESOURCE_EXHAUSTED FETCH_CAPACITY_EXHAUSTED (retry later); else nothing
// could be fetched: NOT_FOUND. The message names every source.
func resolveStatus(nf *resolve.NotFoundError) error {
	if len(nf.Sources) == 0 {
		return grpcerr.New(codes.NotFound, nf.Error(), reasonProtocolNotFound, Domain, map[string]string{"protocol": nf.Hash.Hex()})
	}
	var fields grpcerr.Violations
	invalid, tooLarge, busy := false, false, false
	for _, se := range nf.Sources {
		field := "sources[" + strconv.Itoa(se.Index) + "]"
		fields.Add(field, se.Err.Error())
		switch {
		case errors.Is(se.Err, fetch.ErrMalformed), errors.Is(se.Err, fetch.ErrRefused), errors.Is(se.Err, resolve.ErrMismatch), errors.Is(se.Err, pd.ErrInvalidMetadata):
			invalid = true
		case errors.Is(se.Err, fetch.ErrTooLarge):
			tooLarge = true
		case errors.Is(se.Err, fetch.ErrBusy):
			busy = true
		}
	}
	switch {
	case invalid:
		return fields.ErrWithMessage(nf.Error(), reasonSourceInvalid, Domain)
	case tooLarge:
		return grpcerr.New(codes.ResourceExhausted, nf.Error(), reasonTooLarge, Domain, map[string]string{"protocol": nf.Hash.Hex()})
	case busy:
		return grpcerr.New(codes.ResourceExhausted, nf.Error(), reasonFetchBusy, Domain, map[string]string{"protocol": nf.Hash.Hex()})
	default:
		return grpcerr.New(codes.NotFound, nf.Error(), reasonUnresolved, Domain, map[string]string{"protocol": nf.Hash.Hex()})
	}
}

func isAlreadyExists(err error) bool { return errors.Is(err, store.ErrAlreadyExists) }
