package server

import (
	"context"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/platform/pagetoken"
	"github.com/parleyhq/parley/platform/resource"
	"github.com/parleyhq/parley/services/dispatcher/internal/directory"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

var orderStates = map[store.OrderState]dispatcherv1.OrderState{
	store.OrderActive:    dispatcherv1.OrderState_ORDER_STATE_ACTIVE,
	store.OrderSucceeded: dispatcherv1.OrderState_ORDER_STATE_SUCCEEDED,
	store.OrderFailed:    dispatcherv1.OrderState_ORDER_STATE_FAILED,
}

// beginOrders starts an order call once its request is valid; its context
// carries the dialogue calls' time limit.
func (s *Server) beginOrders(ctx context.Context, v grpcerr.Violations) (context.Context, context.CancelFunc, error) {
	if err := v.Err("INVALID_ARGUMENT", Domain); err != nil {
		return nil, nil, err
	}
	if s.opts.Orders == nil {
		return nil, nil, status.Error(codes.Unavailable, "orders are not available on this server: it has no order store")
	}
	ctx, cancel := context.WithTimeout(ctx, s.opts.MessageTimeout)
	return ctx, cancel, nil
}

// GetOrder implements DispatcherService. The policy admits only the agent
// named (or the operator); an agent that is not a party gets NOT_FOUND,
// as for an order that does not exist.
func (s *Server) GetOrder(ctx context.Context, req *dispatcherv1.GetOrderRequest) (*dispatcherv1.Order, error) {
	var v grpcerr.Violations
	agent, id, ok := strings.Cut(req.GetName(), "/orders/")
	if !ok || !directory.ValidAgentName(agent) || !validMessageID(id) {
		v.Add("name", "must be clients/{client}/agents/{agent}/orders/{order}")
	}
	ctx, cancel, err := s.beginOrders(ctx, v)
	if err != nil {
		return nil, err
	}
	defer cancel()
	o, err := s.opts.Orders.GetOrder(ctx, id)
	if err == nil && o.Consumer != agent && o.Supplier != agent {
		err = resource.NotFound("order", req.GetName())
	}
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	// A deadline that passed has failed the order, fired or not (Order.At).
	return orderProto(agent, o.At(s.opts.Now())), nil
}

// ListOrders implements DispatcherService.
func (s *Server) ListOrders(ctx context.Context, req *dispatcherv1.ListOrdersRequest) (*dispatcherv1.ListOrdersResponse, error) {
	var v grpcerr.Violations
	if !directory.ValidAgentName(req.GetParent()) {
		v.Add("parent", "must be clients/{client}/agents/{agent}")
	}
	var state store.OrderState
	if st := req.GetState(); st != dispatcherv1.OrderState_ORDER_STATE_UNSPECIFIED {
		for k, p := range orderStates {
			if p == st {
				state = k
			}
		}
		if state == "" {
			v.Add("state", "must be one of the OrderState values")
		}
	}
	size, ok := pagetoken.Size(req.GetPageSize(), 50, 1000)
	if !ok {
		v.Add("page_size", "must not be negative")
	}
	// The token is bound to the parent and the state filter.
	scope := req.GetParent() + "\x00" + string(state)
	after, err := pagetoken.Decode(req.GetPageToken(), scope)
	if err != nil {
		v.Add("page_token", "is not a token from a previous call with the same parent and state")
	}
	ctx, cancel, err := s.beginOrders(ctx, v)
	if err != nil {
		return nil, err
	}
	defer cancel()
	now := s.opts.Now()
	list, err := s.opts.Orders.ListOrders(ctx, req.GetParent(), state, now, after, size+1)
	if err != nil {
		return nil, s.toStatus(ctx, err)
	}
	resp := &dispatcherv1.ListOrdersResponse{}
	if len(list) > size {
		list = list[:size]
		resp.NextPageToken = pagetoken.Encode(list[size-1].ID, scope)
	}
	for _, o := range list {
		resp.Orders = append(resp.Orders, orderProto(req.GetParent(), o.At(now)))
	}
	return resp, nil
}

func orderProto(agent string, o store.Order) *dispatcherv1.Order {
	out := &dispatcherv1.Order{
		Name: agent + "/orders/" + o.ID, DialogueId: o.Dialogue, Protocol: o.Protocol,
		Consumer: o.Consumer, Supplier: o.Supplier, State: orderStates[o.State],
		CreateTime: timestamppb.New(o.CreateTime), UpdateTime: timestamppb.New(o.UpdateTime),
	}
	for _, t := range o.Transitions {
		out.Transitions = append(out.Transitions, &dispatcherv1.OrderTransition{
			MessageType: t.Type, MessageId: t.MessageID, Sender: t.Sender, Time: timestamppb.New(t.Time), State: orderStates[t.State],
		})
	}
	if n := len(o.Transitions); n > 0 {
		out.LastMessageType = o.Transitions[n-1].Type
	}
	return out
}
