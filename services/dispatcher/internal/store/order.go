package store

import (
	"context"
	"slices"
	"time"
)

// OrderState is where an order stands.
type OrderState string

// The states of an order.
const (
	OrderActive    OrderState = "active"
	OrderSucceeded OrderState = "succeeded"
	OrderFailed    OrderState = "failed"
)

// Order is a binding agreement of one (dialogue, consumer, supplier) pair,
// with its audit trail. Orders are never deleted.
type Order struct {
	ID          string            `json:"id"`
	Dialogue    string            `json:"dialogue"`
	Protocol    string            `json:"protocol"`
	Consumer    string            `json:"consumer"` // the dialogue's initiator
	Supplier    string            `json:"supplier"` // the pair's counterpart
	State       OrderState        `json:"state"`
	CreateTime  time.Time         `json:"createTime"`
	UpdateTime  time.Time         `json:"updateTime"`
	Transitions []OrderTransition `json:"transitions"`
}

// OrderTransition is one recorded message of an order's pair.
type OrderTransition struct {
	Type      string     `json:"type"`
	MessageID string     `json:"messageId"`
	Sender    string     `json:"sender,omitempty"` // "" for the network
	Time      time.Time  `json:"time"`
	State     OrderState `json:"state"` // the order's state after it
	// Lapse is the pair's first pending deadline after it, if any.
	Lapse *OrderLapse `json:"lapse,omitempty"`
}

// OrderLapse is the deadline that ends an order's pair, with a failure at
// its instant, unless a message meets it first (protocolcontrol reads a
// passed deadline so, whether or not its timer has fired).
type OrderLapse struct {
	Deadline  string    `json:"deadline"`
	At        time.Time `json:"at"`
	MessageID string    `json:"messageId"` // the id of the expiry its timer sends
}

// OrderWrite is one RecordOrder call, made inside another write.
type OrderWrite struct {
	Order      Order
	Transition OrderTransition
	Open       bool
}

// OrderStore keeps orders. Every method checks ctx first.
type OrderStore interface {
	// RecordOrder appends tr to the order of o's pair (o.Dialogue,
	// o.Consumer, o.Supplier) and sets its state to tr.State. When the pair
	// has no order, open creates one from o (o.ID, o.Protocol, with
	// CreateTime tr.Time); without open that is ErrNotFound. A transition
	// whose MessageID is already recorded changes nothing, so a retry is
	// harmless. It returns the order as stored.
	RecordOrder(ctx context.Context, o Order, tr OrderTransition, open bool) (Order, error)
	// GetOrder returns an order as stored (Order.At gives it as it stands
	// at a time); ErrNotFound when absent.
	GetOrder(ctx context.Context, id string) (Order, error)
	// ListOrders returns up to limit orders agent is a party to whose ids
	// sort after after, in id order, as stored; unless state is "", only
	// those in state at now (Order.At).
	ListOrders(ctx context.Context, agent string, state OrderState, now time.Time, after string, limit int) ([]Order, error)
}

// At returns o as it stands at now. An active order whose pair's deadline
// (its last transition's Lapse) has passed failed at that instant: it gets
// the expiry transition the deadline's timer records when it fires, so
// that a read before the firing and one after agree.
func (o Order) At(now time.Time) Order {
	n := len(o.Transitions)
	if o.State != OrderActive || n == 0 {
		return o
	}
	l := o.Transitions[n-1].Lapse
	if l == nil || now.Before(l.At) {
		return o
	}
	o.Transitions = append(slices.Clip(o.Transitions), OrderTransition{
		Type: l.Deadline + "_expired", MessageID: l.MessageID, Time: l.At, State: OrderFailed,
	})
	o.State, o.UpdateTime = OrderFailed, l.At
	return o
}

// LapseAt is when o fails unless a message meets its pair's deadline: its
// last transition's Lapse time, while it is active; zero otherwise.
func (o Order) LapseAt() time.Time {
	if n := len(o.Transitions); o.State == OrderActive && n > 0 && o.Transitions[n-1].Lapse != nil {
		return o.Transitions[n-1].Lapse.At
	}
	return time.Time{}
}

// Apply appends tr to o's trail and sets o's state from it, unless a
// transition of tr's message is recorded already (a retry: o is left as
// it is). It reports whether o changed.
func (o *Order) Apply(tr OrderTransition) bool {
	if slices.ContainsFunc(o.Transitions, func(t OrderTransition) bool { return t.MessageID == tr.MessageID }) {
		return false
	}
	o.Transitions = append(o.Transitions, tr)
	o.State, o.UpdateTime = tr.State, tr.Time
	return true
}
