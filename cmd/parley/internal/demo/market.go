package demo

// The market story (parley demo market): one consumer, a buyer, and five
// suppliers trade through the network's service protocols on one Parley
// server. Every message is a real network message through the
// dispatcher, which enforces each protocol's state machine and deadlines,
// forms the orders and checks the payment and the owner's signed approval.
//
// The suppliers: steady answers everything at once; slow answers after
// each deadline has passed (the server refuses it, naming the deadline);
// fickle revokes its binding offer; picky declines; premium asks for
// payment and the owner's approval, captures the payment and delivers.
//
// Phase 1, allocate: the buyer collects offers until the window closes,
// ranks them by price, accepts the best, rejects the rest and confirms the
// delivery. Phase 2, transact: it collects proposals, ranks them, and
// invites them in turn, falling back after a rejection, a revocation and a
// lapse, until premium's paid and approved offer becomes an order.

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/sdk"
)

// MarketClient is the client owning the market's agents.
const MarketClient = "market"

// MarketAgents are the market's agent ids (before the suffix): the buyer
// first, then the suppliers.
var MarketAgents = []string{"buyer", "steady", "slow", "fickle", "picky", "premium"}

// MarketOptions configure a market run.
type MarketOptions struct {
	// Conn reaches the server's gRPC services with the operator's
	// credentials (the demo creates its agents and acts as each).
	Conn grpc.ClientConnInterface
	// Key is sent as each agent's key; the conn's own credentials when "".
	Key string
	// Suffix is appended to the agent ids, so that runs on one server do
	// not meet.
	Suffix string
	// Window is each deadline the buyer sets, whole seconds; 2 s when 0.
	Window time.Duration
	// Log receives the narration; nil discards it.
	Log io.Writer
	// Transport says where it ran, for the summary.
	Transport string
}

// MarketOrder is an order the buyer formed.
type MarketOrder struct {
	Protocol    string     `json:"protocol"`
	Dialogue    string     `json:"dialogue"`
	Order       string     `json:"order"`
	Supplier    string     `json:"supplier"`
	Price       *sdk.Price `json:"price,omitempty"`
	Paid        bool       `json:"paid"`
	Approved    bool       `json:"approved"`
	State       string     `json:"state"`       // as GetOrder reports it at the end
	LastMessage string     `json:"lastMessage"` // the last type on its trail
	Trail       []string   `json:"trail"`
}

// MarketEvent is an expiry, a revocation or a refused late message.
type MarketEvent struct {
	Protocol string `json:"protocol"`
	Dialogue string `json:"dialogue"`
	Supplier string `json:"supplier"`
	What     string `json:"what"`             // the deadline, or the message type
	Rule     string `json:"rule,omitempty"`   // a refusal's rule
	Detail   string `json:"detail,omitempty"` // a refusal's sentence, naming the deadline
}

// MarketPayment is a ledger payment as it stands at the end.
type MarketPayment struct {
	Reference    string `json:"reference"`
	Payer        string `json:"payer"`
	Payee        string `json:"payee"`
	AmountMicros int64  `json:"amountMicros"`
	Currency     string `json:"currency"`
	State        string `json:"state"`
	Order        string `json:"order,omitempty"`
}

// MarketDialogue is a dialogue's final state: each supplier's last
// message type in it (its pair's state).
type MarketDialogue struct {
	Protocol  string            `json:"protocol"`
	Dialogue  string            `json:"dialogue"`
	Suppliers map[string]string `json:"suppliers"`
}

// MarketSummary is what `parley demo market --json` prints.
type MarketSummary struct {
	Transport   string           `json:"transport"`
	Orders      []MarketOrder    `json:"orders"`
	Expiries    []MarketEvent    `json:"expiries"`
	Revocations []MarketEvent    `json:"revocations"`
	Refusals    []MarketEvent    `json:"refusals"`
	Payments    []MarketPayment  `json:"payments"`
	Fallbacks   []sdk.Fallback   `json:"fallbacks"`
	Dialogues   []MarketDialogue `json:"dialogues"`
}

