// Package order keeps the orders of service transactions: the binding
// agreement a (dialogue, counterpart) pair forms when its protocol accepts a
// message marked opensOrder, with an audit trail of every later message of
// the pair (who, when, which message id) and the state the outcomes put it
// in. Orders are never deleted, and only their two parties read them.
//
// The dialogue layer calls Record for every message it accepts on a pair
// of a protocol with a state machine, and the deadline scheduler for every
// expiry; Record looks at the pair's state before and after (protocolcontrol)
// and does nothing for pairs that hold no order.
package order

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"time"

	"github.com/parleyhq/parley/services/dispatcher/internal/deadline"
	"github.com/parleyhq/parley/services/dispatcher/internal/protocolcontrol"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

// Event is one accepted message, or one expiry, of a pair.
type Event struct {
	Dialogue string
	Protocol string
	Consumer string // the dialogue's initiator
	Supplier string // the pair's counterpart
	// Prev and Next are the pair's protocol state before and after.
	Prev, Next json.RawMessage
	MessageID  string
	Type       string
	Sender     string // "" for the network
	Time       time.Time
}

// Recorder records events on orders.
type Recorder struct {
	store store.OrderStore
}

// New returns a Recorder storing orders in st.
func New(st store.OrderStore) *Recorder {
	return &Recorder{store: st}
}

// ID returns the id of the order of the pair (dialogue, supplier): 32 hex
// digits of SHA-256 over "parley-order", the dialogue id and the
// supplier's name, each followed by a zero byte but the last. It is fixed
// by the pair, so both parties know it before the order forms (an owner
// signs approvals of it), and as unguessable as the dialogue id.
func ID(dialogue, supplier string) string {
	sum := sha256.Sum256([]byte("parley-order\x00" + dialogue + "\x00" + supplier))
	return hex.EncodeToString(sum[:16])
}

// Record records e on its pair's order, forming the order when e is the
// message that opened it. It reports whether the pair holds an order (and
// so whether anything was recorded).
func (r *Recorder) Record(ctx context.Context, e Event) (store.Order, bool, error) {
	w, err := Plan(e)
	if err != nil || w == nil {
		return store.Order{}, false, err
	}
	out, err := r.store.RecordOrder(ctx, w.Order, w.Transition, w.Open)
	return out, err == nil, err
}

// Plan returns what recording e writes (store.OrderStore.RecordOrder's
// arguments), or nil when its pair holds no order, so that a message's own
// transaction can write it.
func Plan(e Event) (*store.OrderWrite, error) {
	prev, err := protocolcontrol.Inspect(e.Prev)
	if err != nil {
		return nil, err
	}
	next, err := protocolcontrol.Inspect(e.Next)
	if err != nil {
		return nil, err
	}
	if !next.Order {
		return nil, nil
	}
	o := store.Order{Dialogue: e.Dialogue, Protocol: e.Protocol, Consumer: e.Consumer, Supplier: e.Supplier}
	tr := store.OrderTransition{Type: e.Type, MessageID: e.MessageID, Sender: e.Sender, Time: e.Time.UTC(), State: State(next)}
	if d, ok := next.FirstDeadline(); ok {
		// Reads report the lapse from its instant on (store.Order.At), as
		// the expiry the timer will record.
		t := store.Timer{Dialogue: e.Dialogue, Initiator: e.Consumer, Counterpart: e.Supplier, Protocol: e.Protocol, Name: d.Name, At: d.At}
		tr.Lapse = &store.OrderLapse{Deadline: d.Name, At: d.At.UTC(), MessageID: deadline.ID(t)}
	}
	if !prev.Order {
		o.ID = ID(e.Dialogue, e.Supplier)
	}
	return &store.OrderWrite{Order: o, Transition: tr, Open: !prev.Order}, nil
}

// State is the order state a pair's state stands for: its outcome so far.
func State(p protocolcontrol.Pair) store.OrderState {
	switch p.Outcome {
	case protocolcontrol.OutcomeSuccess:
		return store.OrderSucceeded
	case protocolcontrol.OutcomeFailure:
		return store.OrderFailed
	}
	return store.OrderActive
}
