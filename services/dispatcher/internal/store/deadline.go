package store

import (
	"context"
	"encoding/json"
	"time"

	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
)

// Timer is a pending deadline of one (dialogue, counterpart) pair, held so
// that it fires after a restart too.
type Timer struct {
	Dialogue    string    `json:"dialogue"`
	Initiator   string    `json:"initiator"`   // the dialogue's initiator (the consumer)
	Counterpart string    `json:"counterpart"` // the other agent of the pair (a supplier)
	Protocol    string    `json:"protocol"`    // the PD's SHA-1, whose machine expires the pair
	Name        string    `json:"name"`        // the deadline, such as offer_timeout
	At          time.Time `json:"at"`
	// Retry, after a timer failed to fire, is when it is tried again
	// (TimerStore.RetryTimers); Failures counts its failures. Zero for a
	// timer that has not failed.
	Retry    time.Time `json:"retry,omitzero"`
	Failures int       `json:"failures,omitempty"`
}

// Due is when the timer is to fire: At, or its Retry after a failure.
func (t Timer) Due() time.Time {
	if t.Retry.After(t.At) {
		return t.Retry
	}
	return t.At
}

// TimerRetry puts off a timer that failed to fire.
type TimerRetry struct {
	Timer Timer     // as DueTimers listed it
	Retry time.Time // when it is due again
}

// TimerStore keeps durable timers and moves pair states when they fire.
// A timer is identified by (Dialogue, Counterpart, Name). Every method
// checks ctx first.
type TimerStore interface {
	// PutTimers stores timers, each replacing a stored timer of the same
	// identity (a deadline set again).
	PutTimers(ctx context.Context, timers []Timer) error
	// DueTimers returns up to limit timers due at now (Due not after now),
	// earliest due first.
	DueTimers(ctx context.Context, now time.Time, limit int) ([]Timer, error)
	// DueTimersAfter is DueTimers listing only the timers after after in
	// its order (after need not be stored still): the next batch, listed
	// while after's batch fires.
	DueTimersAfter(ctx context.Context, now time.Time, after Timer, limit int) ([]Timer, error)
	// NextTimer returns the timer due first; ok is false when none is
	// stored.
	NextTimer(ctx context.Context) (t Timer, ok bool, err error)
	// RetryTimers records a failure of each timer still stored as listed
	// (others are passed over: fired, replaced, or put off already): its
	// Failures grow by one and it is due at Retry. The back-off is stored,
	// so that it holds across restarts and replicas and costs no memory.
	RetryTimers(ctx context.Context, retries []TimerRetry) error
	// PairState returns the protocol state of the dialogue's pair p; nil
	// when it has none.
	PairState(ctx context.Context, dialogue string, p Pair) (json.RawMessage, error)
	// FireTimers fires timers in one transaction. For each timer still
	// stored as listed, due at the same time (others are passed over:
	// fired, replaced, put off or never stored), expire maps its pair's stored state (nil when none) to
	// what firing it writes: the pair's next state, and a message appended
	// to its recipients' mailboxes within bound (one whose id is already
	// stored is not appended again); then the timer is deleted. A timer
	// whose expire fails is left stored and changes nothing, and its error
	// is joined into the error returned with the others' results.
	FireTimers(ctx context.Context, timers []Timer, bound mailbox.Bound, expire func(Timer, json.RawMessage) (TimerFiring, error)) ([]FiredTimer, error)
}

// TimerFiring is what firing one timer writes.
type TimerFiring struct {
	// State is the pair's next state; nil leaves it as it is (the deadline
	// was met, replaced, or its pair ended: the timer just goes).
	State json.RawMessage
	// Mail, when it has an ID, goes to Recipients' mailboxes in the same
	// transaction.
	Mail       mailbox.Message
	Recipients []string
}

// FiredTimer is one timer FireTimers fired.
type FiredTimer struct {
	Timer Timer
	// Prev is the pair's state before; Next after, nil when unchanged.
	Prev, Next json.RawMessage
	// Delivered is what became of its message: the deliveries to wake
	// readers with, and the recipients whose mailboxes were full.
	Delivered Delivered
}