// market is one run.
type market struct {
	opts  MarketOptions
	reg   registryv1.RegistryServiceClient
	disp  dispatcherv1.DispatcherServiceClient
	names map[string]string // id → agent name
	owner ed25519.PrivateKey

	// lateTried is closed, per protocol, once slow has sent its late
	// answer and the network refused it: the buyer closes that dialogue
	// only then, so that the refusal names the deadline, not the close.
	lateTried map[string]chan struct{}
	// lateWait bounds waitLate: slow tries its late answer when its
	// deadline expires, one window after the request, long before the
	// buyer waits for it.
	lateWait time.Duration
	// revoked is closed once fickle's revoke_offer is recorded: the buyer
	// reads fickle's offer until then, so that the revocation wins the
	// race every run (the network orders the two either way; the demo
	// scripts which one comes first).
	revoked chan struct{}

	mu       sync.Mutex // guards the fields below, written by the agents' loops
	changed  *sync.Cond // on mu: a pair's last type changed
	sum      MarketSummary
	kinds    map[string]string            // dialogue → protocol
	last     map[string]map[string]string // dialogue → supplier → last type
	payments []string                     // references
	lateErr  map[string]error             // protocol → how slow's late attempt failed
	// agentErrs are the first errors the agents' loops reported (handler
	// errors and panics, messages no route took, reconnects): the SDK only
	// hands them to OnError, and a missing late attempt names them.
	agentErrs    []string
	agentErrsCut int // how many more were left out
}

// maxAgentErrors bounds market.agentErrs.
const maxAgentErrors = 10

// agentError records an error agent id's loop reported.
func (mk *market) agentError(id string, err error) {
	mk.mu.Lock()
	defer mk.mu.Unlock()
	if len(mk.agentErrs) == maxAgentErrors {
		mk.agentErrsCut++
		return
	}
	mk.agentErrs = append(mk.agentErrs, id+": "+err.Error())
}

// reported returns what the agents' loops reported, for an error; mu is
// held.
func (mk *market) reported() string {
	if len(mk.agentErrs) == 0 {
		return "; the agents' loops reported no error"
	}
	out := "; the agents' loops reported: " + strings.Join(mk.agentErrs, "; ")
	if mk.agentErrsCut > 0 {
		out += fmt.Sprintf(" (and %d more)", mk.agentErrsCut)
	}
	return out
}

func (mk *market) logf(format string, args ...any) {
	if mk.opts.Log != nil {
		mk.mu.Lock()
		defer mk.mu.Unlock()
		fmt.Fprintf(mk.opts.Log, format+"\n", args...)
	}
}

// short is an agent's name without client, prefix and suffix.
func (mk *market) short(name string) string {
	for id, n := range mk.names {
		if n == name {
			return id
		}
	}
	return name
}

// saw records m's type as the last of its pair.
func (mk *market) saw(dialogue, supplier, typ string) {
	mk.mu.Lock()
	defer mk.mu.Unlock()
	if mk.last[dialogue] == nil {
		mk.last[dialogue] = map[string]string{}
	}
	mk.last[dialogue][mk.short(supplier)] = typ
	mk.changed.Broadcast()
}

// ends are the types that end a pair (its supplier's last word, or the
// last it hears).
var ends = map[string]bool{
	"confirm_success": true, "confirm_fail": true, "order_failed": true, "cancel_order": true,
	"reject_task": true, "reject_offer": true, "reject_invite_offer": true, "revoke_offer": true, "task_withdrawn": true,
	"proposal_timeout_expired": true, "invite_offer_timeout_expired": true, "offer_timeout_expired": true,
}

// settled reports whether every pair has ended; mu is held.
func (mk *market) settled() bool {
	for _, sup := range mk.last {
		for _, typ := range sup {
			if !ends[typ] {
				return false
			}
		}
	}
	return true
}

func (mk *market) event(list *[]MarketEvent, e MarketEvent) {
	mk.mu.Lock()
	defer mk.mu.Unlock()
	e.Protocol = mk.kinds[e.Dialogue]
	*list = append(*list, e)
}

