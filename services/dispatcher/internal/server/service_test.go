package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
	"github.com/parleyhq/parley/services/dispatcher/internal/order"
	"github.com/parleyhq/parley/services/dispatcher/internal/serviceprotocol"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
	"github.com/parleyhq/parley/services/dispatcher/internal/store/boltstore"
)

// serviceRegistry is followRegistry holding the built-in service PDs with
// the state machines the registry parses from them (the fixtures that
// e2e keeps equal to the registry's answer).
type serviceRegistry struct {
	*followRegistry
	machines map[string]*registryv1.StateMachine
}

func (f *serviceRegistry) ResolveProtocol(ctx context.Context, req *registryv1.ResolveProtocolRequest) (*registryv1.Protocol, error) {
	p, err := f.fakeRegistry.ResolveProtocol(ctx, req)
	if err == nil {
		f.mu.Lock()
		p.StateMachine = f.machines[p.GetSha1Hex()]
		f.mu.Unlock()
	}
	return p, err
}

type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

type serviceEnv struct {
	*netEnv
	sreg   *serviceRegistry
	srv    *Server
	st     *boltstore.Store
	clock  *fakeClock
	hashes map[string]string // protocol name → hash
}

// startService runs a dispatcher with the agent network, orders and
// deadlines over bbolt on loopback, on a fake clock; bob and carol follow
// alice, the consumer.
func startService(t *testing.T) *serviceEnv {
	t.Helper()
	return startServiceWith(t, Options{})
}

// startServiceWith is startService with the options of base set.
func startServiceWith(t *testing.T, base Options) *serviceEnv {
	t.Helper()
	return startServiceWrapped(t, base, nil)
}

