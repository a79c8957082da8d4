// Package store defines the tasks's storage contract. Backends live in
// sub-packages (boltstore); handlers see only this interface.
package store

import (
	"context"
	"errors"
)

// Sentinel errors; backends wrap them.
var (
	ErrNotFound      = errors.New("not found")
	ErrAlreadyExists = errors.New("already exists")
)

// Store is the tasks's persistent state.
type Store interface {
	// Ping reports whether the store is open and usable.
	Ping(ctx context.Context) error
	// Close releases the store. Calls after Close fail.
	Close() error
}