// Market runs the story on one server and returns its summary.
func Market(ctx context.Context, opts MarketOptions) (MarketSummary, error) {
	if opts.Window <= 0 {
		opts.Window = 2 * time.Second
	}
	mk := &market{
		opts: opts, reg: registryv1.NewRegistryServiceClient(opts.Conn), disp: dispatcherv1.NewDispatcherServiceClient(opts.Conn),
		names: map[string]string{}, kinds: map[string]string{}, last: map[string]map[string]string{},
		lateTried: map[string]chan struct{}{sdk.Allocate: make(chan struct{}), sdk.Transact: make(chan struct{})},
		lateWait:  opts.Window + lateMargin,
		lateErr:   map[string]error{},
		revoked:   make(chan struct{}),
	}
	mk.changed = sync.NewCond(&mk.mu)
	mk.sum.Transport = opts.Transport
	for _, id := range MarketAgents {
		mk.names[id] = "clients/" + MarketClient + "/agents/" + id + opts.Suffix
	}
	if err := mk.setUp(ctx); err != nil {
		return mk.sum, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	agents := map[string]*sdk.ServiceAgent{}
	var wg sync.WaitGroup
	runErrs := make(chan error, len(MarketAgents))
	for _, id := range MarketAgents {
		// No ClearBacklog: the agents are new (a fresh server, or a fresh
		// suffix), and the buyer may send before a supplier's first
		// connect, whose clearing would drop the request.
		na, err := sdk.NewNetworkAgent(opts.Conn, mk.names[id], sdk.NetworkOptions{Key: opts.Key, OnError: func(err error) { mk.agentError(id, err) }})
		if err != nil {
			return mk.sum, err
		}
		sa, err := sdk.NewServiceAgent(opts.Conn, na, nil)
		if err != nil {
			return mk.sum, err
		}
		agents[id] = sa
		if id != "buyer" {
			mk.supplier(id, sa)
		}
		wg.Go(func() {
			if err := na.Run(ctx); err != nil {
				runErrs <- fmt.Errorf("%s: %w", id, err)
			}
		})
	}
	defer wg.Wait()
	defer cancel()
	if err := mk.allocate(ctx, agents["buyer"]); err != nil {
		return mk.sum, fmt.Errorf("allocate: %w", err)
	}
	if err := mk.transact(ctx, agents["buyer"]); err != nil {
		return mk.sum, fmt.Errorf("transact: %w", err)
	}
	select {
	case err := <-runErrs:
		return mk.sum, err
	default:
	}
	return mk.sum, mk.finish(ctx)
}

// setUp creates the client and the agents, has the suppliers follow the
// buyer (so that it may open dialogues with them), and registers the
// buyer's owner's approval key with an automated limit of 5 USD per
// transaction.
func (mk *market) setUp(ctx context.Context) error {
	if _, err := mk.reg.CreateClient(ctx, &registryv1.CreateClientRequest{ClientId: MarketClient, Client: &registryv1.Client{DisplayName: "Market demo"}}); err != nil && status.Code(err) != codes.AlreadyExists {
		return fmt.Errorf("create client %s: %w", MarketClient, err)
	}
	for _, id := range MarketAgents {
		_, err := mk.reg.CreateAgent(ctx, &registryv1.CreateAgentRequest{Parent: "clients/" + MarketClient, AgentId: id + mk.opts.Suffix, Agent: &registryv1.Agent{DisplayName: id}})
		if err != nil && status.Code(err) != codes.AlreadyExists {
			return fmt.Errorf("create %s: %w", id, err)
		}
		if id != "buyer" {
			if _, err := mk.reg.FollowAgent(ctx, &registryv1.FollowAgentRequest{Name: mk.names[id], Agent: mk.names["buyer"]}); err != nil && status.Code(err) != codes.AlreadyExists {
				return fmt.Errorf("%s follows the buyer: %w", id, err)
			}
		}
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return err
	}
	mk.owner = priv
	_, err = mk.reg.UpdateAgent(ctx, &registryv1.UpdateAgentRequest{
		Agent: &registryv1.Agent{Name: mk.names["buyer"], Owner: &registryv1.Owner{
			Name: "Demo Owner", ApprovalPublicKey: pub, AutomatedLimitPerTransactionMicroUsd: proto.Int64(5_000_000), DailyLimitMicroUsd: 100_000_000,
		}},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"owner"}},
	})
	if err != nil {
		return fmt.Errorf("register the buyer's owner key: %w", err)
	}
	mk.logf("set up: the buyer and five suppliers (steady, slow, fickle, picky, premium); the buyer's owner registered an approval key, automated limit 5 USD per transaction")
	return nil
}

