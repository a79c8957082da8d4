package main

// The SDK's service helpers (sdk.ServiceAgent) against a real in-process
// Parley server: the SDK module cannot import the services, so its tests
// against real ones live here, beside the demo that uses them.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/sdk"
)

// serviceNet is a server with a consumer and suppliers that follow it,
// each a running sdk.ServiceAgent.
type serviceNet struct {
	conn   grpc.ClientConnInterface
	agents map[string]*sdk.ServiceAgent // by short name
}

func (n serviceNet) name(id string) string { return "clients/svc/agents/" + id }

// startServiceNet starts a server and the agents "consumer" and
// suppliers; stages registers each supplier's handlers before it runs.
func startServiceNet(t *testing.T, suppliers []string, stages func(id string, sa *sdk.ServiceAgent)) serviceNet {
	t.Helper()
	return startServiceNetWith(t, sdk.NetworkOptions{}, suppliers, stages)
}

// startServiceNetWith is startServiceNet with every agent's options (its
// OnError is the test's log).
func startServiceNetWith(t *testing.T, opts sdk.NetworkOptions, suppliers []string, stages func(id string, sa *sdk.ServiceAgent)) serviceNet {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ep, stop, err := startDemoSuite(ctx, "sdk", func(*suiteConfig) {})
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		if stop != nil {
			if err := stop(); err != nil {
				t.Errorf("stop the server: %v", err)
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	n := serviceNet{conn: ep.Conn, agents: map[string]*sdk.ServiceAgent{}}
	reg := registryv1.NewRegistryServiceClient(ep.Conn)
	waitServiceProtocols(t, reg)
	if _, err := reg.CreateClient(ctx, &registryv1.CreateClientRequest{ClientId: "svc", Client: &registryv1.Client{DisplayName: "svc"}}); err != nil {
		t.Fatal(err)
	}
	for _, id := range append([]string{"consumer"}, suppliers...) {
		if _, err := reg.CreateAgent(ctx, &registryv1.CreateAgentRequest{Parent: "clients/svc", AgentId: id, Agent: &registryv1.Agent{DisplayName: id}}); err != nil {
			t.Fatal(err)
		}
		if id != "consumer" {
			if _, err := reg.FollowAgent(ctx, &registryv1.FollowAgentRequest{Name: n.name(id), Agent: n.name("consumer")}); err != nil {
				t.Fatal(err)
			}
		}
		opts.OnError = func(err error) { t.Logf("%s: %v", id, err) }
		na, err := sdk.NewNetworkAgent(ep.Conn, n.name(id), opts)
		if err != nil {
			t.Fatal(err)
		}
		sa, err := sdk.NewServiceAgent(ep.Conn, na, nil)
		if err != nil {
			t.Fatal(err)
		}
		if id != "consumer" {
			stages(id, sa)
		}
		n.agents[id] = sa
		wg.Go(func() { _ = na.Run(ctx) })
	}
	return n
}

// waitServiceProtocols waits until the registry holds the built-in
// service PDs, which the dispatcher stores in the background at start:
// a request sent before that is refused (protocol not known), as a
// loaded machine showed.
func waitServiceProtocols(t *testing.T, reg registryv1.RegistryServiceClient) {
	t.Helper()
	want := []string{"Parley allocate", "Parley delegate", "Parley transact"}
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := reg.ListProtocols(t.Context(), &registryv1.ListProtocolsRequest{PageSize: 1000})
		var titles []string
		for _, p := range resp.GetProtocols() {
			titles = append(titles, p.GetTitle())
		}
		missing := slices.DeleteFunc(slices.Clone(want), func(w string) bool { return slices.Contains(titles, w) })
		if err == nil && len(missing) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("ListProtocols = %v, %v; still missing %v", titles, err, missing)
		}
		time.Sleep(20 * time.Millisecond) // between polls
	}
}

// order reads o as the consumer and checks that the message typed last is
// last on its trail: the network records a move on the order in the
// transaction that delivers its message, so there is nothing to wait for.
func (n serviceNet) order(t *testing.T, o sdk.Order, last string) *dispatcherv1.Order {
	t.Helper()
	client := dispatcherv1.NewDispatcherServiceClient(n.conn)
	got, err := client.GetOrder(t.Context(), &dispatcherv1.GetOrderRequest{Name: n.name("consumer") + "/orders/" + o.ID})
	if err != nil || got.GetLastMessageType() != last {
		t.Fatalf("GetOrder(%s) = %v, %v; want one whose last message is %s", o.ID, got, err, last)
	}
	return got
}

