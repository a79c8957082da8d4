// Package resource is the mechanism of resource names (AIP-122) that every
// service shares: the last segment of a name, and the error a store returns
// for a missing or taken resource, which carries the resource's kind and
// name so that one toStatus per service derives the ErrorInfo reason from
// it (AGENT_NOT_FOUND, TASK_ALREADY_EXISTS, ...). What a resource is stays
// in its owning service.
package resource

import (
	"errors"
	"strconv"
	"strings"
)

// The sentinels every *Error matches with errors.Is. Each service's store
// package re-exports them (store.ErrNotFound).
var (
	ErrNotFound      = errors.New("not found")
	ErrAlreadyExists = errors.New("already exists")
)

// Error reports one missing or taken resource.
type Error struct {
	// Kind names the resource's type in lower case words ("agent",
	// "routine candidate"); it makes the reason and the metadata key.
	Kind string
	// Name is the resource name (or the key) that was looked up.
	Name string
	// Err is ErrNotFound or ErrAlreadyExists.
	Err error
}

// NotFound reports that the resource name of kind does not exist.
func NotFound(kind, name string) error { return &Error{Kind: kind, Name: name, Err: ErrNotFound} }

// AlreadyExists reports that the resource name of kind is taken.
func AlreadyExists(kind, name string) error {
	return &Error{Kind: kind, Name: name, Err: ErrAlreadyExists}
}

func (e *Error) Error() string {
	what := "does not exist"
	if errors.Is(e.Err, ErrAlreadyExists) {
		what = "already exists"
	}
	return e.Kind + " " + strconv.Quote(e.Name) + " " + what
}

// Unwrap returns the sentinel, so errors.Is(err, ErrNotFound) holds.
func (e *Error) Unwrap() error { return e.Err }

// Reason is the ErrorInfo reason: the kind in UPPER_SNAKE plus _NOT_FOUND
// or _ALREADY_EXISTS.
func (e *Error) Reason() string {
	suffix := "_NOT_FOUND"
	if errors.Is(e.Err, ErrAlreadyExists) {
		suffix = "_ALREADY_EXISTS"
	}
	return strings.ToUpper(e.MetadataKey()) + suffix
}

// MetadataKey is the ErrorInfo metadata key that holds Name: the kind in
// lower_snake.
func (e *Error) MetadataKey() string { return strings.ReplaceAll(e.Kind, " ", "_") }

// ID returns the last segment of a resource name: "s1" of
// "tasks/t1/steps/s1".
func ID(name string) string { return name[strings.LastIndexByte(name, '/')+1:] }