// usd is a price in US dollars.
func usd(dollars float64) sdk.Price {
	return sdk.Price{AmountMicros: int64(dollars * 1e6), Currency: "USD"}
}

// prices are what each supplier asks, per protocol.
var prices = map[string]map[string]sdk.Price{
	sdk.Allocate: {"steady": usd(3.0), "fickle": usd(3.5), "premium": usd(4.0), "slow": usd(2.0)},
	sdk.Transact: {"picky": usd(1.0), "fickle": usd(1.2), "slow": usd(1.4), "premium": usd(1.6), "steady": usd(3.0)},
}

// task is the buyer's task; kind tells the suppliers which protocol runs.
type task struct {
	Kind string `json:"kind"`
	What string `json:"what"`
}

func kindOf(m sdk.Message) string {
	var body struct {
		Task task `json:"task"`
	}
	_ = json.Unmarshal(m.Body, &body)
	return body.Task.Kind
}

// supplier registers a supplier's stages.
//
// The slow supplier does not block its mailbox while it dawdles: it keeps
// the message it should answer and answers it when the network tells it
// that the deadline expired, which the network then refuses.
func (mk *market) supplier(id string, sa *sdk.ServiceAgent) {
	name := mk.names[id]
	send := func(ctx context.Context, r sdk.Responder, m sdk.Message, typ string, body any) error {
		if _, err := r.Reply(ctx, typ, body); err != nil {
			return err
		}
		mk.saw(m.DialogueID, name, typ)
		mk.logf("  %s -> buyer: %s", id, typ)
		return nil
	}
	var (
		lateMu sync.Mutex
		late   = map[string]sdk.Message{} // dialogue → the message slow answers after its deadline
	)
	dawdle := func(m sdk.Message) error {
		lateMu.Lock()
		defer lateMu.Unlock()
		late[m.DialogueID] = m
		mk.logf("  %s takes its time over the %s", id, m.Type)
		return nil
	}
	answerLate := func(ctx context.Context, expired sdk.Message, r sdk.Responder) error {
		lateMu.Lock()
		m, ok := late[expired.DialogueID]
		delete(late, expired.DialogueID)
		lateMu.Unlock()
		if !ok {
			return nil
		}
		kind := mk.kind(m.DialogueID)
		_, err := r.ReplyTo(ctx, m.ID, "offer", offerBody(id, kind, nil))
		var ref *sdk.Refusal
		switch {
		case err == nil:
			err = errors.New("the network took slow's late offer, want a refusal")
		case !errors.As(err, &ref):
			err = fmt.Errorf("slow's late offer: %w", err)
		default:
			err = nil
			mk.event(&mk.sum.Refusals, MarketEvent{Dialogue: m.DialogueID, Supplier: id, What: "offer", Rule: ref.Rule, Detail: ref.Detail})
			mk.logf("  %s -> buyer: offer, too late: the network refused it (%s)", id, ref.Rule)
		}
		mk.lateDone(kind, err) // the buyer waits for the attempt, failed or not
		return err
	}
	offer := func(kind string, extra map[string]any) map[string]any { return offerBody(id, kind, extra) }
	sa.Supply("new_task_request", func(ctx context.Context, m sdk.Message, r sdk.Responder) error {
		kind := kindOf(m)
		mk.mu.Lock()
		mk.kinds[m.DialogueID] = kind
		mk.mu.Unlock()
		mk.saw(m.DialogueID, name, "new_task_request")
		switch {
		case kind == sdk.Allocate && id == "picky":
			return send(ctx, r, m, "reject_task", map[string]string{"reason": "not my kind of work"})
		case kind == sdk.Allocate && id == "slow":
			return dawdle(m)
		case kind == sdk.Allocate:
			return send(ctx, r, m, "offer", offer(kind, nil))
		default:
			return send(ctx, r, m, "proposal", map[string]any{"proposal": map[string]string{"by": id}, "price": prices[kind][id]})
		}
	})
	sa.Supply("invite_offer", func(ctx context.Context, m sdk.Message, r sdk.Responder) error {
		mk.saw(m.DialogueID, name, "invite_offer")
		switch id {
		case "picky":
			return send(ctx, r, m, "reject_invite_offer", map[string]string{"reason": "changed my mind"})
		case "slow":
			return dawdle(m)
		case "premium":
			return send(ctx, r, m, "offer", offer(sdk.Transact, map[string]any{"payment_required": true, "human_authorization_required": true}))
		case "fickle":
			if err := send(ctx, r, m, "offer", offer(sdk.Transact, nil)); err != nil {
				return err
			}
			// Revoke at once: it answers the invitation, not the offer.
			defer close(mk.revoked)
			if _, err := r.Reply(ctx, "revoke_offer", map[string]string{"reason": "found a better customer"}); err != nil {
				return err
			}
			mk.saw(m.DialogueID, name, "revoke_offer")
			mk.logf("  fickle -> buyer: revoke_offer")
			mk.event(&mk.sum.Revocations, MarketEvent{Dialogue: m.DialogueID, Supplier: id, What: "revoke_offer"})
			return nil
		}
		return send(ctx, r, m, "offer", offer(sdk.Transact, nil))
	})
	sa.Supply("accept_offer", func(ctx context.Context, m sdk.Message, r sdk.Responder) error {
		mk.saw(m.DialogueID, name, "accept_offer")
		var body struct {
			Payment *sdk.PaymentReference `json:"payment"`
		}
		_ = json.Unmarshal(m.Body, &body)
		if body.Payment != nil {
			if err := sa.CapturePayment(ctx, *body.Payment); err != nil {
				return send(ctx, r, m, "payment_error", map[string]any{"error": err.Error(), "offer_timeout": 30})
			}
			mk.logf("  %s captured payment %s", id, body.Payment.Reference)
			if err := send(ctx, r, m, "payment_confirmed", map[string]any{"payment": body.Payment}); err != nil {
				return err
			}
		}
		// Deliver at once: order_complete answers the acceptance.
		return send(ctx, r, m, "order_complete", map[string]string{"delivered": "yes"})
	})
	for _, typ := range []string{"reject_offer", "reject_proposal", "task_withdrawn", "confirm_success", "confirm_fail"} {
		sa.Supply(typ, func(_ context.Context, m sdk.Message, _ sdk.Responder) error {
			mk.saw(m.DialogueID, name, typ)
			mk.logf("  buyer -> %s: %s", id, typ)
			return nil
		})
	}
	// The network's copy of a refusal (the sender already has it from its
	// call): the pair's state did not change.
	sa.Supply("protocol_error", func(context.Context, sdk.Message, sdk.Responder) error { return nil })
	for _, deadline := range []string{"proposal_timeout", "invite_offer_timeout", "offer_timeout"} {
		sa.Supply(deadline+"_expired", func(ctx context.Context, m sdk.Message, r sdk.Responder) error {
			mk.saw(m.DialogueID, name, deadline+"_expired")
			mk.event(&mk.sum.Expiries, MarketEvent{Dialogue: m.DialogueID, Supplier: id, What: deadline})
			mk.logf("  network -> %s and buyer: %s expired", id, deadline)
			return answerLate(ctx, m, r)
		})
	}
}

