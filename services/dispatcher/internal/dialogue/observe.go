package dialogue

import (
	"context"
	"encoding/json"
	"slices"
	"time"

	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

// PairMove is one (dialogue, counterpart) pair whose protocol state a
// delivered message moved.
type PairMove struct {
	Dialogue    string
	Protocol    string
	Initiator   string
	Counterpart string
	Prev, Next  json.RawMessage // the pair's state before (nil at the opener) and after
	MessageID   string
	Type        string
	Sender      string
	Time        time.Time
}

// Observer is told of moved pairs after the message is durably in the
// recipients' mailboxes. What it does (arm deadlines, record orders) cannot
// undo the send, so it handles its own failures.
type Observer interface {
	PairsMoved(ctx context.Context, moves []PairMove)
}

// pairChange is one pair's state change a message made: prev (nil at the
// pair's first message) became next.
type pairChange struct {
	pair       store.Pair
	prev, next json.RawMessage
}

// observe returns a pass-through for report's result that first tells the
// Observer of the pairs whose recipients got msg.
func (s *Service) observe(ctx context.Context, d store.Dialogue, msg mailbox.Message, changes []pairChange) func(Result, error) (Result, error) {
	return func(res Result, err error) (Result, error) {
		if err != nil || s.opts.Observer == nil || len(changes) == 0 {
			return res, err
		}
		var moves []PairMove
		for _, c := range changes {
			counterpart := c.pair.B
			if counterpart == d.Initiator {
				counterpart = c.pair.A
			}
			other := c.pair.A
			if other == msg.Sender {
				other = c.pair.B
			}
			if !slices.Contains(res.Recipients, other) {
				continue // its mailbox refused the message; the pair was not written
			}
			moves = append(moves, PairMove{
				Dialogue: d.ID, Protocol: d.Protocol, Initiator: d.Initiator, Counterpart: counterpart,
				Prev: c.prev, Next: c.next, MessageID: msg.ID, Type: msg.Type, Sender: msg.Sender, Time: msg.Time,
			})
		}
		if len(moves) > 0 {
			s.opts.Observer.PairsMoved(ctx, moves)
		}
		return res, err
	}
}