// A revocation the network records before the consumer's acceptance wins
// the race: the acceptance is refused with the pair's state in the
// status's ErrorInfo (refused_0_state revoke_offer, not the sentence), and
// Transact falls back to the next proposal, reporting the revocation.
func TestServiceAgent_transactLosesTheRaceToARevocation(t *testing.T) {
	prices := map[string]int64{"fickle": 1_000_000, "steady": 2_000_000}
	revoke, revoked := make(chan struct{}), make(chan error, 1)
	n := startServiceNet(t, []string{"fickle", "steady"}, func(id string, sa *sdk.ServiceAgent) {
		sa.Supply("new_task_request", func(ctx context.Context, m sdk.Message, r sdk.Responder) error {
			_, err := r.Reply(ctx, "proposal", map[string]any{"proposal": map[string]string{"by": id}, "price": usdPrice(prices[id])})
			return err
		})
		sa.Supply("invite_offer", func(ctx context.Context, m sdk.Message, r sdk.Responder) error {
			if _, err := r.Reply(ctx, "offer", map[string]any{"offer": map[string]string{"by": id}, "price": usdPrice(prices[id])}); err != nil || id != "fickle" {
				return err
			}
			// fickle revokes while the consumer is about to accept.
			select {
			case <-revoke:
			case <-ctx.Done():
				return ctx.Err()
			}
			_, err := r.Reply(ctx, "revoke_offer", struct{}{})
			revoked <- err
			return err
		})
	})
	ctx := t.Context()
	c := n.agents["consumer"]
	deal, err := c.Transact(ctx, sdk.Request{To: suppliersOf(n, "steady", "fickle"), Task: map[string]string{"what": "print"}, Window: 5 * time.Second}, byLowPrice, sdk.TransactOptions{
		InviteWindow: 5 * time.Second,
		Accept: func(ctx context.Context, d *sdk.Deal, offer sdk.Bid) (any, error) {
			if offer.Supplier == n.name("fickle") {
				// The revocation is recorded before the acceptance is sent,
				// and after Transact last looked for one.
				close(revoke)
				if err := <-revoked; err != nil {
					return nil, fmt.Errorf("fickle's revoke_offer: %w", err)
				}
			}
			return struct{}{}, nil
		},
	})
	if err != nil {
		t.Fatalf("Transact() error = %v (deal %+v)", err, deal)
	}
	if len(deal.Fallbacks) != 1 || deal.Fallbacks[0].Supplier != n.name("fickle") || deal.Fallbacks[0].Reason != "revoked" {
		t.Errorf("fallbacks = %+v, want fickle's revocation", deal.Fallbacks)
	}
	if deal.Order.Supplier != n.name("steady") {
		t.Errorf("order = %+v, want steady's", deal.Order)
	}
	// The refusal the SDK saw, as a caller of Accept on fickle's ended
	// pair sees it.
	_, err = deal.Accept(ctx, deal.Proposals[0], struct{}{})
	var ref *sdk.Refusal
	if !errors.As(err, &ref) || ref.Rule != "PAIR_ENDED" || ref.State != "revoke_offer" {
		t.Errorf("Accept(fickle's pair) error = %v (%+v), want a *sdk.Refusal, rule PAIR_ENDED, state revoke_offer", err, ref)
	}
}

func usdPrice(micros int64) sdk.Price { return sdk.Price{AmountMicros: micros, Currency: "USD"} }

func byLowPrice(b sdk.Bid) float64 {
	if b.Price == nil {
		return -1e18
	}
	return -float64(b.Price.AmountMicros)
}

func suppliersOf(n serviceNet, ids ...string) []string {
	var out []string
	for _, id := range ids {
		out = append(out, n.name(id))
	}
	return out
}