// offerBody is supplier id's offer under protocol kind, with extra terms.
func offerBody(id, kind string, extra map[string]any) map[string]any {
	body := map[string]any{"offer": map[string]string{"by": id}, "offer_timeout": 30, "price": prices[kind][id]}
	for k, v := range extra {
		body[k] = v
	}
	return body
}

func (mk *market) kind(dialogue string) string {
	mk.mu.Lock()
	defer mk.mu.Unlock()
	return mk.kinds[dialogue]
}

func (mk *market) suppliers() []string {
	var out []string
	for _, id := range MarketAgents[1:] {
		out = append(out, mk.names[id])
	}
	return out
}

// byPrice scores a bid: the cheaper, the better; a bid without a price
// last.
func byPrice(b sdk.Bid) float64 {
	if b.Price == nil {
		return -1e18
	}
	return -float64(b.Price.AmountMicros)
}

func (mk *market) describe(b sdk.Bid) string {
	if b.Price == nil {
		return mk.short(b.Supplier)
	}
	return fmt.Sprintf("%s at %.2f %s", mk.short(b.Supplier), float64(b.Price.AmountMicros)/1e6, b.Price.Currency)
}

// allocate is phase 1.
func (mk *market) allocate(ctx context.Context, buyer *sdk.ServiceAgent) error {
	mk.logf("allocate: the buyer asks all five for binding offers, window %s", mk.opts.Window)
	round, err := buyer.Allocate(ctx, sdk.Request{To: mk.suppliers(), Task: task{Kind: sdk.Allocate, What: "ship 10 boxes"}, Window: mk.opts.Window}, byPrice)
	if err != nil {
		return err
	}
	mk.remember(round.Dialogue, sdk.Allocate)
	var ranked []string
	for _, o := range round.Offers {
		ranked = append(ranked, mk.describe(o))
	}
	mk.logf("allocate: the window closed; offers ranked by price: %s", strings.Join(ranked, ", "))
	if len(round.Offers) == 0 {
		return sdk.ErrNoSupplier
	}
	best := round.Offers[0]
	order, err := round.Accept(ctx, best, nil)
	if err != nil {
		return err
	}
	mk.saw(round.Dialogue, best.Supplier, "accept_offer")
	mk.logf("allocate: the buyer accepts %s: order %s", mk.describe(best), order.ID)
	for _, o := range round.Offers[1:] {
		if err := round.Reject(ctx, o); err != nil {
			return err
		}
	}
	if err := mk.complete(ctx, round, order); err != nil {
		return err
	}
	mk.addOrder(sdk.Allocate, order, best, false)
	if err := mk.waitLate(ctx, sdk.Allocate); err != nil {
		return err
	}
	return round.Close(ctx)
}

