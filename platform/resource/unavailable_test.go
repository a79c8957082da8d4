package resource_test

import (
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/parleyhq/parley/platform/resource"
)

// sqlError carries a SQLSTATE, as the PostgreSQL driver's errors do.
type sqlError string

func (e sqlError) Error() string    { return "SQLSTATE " + string(e) }
func (e sqlError) SQLState() string { return string(e) }

// retryError is marked safe to retry or not, as the driver's errors are.
type retryError bool

func (e retryError) Error() string     { return "conn closed" }
func (e retryError) SafeToRetry() bool { return bool(e) }

func TestUnavailable(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"connection refused, wrapped", fmt.Errorf("failed to connect: %w", refused), true},
		{"connection ended mid-message", fmt.Errorf("failed to receive message: %w", io.ErrUnexpectedEOF), true},
		{"connection closed by the server", fmt.Errorf("receive message: %w", io.EOF), true},
		{"pooled connection found closed", fmt.Errorf("begin: %w", retryError(true)), true},
		{"not safe to retry", retryError(false), false},
		{"connection exception", sqlError("08006"), true},
		{"admin shutdown", fmt.Errorf("query: %w", sqlError("57P01")), true},
		{"crash shutdown", sqlError("57P02"), true},
		{"server starting", sqlError("57P03"), true},
		{"too many connections", sqlError("53300"), true},
		{"unique violation", sqlError("23505"), false},
		{"serialization failure", sqlError("40001"), false},
		{"plain error", errors.New("boom"), false},
		{"not found", resource.NotFound("agent", "clients/a/agents/b"), false},
		{"nil", nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := resource.Unavailable(tt.err); got != tt.want {
				t.Errorf("Unavailable(%v) = %v, want %v", tt.err, got, tt.want)
			}
		})
	}
}