// Allocate returns the offers in by score, best first, without the
// supplier that declined; the accepted one forms an order, the order
// ends with order_complete, and a confirm_fail makes it a failure, not a
// success (the original reports it as one).
func TestServiceAgent_allocateRanksOffersAndConfirmFailIsAFailure(t *testing.T) {
	prices := map[string]int64{"dear": 5_000_000, "cheap": 3_000_000}
	rejected := make(chan string, 3)
	n := startServiceNet(t, []string{"dear", "cheap", "busy"}, func(id string, sa *sdk.ServiceAgent) {
		sa.Supply("new_task_request", func(ctx context.Context, m sdk.Message, r sdk.Responder) error {
			if id == "busy" {
				_, err := r.Reply(ctx, "reject_task", map[string]string{"reason": "busy"})
				return err
			}
			_, err := r.Reply(ctx, "offer", map[string]any{"offer": map[string]string{"by": id}, "offer_timeout": 30, "price": usdPrice(prices[id])})
			return err
		})
		sa.Supply("accept_offer", func(ctx context.Context, m sdk.Message, r sdk.Responder) error {
			_, err := r.Reply(ctx, "order_complete", map[string]string{"done": "yes"})
			return err
		})
		sa.Supply("reject_offer", func(_ context.Context, m sdk.Message, _ sdk.Responder) error {
			rejected <- id
			return nil
		})
	})
	ctx := t.Context()
	c := n.agents["consumer"]
	round, err := c.Allocate(ctx, sdk.Request{To: suppliersOf(n, "dear", "cheap", "busy"), Task: map[string]string{"what": "ship"}, Window: 5 * time.Second}, byLowPrice)
	if err != nil {
		t.Fatalf("Allocate() error = %v", err)
	}
	var got []string
	for _, o := range round.Offers {
		got = append(got, o.Supplier)
	}
	if want := suppliersOf(n, "cheap", "dear"); !slices.Equal(got, want) {
		t.Fatalf("Allocate() offers = %q, want %q (best first)", got, want)
	}
	order, err := round.Accept(ctx, round.Offers[0], nil)
	if err != nil {
		t.Fatalf("Accept(cheap) error = %v", err)
	}
	if order.ID != sdk.OrderID(round.Dialogue, n.name("cheap")) {
		t.Errorf("order id = %s, want OrderID(dialogue, cheap)", order.ID)
	}
	if err := round.Reject(ctx, round.Offers[1]); err != nil {
		t.Fatalf("Reject(dear) error = %v", err)
	}
	if who := <-rejected; who != "dear" {
		t.Errorf("reject_offer reached %s, want dear", who)
	}
	// The accepted offer cannot be accepted again: the network refuses it,
	// naming the rule, and the SDK says so with ErrRefused.
	_, err = round.Accept(ctx, round.Offers[0], nil)
	var ref *sdk.Refusal
	if !errors.Is(err, sdk.ErrRefused) || !errors.As(err, &ref) || ref.Reason != "PROTOCOL_ERROR" || ref.Rule == "" || status.Code(err) != codes.FailedPrecondition {
		t.Errorf("Accept(again) error = %v, want a *sdk.Refusal (PROTOCOL_ERROR, a rule, FAILED_PRECONDITION)", err)
	}
	done, err := round.Await(ctx, n.name("cheap"), "order_complete", "order_failed")
	if err != nil || done.Type != "order_complete" {
		t.Fatalf("Await(order_complete) = %s, %v", done.Type, err)
	}
	if err := round.Confirm(ctx, done, false); err != nil {
		t.Fatalf("Confirm(fail) error = %v", err)
	}
	if o := n.order(t, order, "confirm_fail"); o.GetState() != dispatcherv1.OrderState_ORDER_STATE_FAILED {
		t.Errorf("order after confirm_fail: state %v, last %s; want FAILED after confirm_fail", o.GetState(), o.GetLastMessageType())
	}
	if err := round.Close(ctx); err != nil {
		t.Errorf("Close() error = %v", err)
	}
}

// Delegate returns the order of the supplier that accepts the task; with
// every supplier declining, ErrNoSupplier.
func TestServiceAgent_delegate(t *testing.T) {
	n := startServiceNet(t, []string{"yes", "no"}, func(id string, sa *sdk.ServiceAgent) {
		sa.Supply("new_task_request", func(ctx context.Context, m sdk.Message, r sdk.Responder) error {
			typ := "reject_offer"
			if id == "yes" {
				typ = "accept_offer"
			}
			_, err := r.Reply(ctx, typ, struct{}{})
			return err
		})
	})
	ctx := t.Context()
	c := n.agents["consumer"]
	round, order, err := c.Delegate(ctx, sdk.Request{To: suppliersOf(n, "no", "yes"), Task: map[string]string{"what": "mow"}, Window: 5 * time.Second})
	if err != nil {
		t.Fatalf("Delegate() error = %v", err)
	}
	if order.Supplier != n.name("yes") || order.ID != sdk.OrderID(round.Dialogue, n.name("yes")) {
		t.Errorf("Delegate() order = %+v, want yes's", order)
	}
	if o := n.order(t, order, "accept_offer"); o.GetState() != dispatcherv1.OrderState_ORDER_STATE_ACTIVE {
		t.Errorf("order state = %v, want ACTIVE", o.GetState())
	}
	if err := round.Close(ctx); err != nil {
		t.Errorf("Close() error = %v", err)
	}
	_, _, err = c.Delegate(ctx, sdk.Request{To: suppliersOf(n, "no"), Task: map[string]string{"what": "mow"}, Window: 5 * time.Second})
	if !errors.Is(err, sdk.ErrNoSupplier) {
		t.Errorf("Delegate(only no) error = %v, want ErrNoSupplier", err)
	}
}