// complete waits for the supplier's order_complete and signs it off.
func (mk *market) complete(ctx context.Context, round *sdk.Round, order sdk.Order) error {
	done, err := round.Await(ctx, order.Supplier, "order_complete", "order_failed")
	if err != nil {
		return err
	}
	if done.Type != "order_complete" {
		return fmt.Errorf("%s ended the order with %s", mk.short(order.Supplier), done.Type)
	}
	if err := round.Confirm(ctx, done, true); err != nil {
		return err
	}
	mk.saw(round.Dialogue, order.Supplier, "confirm_success")
	return nil
}

// lateMargin is how long, past the window, the buyer waits for slow's
// late answer before it reports that it never came.
const lateMargin = 30 * time.Second

// lateDone records that slow tried its late answer under protocol kind,
// and how it failed (nil when the network refused it, as it should).
func (mk *market) lateDone(kind string, err error) {
	mk.mu.Lock()
	defer mk.mu.Unlock()
	select {
	case <-mk.lateTried[kind]: // a second expiry in the dialogue: the first attempt stands
	default:
		mk.lateErr[kind] = err
		close(mk.lateTried[kind])
	}
}

// waitLate waits until slow has tried its late answer under protocol
// kind, at most lateWait: a missing attempt is an error that says so,
// never a hang.
func (mk *market) waitLate(ctx context.Context, kind string) error {
	timer := time.NewTimer(mk.lateWait)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		mk.mu.Lock()
		defer mk.mu.Unlock()
		return fmt.Errorf("waiting for slow's late %s offer: %w%s", kind, context.Cause(ctx), mk.reported())
	case <-timer.C:
		mk.mu.Lock()
		defer mk.mu.Unlock()
		return fmt.Errorf("slow did not try its late offer under %s within %s of the buyer's wait "+
			"(its deadline's expiry never reached it, or it never answered it)%s", kind, mk.lateWait, mk.reported())
	case <-mk.lateTried[kind]:
		mk.mu.Lock()
		defer mk.mu.Unlock()
		return mk.lateErr[kind]
	}
}

