package server

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
	"github.com/parleyhq/parley/services/dispatcher/internal/store/boltstore"
)

// startOrders runs a dispatcher over bbolt on loopback (gRPC and the
// gateway) holding two orders: o1 between alice (consumer) and bob, o2
// between alice and carol, failed.
func startOrders(t *testing.T, withOrders bool) (dispatcherv1.DispatcherServiceClient, string) {
	t.Helper()
	regConn := serveGRPC(t, func(s *grpc.Server) { registryv1.RegisterRegistryServiceServer(s, newFakeRegistry()) })
	st, err := boltstore.Open(t.TempDir(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	t0 := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	for _, r := range []struct {
		o  store.Order
		tr []store.OrderTransition
	}{
		{store.Order{ID: "o1", Dialogue: "d1", Protocol: "p", Consumer: netAlice, Supplier: netBob}, []store.OrderTransition{
			{Type: "accept_offer", MessageID: "m1", Sender: netAlice, Time: t0, State: store.OrderActive},
			{Type: "request_message", MessageID: "m2", Sender: netBob, Time: t0.Add(time.Second), State: store.OrderActive},
		}},
		{store.Order{ID: "o2", Dialogue: "d2", Protocol: "p", Consumer: netAlice, Supplier: netCarol}, []store.OrderTransition{
			{Type: "accept_offer", MessageID: "m3", Sender: netAlice, Time: t0, State: store.OrderActive},
			{Type: "cancel_order", MessageID: "m4", Sender: netCarol, Time: t0.Add(time.Second), State: store.OrderFailed},
		}},
	} {
		for i, tr := range r.tr {
			if _, err := st.RecordOrder(t.Context(), r.o, tr, i == 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	opts := Options{}
	if withOrders {
		opts.Orders = st
	}
	srv := New(st, slog.New(slog.DiscardHandler), registryv1.NewRegistryServiceClient(regConn), testOptions(opts))
	conn := serveGRPC(t, func(s *grpc.Server) { dispatcherv1.RegisterDispatcherServiceServer(s, srv) })
	gw := runtime.NewServeMux()
	if err := dispatcherv1.RegisterDispatcherServiceHandlerServer(t.Context(), gw, srv); err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(gw)
	t.Cleanup(hs.Close)
	return dispatcherv1.NewDispatcherServiceClient(conn), hs.URL
}

func TestGetOrder_readByItsTwoPartiesOnly(t *testing.T) {
	c, _ := startOrders(t, true)
	for _, agent := range []string{netAlice, netBob} {
		o, err := c.GetOrder(t.Context(), &dispatcherv1.GetOrderRequest{Name: agent + "/orders/o1"})
		if err != nil {
			t.Fatalf("GetOrder(%s's view) error = %v", agent, err)
		}
		if o.GetName() != agent+"/orders/o1" || o.GetConsumer() != netAlice || o.GetSupplier() != netBob ||
			o.GetState() != dispatcherv1.OrderState_ORDER_STATE_ACTIVE || o.GetLastMessageType() != "request_message" ||
			len(o.GetTransitions()) != 2 || o.GetTransitions()[1].GetSender() != netBob || o.GetTransitions()[0].GetMessageId() != "m1" {
			t.Errorf("GetOrder(%s's view) = %v, want o1 as recorded", agent, o)
		}
	}
	// carol is no party to o1: it does not exist for her.
	_, err := c.GetOrder(t.Context(), &dispatcherv1.GetOrderRequest{Name: netCarol + "/orders/o1"})
	if status.Code(err) != codes.NotFound || grpcerr.Reason(err) != "ORDER_NOT_FOUND" {
		t.Errorf("GetOrder(carol's view of o1) error = %v, want NOT_FOUND ORDER_NOT_FOUND", err)
	}
	_, err = c.GetOrder(t.Context(), &dispatcherv1.GetOrderRequest{Name: netBob + "/orders/nope"})
	if status.Code(err) != codes.NotFound {
		t.Errorf("GetOrder(missing) error = %v, want NOT_FOUND", err)
	}
}

func TestListOrders_perAgentAndState(t *testing.T) {
	c, _ := startOrders(t, true)
	names := func(r *dispatcherv1.ListOrdersResponse) []string {
		var out []string
		for _, o := range r.GetOrders() {
			out = append(out, o.GetName())
		}
		return out
	}
	tests := []struct {
		name  string
		req   *dispatcherv1.ListOrdersRequest
		want  string
		token bool
	}{
		{"consumer, all", &dispatcherv1.ListOrdersRequest{Parent: netAlice}, "[" + netAlice + "/orders/o1 " + netAlice + "/orders/o2]", false},
		{"consumer, failed", &dispatcherv1.ListOrdersRequest{Parent: netAlice, State: dispatcherv1.OrderState_ORDER_STATE_FAILED}, "[" + netAlice + "/orders/o2]", false},
		{"supplier", &dispatcherv1.ListOrdersRequest{Parent: netBob}, "[" + netBob + "/orders/o1]", false},
		{"supplier, succeeded", &dispatcherv1.ListOrdersRequest{Parent: netBob, State: dispatcherv1.OrderState_ORDER_STATE_SUCCEEDED}, "[]", false},
		{"first page", &dispatcherv1.ListOrdersRequest{Parent: netAlice, PageSize: 1}, "[" + netAlice + "/orders/o1]", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := c.ListOrders(t.Context(), tt.req)
			if err != nil || strings.Join(names(r), " ") != strings.Trim(tt.want, "[]") || (r.GetNextPageToken() != "") != tt.token {
				t.Errorf("ListOrders(%v) = %v (token %q), %v; want %s, token %v", tt.req, names(r), r.GetNextPageToken(), err, tt.want, tt.token)
			}
		})
	}
	first, _ := c.ListOrders(t.Context(), &dispatcherv1.ListOrdersRequest{Parent: netAlice, PageSize: 1})
	next, err := c.ListOrders(t.Context(), &dispatcherv1.ListOrdersRequest{Parent: netAlice, PageSize: 1, PageToken: first.GetNextPageToken()})
	if err != nil || len(next.GetOrders()) != 1 || next.GetOrders()[0].GetName() != netAlice+"/orders/o2" || next.GetNextPageToken() != "" {
		t.Errorf("ListOrders(second page) = %v, %v; want o2 and the end", names(next), err)
	}
	// A token is bound to its parent and state.
	_, err = c.ListOrders(t.Context(), &dispatcherv1.ListOrdersRequest{Parent: netAlice, State: dispatcherv1.OrderState_ORDER_STATE_ACTIVE, PageToken: first.GetNextPageToken()})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("ListOrders(token of another filter) error = %v, want INVALID_ARGUMENT", err)
	}
}

func TestOrders_refuseBadInput(t *testing.T) {
	c, _ := startOrders(t, true)
	for _, tt := range []struct {
		name string
		call func() error
	}{
		{"get, no orders segment", func() error {
			_, err := c.GetOrder(t.Context(), &dispatcherv1.GetOrderRequest{Name: netAlice + "/dialogues/o1"})
			return err
		}},
		{"get, bad agent", func() error {
			_, err := c.GetOrder(t.Context(), &dispatcherv1.GetOrderRequest{Name: "agents/x/orders/o1"})
			return err
		}},
		{"get, id too long", func() error {
			_, err := c.GetOrder(t.Context(), &dispatcherv1.GetOrderRequest{Name: netAlice + "/orders/" + strings.Repeat("x", 65)})
			return err
		}},
		{"list, bad parent", func() error {
			_, err := c.ListOrders(t.Context(), &dispatcherv1.ListOrdersRequest{Parent: "clients/acme"})
			return err
		}},
		{"list, negative page size", func() error {
			_, err := c.ListOrders(t.Context(), &dispatcherv1.ListOrdersRequest{Parent: netAlice, PageSize: -1})
			return err
		}},
		{"list, unknown state", func() error {
			_, err := c.ListOrders(t.Context(), &dispatcherv1.ListOrdersRequest{Parent: netAlice, State: 99})
			return err
		}},
		{"list, foreign token", func() error {
			_, err := c.ListOrders(t.Context(), &dispatcherv1.ListOrdersRequest{Parent: netAlice, PageToken: "nonsense"})
			return err
		}},
	} {
		if err := tt.call(); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: error = %v, want INVALID_ARGUMENT", tt.name, err)
		}
	}
	c, _ = startOrders(t, false)
	if _, err := c.ListOrders(t.Context(), &dispatcherv1.ListOrdersRequest{Parent: netAlice}); status.Code(err) != codes.Unavailable {
		t.Errorf("ListOrders(no order store) error = %v, want UNAVAILABLE", err)
	}
}

func TestGetOrder_overREST(t *testing.T) {
	_, url := startOrders(t, true)
	for path, want := range map[string]int{
		"/v1/" + netBob + "/orders/o1":   http.StatusOK,
		"/v1/" + netCarol + "/orders/o1": http.StatusNotFound,
		"/v1/" + netAlice + "/orders":    http.StatusOK,
	} {
		resp, err := http.Get(url + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %s = %d %s, want %d", path, resp.StatusCode, body, want)
		}
	}
}
