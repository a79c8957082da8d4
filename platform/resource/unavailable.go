package resource

import (
	"errors"
	"io"
	"net"
	"strings"
)

// ErrContention reports that a store write kept conflicting with concurrent writes to
// the same data (PostgreSQL's serialization failures, retried until a
// bound) and was given up. Nothing was written; the caller may retry.
var ErrContention = errors.New("too many concurrent writes to the same data")

// Unavailable reports whether err says that a store's database could not
// be reached or lost its connection, so that the call may succeed when it
// is back: a network error (connection refused or reset, a dial that timed
// out), a connection that ended mid-message, an error the driver marks safe
// to retry (it failed before sending anything, such as a pooled connection
// found closed), or a PostgreSQL error of the connection-exception class
// (SQLSTATE 08…), a server shutting down or starting (57P01, 57P02, 57P03)
// or out of connections (53300). It reads only interfaces (SQLState,
// SafeToRetry, net.Error), so callers need not import the driver. Each
// service's toStatus maps it to UNAVAILABLE.
func Unavailable(err error) bool {
	var state interface{ SQLState() string }
	if errors.As(err, &state) {
		s := state.SQLState()
		return strings.HasPrefix(s, "08") || s == "57P01" || s == "57P02" || s == "57P03" || s == "53300"
	}
	var retry interface{ SafeToRetry() bool }
	if errors.As(err, &retry) && retry.SafeToRetry() {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF)
}