func (mk *market) remember(dialogue, kind string) {
	mk.mu.Lock()
	defer mk.mu.Unlock()
	mk.kinds[dialogue] = kind
}

func (mk *market) addOrder(kind string, o sdk.Order, offer sdk.Bid, paid bool) {
	mk.mu.Lock()
	defer mk.mu.Unlock()
	mk.sum.Orders = append(mk.sum.Orders, MarketOrder{Protocol: kind, Dialogue: o.Dialogue, Order: o.ID, Supplier: mk.short(o.Supplier), Price: offer.Price, Paid: paid, Approved: paid})
}

// transact is phase 2.
func (mk *market) transact(ctx context.Context, buyer *sdk.ServiceAgent) error {
	mk.logf("transact: the buyer asks all five for proposals, window %s", mk.opts.Window)
	paid := false
	deal, err := buyer.Transact(ctx, sdk.Request{To: mk.suppliers(), Task: task{Kind: sdk.Transact, What: "print 500 flyers"}, Window: mk.opts.Window}, byPrice, sdk.TransactOptions{
		InviteWindow: mk.opts.Window,
		OnProposals: func(ranked []sdk.Bid) {
			var names []string
			for _, p := range ranked {
				names = append(names, mk.describe(p))
			}
			mk.logf("transact: the window closed; proposals ranked by price: %s; the buyer invites them in turn", strings.Join(names, ", "))
		},
		OnFallback: func(f sdk.Fallback) {
			mk.logf("transact: %s %s; the buyer falls back to the next proposal", mk.short(f.Supplier), f.Reason)
		},
		Accept: func(ctx context.Context, d *sdk.Deal, offer sdk.Bid) (any, error) {
			var terms struct {
				PaymentRequired bool `json:"payment_required"`
				HumanAuth       bool `json:"human_authorization_required"`
			}
			_ = json.Unmarshal(offer.Message.Body, &terms)
			if offer.Supplier == mk.names["fickle"] {
				mk.logf("transact: the buyer reads fickle's offer (%s) slowly; meanwhile fickle revokes it", mk.describe(offer))
				select {
				case <-ctx.Done():
					return nil, ctx.Err()
				case <-mk.revoked:
				}
			}
			if !terms.PaymentRequired || offer.Price == nil {
				mk.logf("transact: the buyer sends accept_offer to %s", mk.describe(offer))
				return struct{}{}, nil
			}
			ref, err := buyer.CreatePayment(ctx, offer.Supplier, *offer.Price)
			if err != nil {
				return nil, err
			}
			mk.mu.Lock()
			mk.payments = append(mk.payments, ref.Reference)
			mk.mu.Unlock()
			order := sdk.OrderID(d.Dialogue, offer.Supplier)
			// The owner signs on its own side; the network checks the
			// signature against the key in the registry.
			approval := sdk.SignApproval(mk.owner, sdk.ApprovalTerms{Order: order, AmountMicros: offer.Price.AmountMicros, Currency: offer.Price.Currency, Payee: offer.Supplier}, time.Now().Add(5*time.Minute))
			paid = true
			mk.logf("transact: %s asks for payment and approval; the buyer pays by reference %s and its owner signs order %s", mk.describe(offer), ref.Reference, order)
			return map[string]any{"payment": ref, "human_authorization": approval}, nil
		},
	})
	if deal != nil {
		mk.remember(deal.Dialogue, sdk.Transact)
		mk.mu.Lock()
		for _, f := range deal.Fallbacks {
			f.Supplier = mk.short(f.Supplier)
			mk.sum.Fallbacks = append(mk.sum.Fallbacks, f)
		}
		mk.mu.Unlock()
	}
	if err != nil {
		return err
	}
	mk.saw(deal.Dialogue, deal.Order.Supplier, "accept_offer")
	mk.logf("transact: order %s with %s", deal.Order.ID, mk.describe(deal.Offer))
	if err := mk.complete(ctx, deal.Round, deal.Order); err != nil {
		return err
	}
	mk.addOrder(sdk.Transact, deal.Order, deal.Offer, paid && deal.Offer.Supplier == mk.names["premium"])
	if err := mk.waitLate(ctx, sdk.Transact); err != nil {
		return err
	}
	return deal.Close(ctx)
}

