package mailbox

import (
	"context"
	"errors"
	"time"
)

// State is one agent's mailbox position.
type State struct {
	// Head is the cursor of the newest message appended; 0 when none ever
	// was. Cursors start at 1.
	Head uint64
	// Acked is the acknowledged cursor: delivery resumes after it. Acked
	// never exceeds Head and never moves back.
	Acked uint64
	// Pending counts the messages after Acked, and PendingBytes their
	// bodies' bytes: what the size bound limits.
	Pending      int64
	PendingBytes int64
}

// Bound is the size bound of each agent's mailbox: the unacknowledged
// messages it may hold and their body bytes. Zero fields are unbounded.
type Bound struct {
	MaxMessages int64
	MaxBytes    int64
}

// ErrCursorAhead is returned when an agent acknowledges a cursor past its
// mailbox's head: a cursor it cannot have received.
var ErrCursorAhead = errors.New("cursor is past the mailbox head")

// Store is the mailboxes' persistent state. Every method checks ctx first.
// Each write is one transaction that is durable when the method returns.
type Store interface {
	// AppendMessage stores m once (ErrAlreadyExists when m.ID is taken) and
	// appends a reference to it to each recipient's mailbox, under that
	// mailbox's next cursor. A recipient whose mailbox would then exceed
	// bound gets nothing and is returned as a Refusal{Err: ErrFull}. When
	// no recipient accepts, the body is not stored. recipients must be
	// distinct.
	AppendMessage(ctx context.Context, m Message, recipients []string, bound Bound) ([]Delivery, []Refusal, error)
	// ReadMailbox returns up to limit messages of agent's mailbox with a
	// cursor after after, in cursor order. Compacted messages are gone.
	ReadMailbox(ctx context.Context, agent string, after uint64, limit int) ([]Delivery, error)
	// AcknowledgeMailbox moves agent's acknowledged cursor forward to
	// cursor (a cursor at or before it changes nothing) and returns the new
	// state. A cursor past the head is ErrCursorAhead.
	AcknowledgeMailbox(ctx context.Context, agent string, cursor uint64) (State, error)
	// ClearMailbox acknowledges agent's whole backlog (to the head).
	ClearMailbox(ctx context.Context, agent string) (State, error)
	// GetMailbox returns agent's state; the zero State for a mailbox never
	// written.
	GetMailbox(ctx context.Context, agent string) (State, error)
	// CompactMailboxes deletes up to limit acknowledged references to
	// messages sent before before, and each body no mailbox references any
	// more. It returns how many references it deleted; fewer than limit
	// means nothing is left to compact.
	CompactMailboxes(ctx context.Context, before time.Time, limit int) (int, error)
}