// Transact invites the best proposal first and falls back to the next
// after a payment_error; the paid order's payment is reserved for it and
// captured by its supplier.
func TestServiceAgent_transactFallsBackAfterAPaymentError(t *testing.T) {
	prices := map[string]int64{"flaky": 1_000_000, "solid": 2_000_000}
	n := startServiceNet(t, []string{"flaky", "solid"}, func(id string, sa *sdk.ServiceAgent) {
		sa.Supply("new_task_request", func(ctx context.Context, m sdk.Message, r sdk.Responder) error {
			_, err := r.Reply(ctx, "proposal", map[string]any{"proposal": map[string]string{"by": id}, "price": usdPrice(prices[id])})
			return err
		})
		sa.Supply("invite_offer", func(ctx context.Context, m sdk.Message, r sdk.Responder) error {
			_, err := r.Reply(ctx, "offer", map[string]any{"offer": map[string]string{"by": id}, "offer_timeout": 30, "price": usdPrice(prices[id]), "payment_required": true})
			return err
		})
		sa.Supply("accept_offer", func(ctx context.Context, m sdk.Message, r sdk.Responder) error {
			var body struct {
				Payment sdk.PaymentReference `json:"payment"`
			}
			if err := json.Unmarshal(m.Body, &body); err != nil {
				return err
			}
			if id == "flaky" {
				_, err := r.Reply(ctx, "payment_error", map[string]any{"error": "card declined", "offer_timeout": 30})
				return err
			}
			if err := sa.CapturePayment(ctx, body.Payment); err != nil {
				return fmt.Errorf("capture: %w", err)
			}
			_, err := r.Reply(ctx, "payment_confirmed", map[string]any{"payment": body.Payment})
			return err
		})
	})
	ctx := t.Context()
	c := n.agents["consumer"]
	var refs []sdk.PaymentReference
	var heard []sdk.Fallback
	deal, err := c.Transact(ctx, sdk.Request{To: suppliersOf(n, "solid", "flaky"), Task: map[string]string{"what": "print"}, Window: 5 * time.Second}, byLowPrice, sdk.TransactOptions{
		InviteWindow: 5 * time.Second,
		Accept: func(ctx context.Context, d *sdk.Deal, offer sdk.Bid) (any, error) {
			ref, err := c.CreatePayment(ctx, offer.Supplier, *offer.Price)
			refs = append(refs, ref)
			return map[string]any{"payment": ref}, err
		},
		OnFallback: func(f sdk.Fallback) { heard = append(heard, f) },
	})
	if err != nil {
		t.Fatalf("Transact() error = %v (deal %+v)", err, deal)
	}
	if len(deal.Proposals) != 2 || deal.Proposals[0].Supplier != n.name("flaky") {
		t.Errorf("proposals = %+v, want flaky's first (cheaper)", deal.Proposals)
	}
	if len(deal.Fallbacks) != 1 || deal.Fallbacks[0].Supplier != n.name("flaky") || deal.Fallbacks[0].Reason != "payment error" || !slices.Equal(heard, deal.Fallbacks) {
		t.Errorf("fallbacks = %+v (heard %+v), want flaky's payment error", deal.Fallbacks, heard)
	}
	if deal.Order.Supplier != n.name("solid") {
		t.Fatalf("order = %+v, want solid's", deal.Order)
	}
	if o := n.order(t, deal.Order, "payment_confirmed"); o.GetState() != dispatcherv1.OrderState_ORDER_STATE_ACTIVE {
		t.Errorf("order state = %v, want ACTIVE", o.GetState())
	}
	p, err := dispatcherv1.NewDispatcherServiceClient(n.conn).GetPayment(ctx, &dispatcherv1.GetPaymentRequest{Name: n.name("consumer") + "/payments/" + refs[len(refs)-1].Reference})
	if err != nil || p.GetState() != dispatcherv1.PaymentState_PAYMENT_STATE_CAPTURED || p.GetOrder() != deal.Order.ID {
		t.Errorf("GetPayment(solid's) = %v, %v; want CAPTURED for the order", p, err)
	}
}

