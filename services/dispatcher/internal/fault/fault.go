// Package fault is the dispatcher core's caller-facing error: a message fit
// for the caller that wraps one sentinel of its package (inbound.ErrLLM,
// outbound.ErrTargetRefused, ...), so adapters map it with errors.Is and
// show its text as is.
package fault

// Error is a message for the caller that wraps a kind.
type Error struct {
	msg  string
	kind error
}

// New returns an error whose text is msg and which wraps kind.
func New(kind error, msg string) error { return &Error{msg: msg, kind: kind} }

// Error returns the caller-facing message.
func (e *Error) Error() string { return e.msg }

// Unwrap returns the kind, for errors.Is.
func (e *Error) Unwrap() error { return e.kind }