// startServiceWrapped is startServiceWith whose payment store, when wrap
// is not nil, is wrap of the bbolt store (a fake for failures).
func startServiceWrapped(t *testing.T, base Options, wrap func(*boltstore.Store) store.PaymentStore) *serviceEnv {
	t.Helper()
	reg := &serviceRegistry{
		followRegistry: &followRegistry{fakeRegistry: newFakeRegistry(), follows: map[[2]string]bool{}},
		machines:       map[string]*registryv1.StateMachine{},
	}
	hashes := map[string]string{}
	for _, p := range serviceprotocol.Builtins() {
		raw, err := os.ReadFile("../serviceprotocol/testdata/" + p.Name + ".json")
		if err != nil {
			t.Fatal(err)
		}
		sm := &registryv1.StateMachine{}
		if err := protojson.Unmarshal(raw, sm); err != nil {
			t.Fatal(err)
		}
		hashes[p.Name] = reg.addProtocol(string(p.Content))
		reg.machines[hashes[p.Name]] = sm
	}
	for _, a := range []string{netAlice, netBob, netCarol} {
		reg.addAgent(&registryv1.Agent{Name: a})
	}
	reg.follow(netBob, netAlice)
	reg.follow(netCarol, netAlice)
	regConn := serveGRPC(t, func(s *grpc.Server) { registryv1.RegisterRegistryServiceServer(s, reg) })

	st, err := boltstore.Open(t.TempDir(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	clock := &fakeClock{now: time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)}
	mb := mailbox.New(st, mailbox.Options{Now: clock.Now})
	base.Dialogues, base.Mailboxes, base.Orders, base.Timers, base.Payments, base.Now = st, mb, st, st, st, clock.Now
	if wrap != nil {
		base.Payments = wrap(st)
	}
	srv := New(st, slog.New(slog.DiscardHandler), registryv1.NewRegistryServiceClient(regConn), testOptions(base))
	conn := serveGRPC(t, func(s *grpc.Server) { dispatcherv1.RegisterDispatcherServiceServer(s, srv) })
	return &serviceEnv{
		sreg:   reg,
		netEnv: &netEnv{t: t, reg: reg.followRegistry, client: dispatcherv1.NewDispatcherServiceClient(conn), mail: mb},
		srv:    srv, st: st, clock: clock, hashes: hashes,
	}
}

// addHaggle stores the custom haggle PD (buyer, seller) with its parsed
// state machine and returns its hash.
func (e *serviceEnv) addHaggle() string {
	e.t.Helper()
	content, err := os.ReadFile("../serviceprotocol/testdata/haggle.md")
	if err != nil {
		e.t.Fatal(err)
	}
	raw, err := os.ReadFile("../serviceprotocol/testdata/haggle.json")
	if err != nil {
		e.t.Fatal(err)
	}
	sm := &registryv1.StateMachine{}
	if err := protojson.Unmarshal(raw, sm); err != nil {
		e.t.Fatal(err)
	}
	h := e.sreg.addProtocol(string(content))
	e.sreg.mu.Lock()
	e.sreg.machines[h] = sm
	e.sreg.mu.Unlock()
	return h
}

// request opens a service dialogue from alice with NewRequest: task
// {"what":"ship"} and the timeouts given (name → duration).
func (e *serviceEnv) request(protocol string, timeouts map[string]time.Duration, to ...string) *dispatcherv1.SendMessageResponse {
	e.t.Helper()
	req := &dispatcherv1.NewRequestRequest{
		Sender: netAlice, To: &dispatcherv1.DistributionList{Direct: to}, Protocol: protocol, TaskJson: `{"what":"ship"}`,
	}
	for name, d := range timeouts {
		switch name {
		case "proposal_timeout":
			req.ProposalTimeout = durationpb.New(d)
		case "invite_offer_timeout":
			req.InviteOfferTimeout = durationpb.New(d)
		case "offer_timeout":
			req.OfferTimeout = durationpb.New(d)
		default:
			e.t.Fatalf("no timeout %s", name)
		}
	}
	res, err := e.client.NewRequest(e.t.Context(), req)
	if err != nil {
		e.t.Fatalf("NewRequest(%s) error = %v", protocol, err)
	}
	if res.GetCategory() != dispatcherv1.MessageCategory_MESSAGE_CATEGORY_SERVICE {
		e.t.Fatalf("NewRequest(%s) category = %v, want SERVICE", protocol, res.GetCategory())
	}
	return res
}

func (e *serviceEnv) reply(sender, inReplyTo, typ, body string) (*dispatcherv1.SendMessageResponse, error) {
	return e.client.ReplyMessage(e.t.Context(), &dispatcherv1.ReplyMessageRequest{
		Sender: sender, InReplyTo: inReplyTo, MessageType: typ, BodyJson: body,
	})
}

func (e *serviceEnv) mustReply(sender, inReplyTo, typ, body string) string {
	e.t.Helper()
	res, err := e.reply(sender, inReplyTo, typ, body)
	if err != nil {
		e.t.Fatalf("ReplyMessage(%s from %s) error = %v", typ, sender, err)
	}
	return res.GetMessageId()
}

func last(ms []mailbox.Message) mailbox.Message {
	if len(ms) == 0 {
		return mailbox.Message{}
	}
	return ms[len(ms)-1]
}

// An allocate round through the dispatcher: the deadline reaches the
// supplier as an absolute time, the order forms at accept_offer, every
// later message is on its trail, and confirm_fail leaves it failed.
func TestAllocate_orderTrailThroughTheSendPath(t *testing.T) {
	e := startService(t)
	req := e.request("allocate", map[string]time.Duration{"invite_offer_timeout": 30 * time.Second}, netBob)
	got := last(e.inbox(netBob))
	var body struct {
		InviteOfferTimeout int64 `json:"invite_offer_timeout"`
	}
	if err := json.Unmarshal(got.Body, &body); err != nil || body.InviteOfferTimeout != e.clock.Now().Add(30*time.Second).Unix() {
		t.Errorf("bob's new_task_request body = %s, want invite_offer_timeout as the absolute time %d", got.Body, e.clock.Now().Add(30*time.Second).Unix())
	}
	offer := e.mustReply(netBob, req.GetMessageId(), "offer", `{"offer":{"price":5},"offer_timeout":60}`)
	accept := e.mustReply(netAlice, offer, "accept_offer", `{}`)
	complete := e.mustReply(netBob, accept, "order_complete", `{}`)
	e.mustReply(netAlice, complete, "confirm_fail", `{"reason":"late"}`)

	for _, agent := range []string{netAlice, netBob} {
		list, err := e.client.ListOrders(t.Context(), &dispatcherv1.ListOrdersRequest{Parent: agent})
		if err != nil || len(list.GetOrders()) != 1 {
			t.Fatalf("ListOrders(%s) = %v, %v; want one order", agent, list, err)
		}
		o := list.GetOrders()[0]
		var types []string
		for _, tr := range o.GetTransitions() {
			types = append(types, tr.GetMessageType())
		}
		if o.GetState() != dispatcherv1.OrderState_ORDER_STATE_FAILED || o.GetConsumer() != netAlice || o.GetSupplier() != netBob ||
			o.GetDialogueId() != req.GetDialogueId() || len(types) != 3 || types[0] != "accept_offer" || types[2] != "confirm_fail" ||
			o.GetTransitions()[0].GetMessageId() != accept || o.GetTransitions()[1].GetSender() != netBob {
			t.Errorf("%s's order = %v, want failed with accept_offer, order_complete, confirm_fail", agent, o)
		}
	}
	// Nothing is armed any more: the offer deadline was met.
	e.clock.Advance(time.Hour)
	if n, err := e.srv.deadlines.FireDue(t.Context()); n != 0 || err != nil {
		t.Errorf("FireDue() = %d, %v; want nothing to expire", n, err)
	}
}

// The order record is written in the transaction of the message that
// forms or moves it, so there is nothing to wait for: the sender reads the
// order with its message last on the trail as soon as the send returns,
// and the receiver as soon as its mailbox hands it the message.
func TestOrder_readRightAfterTheSendReturnsAndOnReceipt(t *testing.T) {
	e := startService(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	type read struct {
		agent, typ string
		got        *dispatcherv1.Order
		err        error
	}
	reads := make(chan read, 16)
	var orderID atomic.Value // the order's id, once the dialogue is open
	for _, agent := range []string{netAlice, netBob} {
		go func() {
			_ = e.mail.Receive(ctx, agent, mailbox.ReceiveOptions{Batch: 1, Keepalive: time.Hour}, func(ds []mailbox.Delivery) error {
				for _, d := range ds {
					id, _ := orderID.Load().(string)
					if t := d.Message.Type; t == "new_task_request" || t == "offer" {
						continue // before the order
					}
					got, err := e.client.GetOrder(ctx, &dispatcherv1.GetOrderRequest{Name: agent + "/orders/" + id})
					reads <- read{agent, d.Message.Type, got, err}
				}
				return nil
			})
		}()
	}
	req := e.request("allocate", map[string]time.Duration{"invite_offer_timeout": 30 * time.Second}, netBob)
	orderID.Store(order.ID(req.GetDialogueId(), netBob))
	ids := map[string]string{"new_task_request": req.GetMessageId()}
	ids["offer"] = e.mustReply(netBob, ids["new_task_request"], "offer", `{"offer":{}}`)
	for _, st := range []struct {
		from, to, typ, answers string
		state                  dispatcherv1.OrderState
	}{
		{netAlice, netBob, "accept_offer", "offer", dispatcherv1.OrderState_ORDER_STATE_ACTIVE},
		{netBob, netAlice, "request_message", "accept_offer", dispatcherv1.OrderState_ORDER_STATE_ACTIVE},
		{netBob, netAlice, "order_complete", "accept_offer", dispatcherv1.OrderState_ORDER_STATE_SUCCEEDED},
		{netAlice, netBob, "confirm_success", "order_complete", dispatcherv1.OrderState_ORDER_STATE_SUCCEEDED},
	} {
		ids[st.typ] = e.mustReply(st.from, ids[st.answers], st.typ, `{}`)
		name := st.from + "/orders/" + order.ID(req.GetDialogueId(), netBob)
		got, err := e.client.GetOrder(t.Context(), &dispatcherv1.GetOrderRequest{Name: name})
		if err != nil || got.GetLastMessageType() != st.typ || got.GetState() != st.state {
			t.Errorf("right after %s's send returned, GetOrder(%s) = %v, %v; want %v with %s last", st.typ, name, got, err, st.state, st.typ)
		}
		r := <-reads
		if r.agent != st.to || r.typ != st.typ || r.err != nil || r.got.GetLastMessageType() != st.typ || r.got.GetState() != st.state {
			t.Errorf("on receipt of %s by %s: GetOrder = %v, %v (read by %s on %s); want %v with %s last", st.typ, st.to, r.got, r.err, r.agent, r.typ, st.state, st.typ)
		}
	}
}

// A supplier that never answers: the window expires on the server, both
// agents are told, and the late offer is refused naming the deadline.
func TestAllocate_deadlineExpiresAndRefusesTheLateOffer(t *testing.T) {
	e := startService(t)
	req := e.request("allocate", map[string]time.Duration{"invite_offer_timeout": 30 * time.Second}, netBob, netCarol)
	// carol answers in time; bob does not.
	e.clock.Advance(10 * time.Second)
	e.mustReply(netCarol, req.GetMessageId(), "reject_task", `{}`)
	e.clock.Advance(25 * time.Second)
	if n, err := e.srv.deadlines.FireDue(t.Context()); n != 1 || err != nil {
		t.Fatalf("FireDue() = %d, %v; want bob's window to expire", n, err)
	}
	for _, agent := range []string{netAlice, netBob} {
		m := last(e.inbox(agent))
		if m.Type != "invite_offer_timeout_expired" || m.DialogueID != req.GetDialogueId() || m.Category != mailbox.CategoryService {
			t.Errorf("%s's last message = %+v, want invite_offer_timeout_expired of the dialogue", agent, m)
		}
	}
	if m := last(e.inbox(netCarol)); m.Type == "invite_offer_timeout_expired" {
		t.Error("carol, who answered in time, was told of an expiry")
	}
	_, err := e.reply(netBob, req.GetMessageId(), "offer", `{"offer":{}}`)
	if status.Code(err) != codes.FailedPrecondition || grpcerr.Reason(err) != "PROTOCOL_ERROR" {
		t.Fatalf("late offer: error = %v, want FAILED_PRECONDITION PROTOCOL_ERROR", err)
	}
	var pe struct{ Rule, Error string }
	m := last(e.inbox(netBob))
	_ = json.Unmarshal(m.Body, &pe)
	if m.Type != "protocol_error" || pe.Rule != "DEADLINE_PASSED" || !strings.Contains(pe.Error, "invite_offer_timeout") {
		t.Errorf("bob's protocol_error = %s, want DEADLINE_PASSED naming invite_offer_timeout", m.Body)
	}
	// The window's end ended the pair: closing the dialogue withdraws the
	// task from nobody.
	before := len(e.inbox(netBob))
	if _, err := e.client.CloseDialogue(t.Context(), &dispatcherv1.CloseDialogueRequest{Name: netAlice + "/dialogues/" + req.GetDialogueId()}); err != nil {
		t.Fatal(err)
	}
	if n := len(e.inbox(netBob)); n != before {
		t.Errorf("closing after the expiry sent bob %d messages, want none", n-before)
	}
}

// The consumer accepts while the supplier revokes, concurrently, 1,000
// times (16 dialogues at a time): each dialogue has one total order, so
// exactly one wins each time, the loser gets a protocol_error, and both
// sides see the same outcome: in their orders and in their mailboxes.
func TestTransact_acceptVersusRevokeHasOneWinner(t *testing.T) {
	e := startService(t)
	runs := 1000
	if testing.Short() {
		runs = 100
	}
	ctx := t.Context()
	reply := func(sender, inReplyTo, typ, body string) (string, error) {
		res, err := e.client.ReplyMessage(ctx, &dispatcherv1.ReplyMessageRequest{Sender: sender, InReplyTo: inReplyTo, MessageType: typ, BodyJson: body})
		return res.GetMessageId(), err
	}
	// race prepares one dialogue up to bob's offer, then races alice's
	// accept against bob's revoke and returns the winner's type.
	race := func() (dialogue, winner string, err error) {
		req, err := e.client.NewRequest(ctx, &dispatcherv1.NewRequestRequest{
			Sender: netAlice, To: &dispatcherv1.DistributionList{Direct: []string{netBob}}, Protocol: "transact", TaskJson: `{}`,
		})
		if err != nil {
			return "", "", err
		}
		proposal, err := reply(netBob, req.GetMessageId(), "proposal", `{"proposal":{}}`)
		if err != nil {
			return "", "", err
		}
		invite, err := reply(netAlice, proposal, "invite_offer", `{}`)
		if err != nil {
			return "", "", err
		}
		offer, err := reply(netBob, invite, "offer", `{"offer":{"price":5}}`)
		if err != nil {
			return "", "", err
		}
		var (
			wg                sync.WaitGroup
			acceptErr, revErr error
		)
		wg.Go(func() { _, acceptErr = reply(netAlice, offer, "accept_offer", `{}`) })
		wg.Go(func() { _, revErr = reply(netBob, invite, "revoke_offer", `{}`) })
		wg.Wait()
		switch {
		case acceptErr == nil && revErr == nil:
			return req.GetDialogueId(), "", errors.New("both the accept and the revoke were taken; want exactly one to win")
		case acceptErr != nil && revErr != nil:
			return req.GetDialogueId(), "", fmt.Errorf("both the accept and the revoke were refused (%w); want exactly one to win", errors.Join(acceptErr, revErr))
		}
		loserErr, winner := revErr, "accept_offer"
		if acceptErr != nil {
			loserErr, winner = acceptErr, "revoke_offer"
		}
		if grpcerr.Reason(loserErr) != "PROTOCOL_ERROR" {
			return req.GetDialogueId(), "", fmt.Errorf("the loser's error = %w, want PROTOCOL_ERROR", loserErr)
		}
		// The loser learns from the status, not its text, that the pair
		// moved on to the winner (the SDK's Transact falls back on it).
		wantRule := map[string]string{"accept_offer": "NOT_ALLOWED_AFTER", "revoke_offer": "PAIR_ENDED"}[winner]
		if md := errorMetadata(loserErr); md["refused_0_state"] != winner || md["refused_0_rule"] != wantRule {
			return req.GetDialogueId(), "", fmt.Errorf("the loser's ErrorInfo metadata = %v, want refused_0_state %s and refused_0_rule %s", md, winner, wantRule)
		}
		return req.GetDialogueId(), winner, nil
	}
	winners := make(map[string]string, runs) // dialogue → winning type
	var (
		mu   sync.Mutex
		next atomic.Int64
		wg   sync.WaitGroup
	)
	for range 16 {
		wg.Go(func() {
			for next.Add(1) <= int64(runs) {
				d, w, err := race()
				mu.Lock()
				winners[d] = w
				mu.Unlock()
				if err != nil {
					t.Errorf("dialogue %s: %v", d, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}

	// Both sides agree, in their orders: one exactly when accept won.
	for _, agent := range []string{netAlice, netBob} {
		orders := map[string]int{}
		for token := ""; ; {
			list, err := e.client.ListOrders(ctx, &dispatcherv1.ListOrdersRequest{Parent: agent, PageSize: 1000, PageToken: token})
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range list.GetOrders() {
				orders[o.GetDialogueId()]++
			}
			if token = list.GetNextPageToken(); token == "" {
				break
			}
		}
		for d, w := range winners {
			if want := map[string]int{"accept_offer": 1, "revoke_offer": 0}[w]; orders[d] != want {
				t.Errorf("dialogue %s: %s sees %d orders after %s won, want %d", d, agent, orders[d], w, want)
			}
		}
	}
	// And in their mailboxes: the winner's message reached the other side,
	// the loser's did not, and the loser got a protocol_error.
	got := map[string]map[string]bool{} // "agent dialogue" → types received
	for _, agent := range []string{netAlice, netBob} {
		for after := uint64(0); ; {
			ds, err := e.mail.Read(ctx, agent, after, 1000)
			if err != nil {
				t.Fatal(err)
			}
			if len(ds) == 0 {
				break
			}
			for _, d := range ds {
				k := agent + " " + d.Message.DialogueID
				if got[k] == nil {
					got[k] = map[string]bool{}
				}
				got[k][d.Message.Type] = true
				after = d.Cursor
			}
		}
	}
	counts := map[string]int{}
	for d, w := range winners {
		counts[w]++
		wantAlice := map[string]bool{"revoke_offer": w == "revoke_offer", "protocol_error": w == "revoke_offer"}
		wantBob := map[string]bool{"accept_offer": w == "accept_offer", "protocol_error": w == "accept_offer"}
		for typ, want := range wantAlice {
			if got[netAlice+" "+d][typ] != want {
				t.Errorf("dialogue %s (%s won): alice received %s: %v, want %v", d, w, typ, !want, want)
			}
		}
		for typ, want := range wantBob {
			if got[netBob+" "+d][typ] != want {
				t.Errorf("dialogue %s (%s won): bob received %s: %v, want %v", d, w, typ, !want, want)
			}
		}
	}
	if len(winners) != runs {
		t.Errorf("%d dialogues raced, want %d", len(winners), runs)
	}
	t.Logf("%d runs: %v", runs, counts)
}

// errorMetadata returns the metadata of err's ErrorInfo; nil without one.
func errorMetadata(err error) map[string]string {
	st, _ := status.FromError(err)
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetMetadata()
		}
	}
	return nil
}
