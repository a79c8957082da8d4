package server

import (
	"context"
	"fmt"

	"github.com/parleyhq/parley/services/dispatcher/internal/deadline"
	"github.com/parleyhq/parley/services/dispatcher/internal/dialogue"
	"github.com/parleyhq/parley/services/dispatcher/internal/directory"
	"github.com/parleyhq/parley/services/dispatcher/internal/order"
	"github.com/parleyhq/parley/services/dispatcher/internal/protocolcontrol"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

// serviceMachines is deadline.Machines over the directory: the compiled
// state machine of a PD, as the dialogues use it.
type serviceMachines struct{ dir *directory.Directory }

func (m serviceMachines) Machine(ctx context.Context, hash string) (*protocolcontrol.Machine, error) {
	pr, err := m.dir.Protocol(ctx, hash, nil)
	switch {
	case err != nil:
		return nil, err
	case pr.MachineErr != nil:
		return nil, pr.MachineErr
	case pr.Machine == nil:
		return nil, fmt.Errorf("protocol %s declares no state machine", hash)
	}
	return pr.Machine, nil
}

// pairObserver is the dialogues' Observer for service transactions: the
// scheduler is woken for the deadlines a delivered message set (their
// timers, and the pair's order record, were written with the pair's state
// in the message's own transaction: Options.Orders is orderWrite), and
// records expiries on orders (expired).
type pairObserver struct {
	deadlines *deadline.Scheduler
	orders    *order.Recorder // nil without an order store
}

func (o pairObserver) PairsMoved(context.Context, []dialogue.PairMove) {
	if o.deadlines != nil {
		o.deadlines.Wake()
	}
}

// orderWrite is the dialogues' Options.Orders: the order record a moved
// pair's message writes in its own transaction.
func orderWrite(m dialogue.PairMove) (*store.OrderWrite, error) {
	return order.Plan(order.Event{
		Dialogue: m.Dialogue, Protocol: m.Protocol, Consumer: m.Initiator, Supplier: m.Counterpart,
		Prev: m.Prev, Next: m.Next, MessageID: m.MessageID, Type: m.Type, Sender: m.Sender, Time: m.Time,
	})
}

// expired records a deadline's expiry on the pair's order.
func (o pairObserver) expired(ctx context.Context, x deadline.Expiry) error {
	if o.orders == nil || !x.Pair.Order {
		return nil // no order: nothing to record (order.Plan would decode both states to say so)
	}
	_, _, err := o.orders.Record(ctx, order.Event{
		Dialogue: x.Timer.Dialogue, Protocol: x.Timer.Protocol, Consumer: x.Timer.Initiator, Supplier: x.Timer.Counterpart,
		Prev: x.Prev, Next: x.Next, MessageID: x.MessageID, Type: x.Timer.Name + "_expired", Time: x.Timer.At,
	})
	return err
}

// RoutineChanged drops what the server caches of a routine or tool that
// another replica changed ("" for any).
func (s *Server) RoutineChanged(name string) { s.routines.Changed(name) }

// WakeDeadlines makes RunDeadlines look for the next timer again: another
// replica set one.
func (s *Server) WakeDeadlines() {
	if s.deadlines != nil {
		s.deadlines.Wake()
	}
}

// RunDeadlines fires protocol deadlines until ctx ends; it returns at once
// when the server has no timer store.
func (s *Server) RunDeadlines(ctx context.Context) {
	if s.deadlines != nil {
		s.deadlines.Run(ctx)
	}
}
