package store

import (
	"context"
	"encoding/json"
	"time"
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
}

// TimerStore keeps durable timers and moves pair states when they fire.
// A timer is identified by (Dialogue, Counterpart, Name). Every method
// checks ctx first.
type TimerStore interface {
	// PutTimers stores timers, each replacing a stored timer of the same
	// identity (a deadline set again).
	PutTimers(ctx context.Context, timers []Timer) error
	// DueTimers returns up to limit timers due at now (At not after now),
	// earliest first.
	DueTimers(ctx context.Context, now time.Time, limit int) ([]Timer, error)
	// NextTimer returns the earliest timer; ok is false when none is stored.
	NextTimer(ctx context.Context) (t Timer, ok bool, err error)
	// PairState returns the protocol state of the dialogue's pair p; nil
	// when it has none.
	PairState(ctx context.Context, dialogue string, p Pair) (json.RawMessage, error)
	// FireTimer, in one transaction: when t is still stored with the same
	// At, applies mutate to its pair's state, writes the result (unless
	// mutate returns nil) and deletes t, and reports true. Otherwise
	// (fired, replaced or never stored) it changes nothing and reports
	// false. If mutate fails, nothing is written and its error is returned.
	FireTimer(ctx context.Context, t Timer, mutate func(state json.RawMessage) (json.RawMessage, error)) (bool, error)
}