// finish reads the orders and payments back from the server and fills in
// each dialogue's final state.
func (mk *market) finish(ctx context.Context) error {
	buyer := mk.names["buyer"]
	for i, o := range mk.sum.Orders {
		got, err := mk.disp.GetOrder(ctx, &dispatcherv1.GetOrderRequest{Name: buyer + "/orders/" + o.Order})
		if err != nil {
			return fmt.Errorf("read order %s: %w", o.Order, err)
		}
		mk.sum.Orders[i].State = strings.TrimPrefix(got.GetState().String(), "ORDER_STATE_")
		mk.sum.Orders[i].LastMessage = got.GetLastMessageType()
		for _, t := range got.GetTransitions() {
			mk.sum.Orders[i].Trail = append(mk.sum.Orders[i].Trail, t.GetMessageType())
		}
	}
	for _, ref := range mk.payments {
		p, err := mk.disp.GetPayment(ctx, &dispatcherv1.GetPaymentRequest{Name: buyer + "/payments/" + ref})
		if err != nil {
			return fmt.Errorf("read payment %s: %w", ref, err)
		}
		mk.sum.Payments = append(mk.sum.Payments, MarketPayment{
			Reference: ref, Payer: mk.short(p.GetPayer()), Payee: mk.short(p.GetPayee()), AmountMicros: p.GetAmountMicros(), Currency: p.GetCurrency(),
			State: strings.TrimPrefix(p.GetState().String(), "PAYMENT_STATE_"), Order: p.GetOrder(),
		})
	}
	// The network's last messages (task_withdrawn on close) reach the
	// suppliers after the buyer is done: wait for every pair to end, or
	// report the state as it stands after 10 s.
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	stop := context.AfterFunc(wctx, func() {
		mk.mu.Lock()
		defer mk.mu.Unlock()
		mk.changed.Broadcast()
	})
	defer stop()
	mk.mu.Lock()
	for !mk.settled() && wctx.Err() == nil {
		mk.changed.Wait()
	}
	for d, sup := range mk.last {
		mk.sum.Dialogues = append(mk.sum.Dialogues, MarketDialogue{Protocol: mk.kinds[d], Dialogue: d, Suppliers: maps.Clone(sup)})
	}
	mk.mu.Unlock()
	slices.SortFunc(mk.sum.Dialogues, func(a, b MarketDialogue) int { return strings.Compare(a.Protocol, b.Protocol) })
	for _, o := range mk.sum.Orders {
		mk.logf("order %s (%s) with %s: %s, trail %s", o.Order, o.Protocol, o.Supplier, o.State, strings.Join(o.Trail, " > "))
	}
	return nil
}

// RemoveMarketAgents deletes a run's agents (for runs on a user's server);
// it returns the names it removed.
func RemoveMarketAgents(ctx context.Context, conn grpc.ClientConnInterface, suffix string) ([]string, error) {
	reg := registryv1.NewRegistryServiceClient(conn)
	var removed []string
	var errs []error
	for _, id := range MarketAgents {
		name := "clients/" + MarketClient + "/agents/" + id + suffix
		_, err := reg.DeleteAgent(ctx, &registryv1.DeleteAgentRequest{Name: name})
		switch {
		case err == nil:
			removed = append(removed, name)
		case status.Code(err) != codes.NotFound:
			errs = append(errs, fmt.Errorf("delete %s: %w", name, err))
		}
	}
	return removed, errors.Join(errs...)
}