// lossyConn loses the response of the first CreatePayment call after the
// server answered it, as a dropped connection does: the caller sees
// UNAVAILABLE, and the payment exists.
type lossyConn struct {
	grpc.ClientConnInterface
	mu       sync.Mutex // guards requests, first
	requests []*dispatcherv1.CreatePaymentRequest
	first    *dispatcherv1.Payment // what the server answered the lost call
}

func (c *lossyConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	err := c.ClientConnInterface.Invoke(ctx, method, args, reply, opts...)
	if method != dispatcherv1.DispatcherService_CreatePayment_FullMethodName {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.requests = append(c.requests, args.(*dispatcherv1.CreatePaymentRequest))
	if err == nil && c.first == nil {
		c.first = reply.(*dispatcherv1.Payment)
		return status.Error(codes.Unavailable, "connection lost after the server answered")
	}
	return err
}

// CreatePayment sends a request_id of its own per call and repeats it on
// a retry, so that a retry after a lost response returns the payment the
// first attempt created instead of a second one; the next call gets a
// new id and a new payment.
func TestServiceAgent_createPaymentRetriesWithItsRequestID(t *testing.T) {
	n := startServiceNet(t, []string{"shop"}, func(string, *sdk.ServiceAgent) {})
	lossy := &lossyConn{ClientConnInterface: n.conn}
	na, err := sdk.NewNetworkAgent(n.conn, n.name("consumer"), sdk.NetworkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sa, err := sdk.NewServiceAgent(lossy, na, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	ref, err := sa.CreatePayment(ctx, n.name("shop"), usdPrice(5))
	if err != nil {
		t.Fatalf("CreatePayment (first response lost) = %v, want it retried", err)
	}
	lossy.mu.Lock()
	reqs, first := slices.Clone(lossy.requests), lossy.first
	lossy.mu.Unlock()
	if len(reqs) != 2 || reqs[0].GetRequestId() == "" || reqs[1].GetRequestId() != reqs[0].GetRequestId() {
		t.Fatalf("CreatePayment sent %d requests with request_ids %q; want 2 with one id", len(reqs), requestIDs(reqs))
	}
	if want := n.name("consumer") + "/payments/" + ref.Reference; first == nil || first.GetName() != want {
		t.Errorf("CreatePayment returned %s, want the payment the lost call created (%v)", want, first)
	}
	again, err := sa.CreatePayment(ctx, n.name("shop"), usdPrice(5))
	if err != nil || again == ref {
		t.Errorf("CreatePayment (second call) = %+v, %v; want a new payment", again, err)
	}
	lossy.mu.Lock()
	defer lossy.mu.Unlock()
	if ids := requestIDs(lossy.requests); len(ids) != 3 || ids[2] == ids[0] {
		t.Errorf("request_ids sent = %q; want a new one for the second call", ids)
	}
}

func requestIDs(reqs []*dispatcherv1.CreatePaymentRequest) []string {
	var ids []string
	for _, r := range reqs {
		ids = append(ids, r.GetRequestId())
	}
	return ids
}

// A supplier forgets each dialogue once its pair has ended (by a message
// it receives, a reply of its own, an expiry or the consumer's close), so
// that a long-running supplier's memory does not grow with every task it
// ever served; with Concurrency too.
func TestServiceAgent_supplierForgetsEndedDialogues(t *testing.T) {
	for _, concurrency := range []int{1, 4} {
		t.Run(fmt.Sprintf("concurrency %d", concurrency), func(t *testing.T) {
			var (
				mu    sync.Mutex
				plans = map[string]string{} // by dialogue
			)
			planOf := func(d string) string {
				mu.Lock()
				defer mu.Unlock()
				return plans[d]
			}
			offer := map[string]any{"offer": map[string]string{"by": "s"}, "offer_timeout": 30}
			n := startServiceNetWith(t, sdk.NetworkOptions{Concurrency: concurrency}, []string{"s"}, func(_ string, sa *sdk.ServiceAgent) {
				sa.Supply("new_task_request", func(ctx context.Context, m sdk.Message, r sdk.Responder) error {
					var body struct {
						Task struct {
							Plan string `json:"plan"`
						} `json:"task"`
					}
					if err := json.Unmarshal(m.Body, &body); err != nil {
						return err
					}
					mu.Lock()
					plans[m.DialogueID] = body.Task.Plan
					mu.Unlock()
					var err error
					switch body.Task.Plan {
					case "silent":
					case "reject_task":
						_, err = r.Reply(ctx, "reject_task", struct{}{})
					case "delegate":
						if _, err = r.Reply(ctx, "accept_offer", struct{}{}); err == nil {
							_, err = r.Reply(ctx, "order_complete", struct{}{})
						}
					case "reject_invite_offer", "order_failed":
						_, err = r.Reply(ctx, "proposal", map[string]any{"proposal": map[string]string{"by": "s"}})
					default:
						_, err = r.Reply(ctx, "offer", offer)
					}
					return err
				})
				sa.Supply("invite_offer", func(ctx context.Context, m sdk.Message, r sdk.Responder) error {
					typ, body := "offer", any(offer)
					if planOf(m.DialogueID) == "reject_invite_offer" {
						typ, body = "reject_invite_offer", struct{}{}
					}
					_, err := r.Reply(ctx, typ, body)
					return err
				})
				sa.Supply("accept_offer", func(ctx context.Context, m sdk.Message, r sdk.Responder) error {
					typ := "order_complete"
					if planOf(m.DialogueID) == "order_failed" {
						typ = "order_failed"
					}
					_, err := r.Reply(ctx, typ, struct{}{})
					return err
				})
			})
			ctx := t.Context()
			c, supplier := n.agents["consumer"], n.agents["s"]
			req := func(plan string, window time.Duration) sdk.Request {
				return sdk.Request{To: suppliersOf(n, "s"), Task: map[string]string{"plan": plan}, Window: window}
			}
			allocate := func(plan string, window time.Duration) *sdk.Round {
				t.Helper()
				round, err := c.Allocate(ctx, req(plan, window), byLowPrice)
				if err != nil {
					t.Fatalf("Allocate(%s) error = %v", plan, err)
				}
				return round
			}
			for range 2 {
				// allocate: confirm_success, reject_offer and task_withdrawn
				// received, reject_task sent, an expiry received.
				round := allocate("confirm", 30*time.Second)
				order, err := round.Accept(ctx, round.Offers[0], nil)
				if err != nil {
					t.Fatalf("Accept error = %v", err)
				}
				done, err := round.Await(ctx, order.Supplier, "order_complete")
				if err != nil {
					t.Fatalf("Await(order_complete) error = %v", err)
				}
				if err := round.Confirm(ctx, done, true); err != nil {
					t.Fatalf("Confirm error = %v", err)
				}
				round = allocate("reject", 30*time.Second)
				if err := round.Reject(ctx, round.Offers[0]); err != nil {
					t.Fatalf("Reject error = %v", err)
				}
				round = allocate("withdraw", 30*time.Second)
				if err := round.Close(ctx); err != nil {
					t.Fatalf("Close error = %v", err)
				}
				if round := allocate("reject_task", 30*time.Second); len(round.Offers) != 0 {
					t.Fatalf("Allocate(reject_task) offers = %v, want none", round.Offers)
				}
				if round := allocate("silent", time.Second); len(round.Offers) != 0 {
					t.Fatalf("Allocate(silent) offers = %v, want none (the window lapses)", round.Offers)
				}
				// delegate: order_complete sent after the supplier's own
				// accept_offer.
				if _, _, err := c.Delegate(ctx, req("delegate", 30*time.Second)); err != nil {
					t.Fatalf("Delegate error = %v", err)
				}
				// transact: reject_invite_offer and order_failed sent.
				if _, err := c.Transact(ctx, req("reject_invite_offer", 30*time.Second), byLowPrice, sdk.TransactOptions{}); !errors.Is(err, sdk.ErrNoSupplier) {
					t.Fatalf("Transact(reject_invite_offer) error = %v, want ErrNoSupplier", err)
				}
				if _, err := c.Transact(ctx, req("order_failed", 30*time.Second), byLowPrice, sdk.TransactOptions{}); err != nil {
					t.Fatalf("Transact(order_failed) error = %v", err)
				}
			}
			deadline := time.Now().Add(30 * time.Second) // bounds a broken run only
			for {
				got := supplier.SupplierDialogues()
				if got == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("SupplierDialogues() = %d after every pair ended, want 0", got)
				}
				time.Sleep(10 * time.Millisecond) // between polls
			}
		})
	}
}
