package sdk

import (
	"container/list"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
)

// The network's built-in service protocols (NewRequest's protocol).
const (
	Delegate = "delegate"
	Allocate = "allocate"
	Transact = "transact"
)

// ServiceAgent runs a network agent's service transactions (delegate,
// allocate, transact; socontra.md section 8): as a consumer, the blocking
// helpers Delegate, Allocate and Transact; as a supplier, a handler per
// stage (Supply). The network enforces every step and deadline; these
// helpers only sequence the messages.
//
// It takes the agent's protocol_error route (every message of a protocol
// that no other route takes comes through it), so register no other
// handler for service messages on that agent. Messages it does not place
// (no consumer dialogue of this agent, no supplier stage, a supplier
// dialogue whose pair ended: see Supply) go to the Fallback given to
// NewServiceAgent, when there is one. A service message of an unknown
// dialogue that arrives while a consumer call's NewRequest is in flight
// is held for that call instead (it may answer it before the call knows
// its dialogue); if no call claims it, it is dropped when the last such
// call returns, and reported to NetworkOptions.OnError (ErrNoRoute).
type ServiceAgent struct {
	agent    *NetworkAgent
	client   dispatcherv1.DispatcherServiceClient
	fallback HandlerFunc

	mu       sync.Mutex
	consumer map[string]*dialogueQueue // this agent's dialogues as consumer, by id
	orphans  map[string][]Message      // messages of dialogues not (yet) known, by dialogue
	// requests counts the NewRequest calls in flight: only while one is
	// can a service message of an unknown dialogue be an early answer to
	// it (held in orphans until it returns).
	requests  int
	supplying supplierDialogues    // dialogues this agent serves as a supplier
	stages    map[string]StageFunc // supplier stages by message type
}

// maxOrphans bounds the messages of unknown dialogues kept for a consumer
// call still waiting for its NewRequest to return.
const maxOrphans = 1024

// maxSupplying bounds the dialogues a ServiceAgent remembers serving as a
// supplier (see Supply): about 100 bytes each.
const maxSupplying = 10_000

// StageFunc handles one message a supplier receives (a stage: a
// new_task_request, an invite_offer, an accept_offer, an expiry...); it
// answers through r.
type StageFunc func(ctx context.Context, m Message, r Responder) error

// Responder answers the message a stage handles, as the agent.
type Responder struct {
	s *ServiceAgent
	m Message
}

// Reply sends a message of type typ with body (marshalled to JSON) in
// answer to the stage's message, and returns its id.
func (r Responder) Reply(ctx context.Context, typ string, body any) (string, error) {
	return r.s.reply(ctx, r.m.ID, typ, body)
}

// ReplyTo answers another message of the same dialogue (such as the
// invite_offer a revoke_offer answers).
func (r Responder) ReplyTo(ctx context.Context, messageID, typ string, body any) (string, error) {
	return r.s.reply(ctx, messageID, typ, body)
}

// NewServiceAgent returns the service side of agent, sending over conn
// with the agent's key. Call it before agent.Run.
func NewServiceAgent(conn grpc.ClientConnInterface, agent *NetworkAgent, fallback HandlerFunc) (*ServiceAgent, error) {
	s := newServiceAgent(agent, dispatcherv1.NewDispatcherServiceClient(conn), fallback)
	if err := agent.Handle(RouteKey{Agent: agent.Name(), Type: TypeProtocolError}, "service", s.route); err != nil {
		return nil, err
	}
	return s, nil
}

func newServiceAgent(agent *NetworkAgent, client dispatcherv1.DispatcherServiceClient, fallback HandlerFunc) *ServiceAgent {
	return &ServiceAgent{
		agent: agent, client: client, fallback: fallback,
		consumer: map[string]*dialogueQueue{}, orphans: map[string][]Message{}, supplying: newSupplierDialogues(maxSupplying), stages: map[string]StageFunc{},
	}
}

// Supply registers the supplier's handler for messages of type typ
// (new_task_request, invite_offer, accept_offer, reject_offer, ...). A
// stage without a handler goes to the Fallback given to NewServiceAgent
// (is dropped when there is none), and the network's deadlines run their
// course.
//
// The agent serves a dialogue as a supplier from its new_task_request
// until its pair with the consumer ends, as far as the network tells it:
// on receiving reject_proposal, reject_offer, task_withdrawn (the
// consumer closed the dialogue), cancel_order, confirm_success,
// confirm_fail or an expiry (<deadline>_expired, from the network); or
// when the network accepts its own reject_task, reject_invite_offer,
// revoke_offer, reject_offer, cancel_order, order_failed, or an
// order_complete after its own accept_offer (delegate, where no
// confirmation follows). These are the ends of delegate, allocate and
// transact (socontra.md section 8); after one, nothing more of the pair
// can arrive. A pair the consumer leaves open for good (an order_complete
// never confirmed, an order nobody ends, a dialogue never closed) brings
// no such message, so at most 10,000 dialogues are kept, and above that
// the least recently active one is forgotten. A message of a dialogue
// forgotten (one the supplier's own ending reply overtook, say, or one of
// a pair forgotten above the bound) reaches no stage: it goes to the
// Fallback, like any message the agent does not place.
// SupplierDialogues says how many are kept.
func (s *ServiceAgent) Supply(typ string, f StageFunc) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stages[typ] = f
}

// SupplierDialogues returns how many dialogues the agent serves as a
// supplier whose pair has not ended as far as it knows (see Supply).
func (s *ServiceAgent) SupplierDialogues() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.supplying.byID)
}

// route places m: in its consumer dialogue's queue, to a supplier stage,
// aside while a consumer call may be waiting for it, or to the Fallback.
func (s *ServiceAgent) route(ctx context.Context, m Message) (any, error) {
	s.mu.Lock()
	if q := s.consumer[m.DialogueID]; q != nil {
		s.mu.Unlock()
		q.push(m)
		return nil, nil
	}
	if m.Type == "new_task_request" && m.InReplyTo == "" {
		s.supplying.add(m.DialogueID)
	}
	stage, supplier := s.stages[m.Type], s.supplying.received(m)
	if !supplier && m.Category == CategoryService && s.requests > 0 {
		// Perhaps a reply to a consumer call whose NewRequest has not
		// returned yet.
		if len(s.orphans) < maxOrphans {
			s.orphans[m.DialogueID] = append(s.orphans[m.DialogueID], m)
		}
		s.mu.Unlock()
		return nil, nil
	}
	s.mu.Unlock()
	switch {
	case supplier && stage != nil:
		return nil, stage(ctx, m, Responder{s: s, m: m})
	case s.fallback != nil:
		return s.fallback(ctx, m)
	}
	return nil, nil
}

// requesting counts a NewRequest call in flight; open or requested ends
// it.
func (s *ServiceAgent) requesting() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests++
}

// requested ends a NewRequest call that opened no dialogue.
func (s *ServiceAgent) requested() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.endRequest()
}

// endRequest ends a NewRequest call (under s.mu). When it was the last,
// the messages still held answer no call: they are dropped, reported as
// unrouted.
func (s *ServiceAgent) endRequest() {
	s.requests--
	if s.requests > 0 {
		return
	}
	for _, ms := range s.orphans {
		for _, m := range ms {
			s.agent.report(fmt.Errorf("message %s (type %q) of dialogue %s, which no consumer call or supplier stage of this agent takes: %w", m.ID, m.Type, m.DialogueID, ErrNoRoute))
		}
	}
	clear(s.orphans)
}

// open registers a consumer dialogue and takes in what arrived for it
// before, ahead of anything route pushes once it finds the queue (so
// under s.mu: route may run on another goroutine, see
// NetworkOptions.Concurrency). It ends a NewRequest call.
func (s *ServiceAgent) open(id string) *dialogueQueue {
	q := newDialogueQueue()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.consumer[id] = q
	for _, m := range s.orphans[id] {
		q.push(m)
	}
	delete(s.orphans, id)
	s.endRequest()
	return q
}

// forget drops a consumer dialogue's queue.
func (s *ServiceAgent) forget(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.consumer, id)
}

func (s *ServiceAgent) reply(ctx context.Context, inReplyTo, typ string, body any) (string, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return "", err
	}
	res, err := s.client.ReplyMessage(s.agent.callContext(ctx), &dispatcherv1.ReplyMessageRequest{
		Sender: s.agent.Name(), InReplyTo: inReplyTo, MessageType: typ, BodyJson: string(b),
	})
	if err != nil {
		return "", refusal(typ, err)
	}
	s.replied(res.GetDialogueId(), typ)
	return res.GetMessageId(), nil
}

// replied records that the network accepted the agent's reply of type
// typ in dialogue.
func (s *ServiceAgent) replied(dialogue, typ string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.supplying.sent(dialogue, typ)
}

// ErrRefused is wrapped by the error of a service message the network
// refused (a *Refusal): the state machine, a deadline, a closed dialogue,
// the payment gate or the owner's approval said no, and nothing changed.
var ErrRefused = errors.New("the network refused the message")

// Refusal is the error of a service message the network refused. It
// wraps ErrRefused and the gRPC status error.
type Refusal struct {
	Type string // the refused message's type
	// Reason is the status's ErrorInfo reason: PROTOCOL_ERROR,
	// DIALOGUE_CLOSED, PAYMENT_REFERENCE, APPROVAL_SIGNATURE, ...
	Reason string
	// Rule is the rule broken: a state machine's (PAIR_ENDED,
	// DEADLINE_PASSED, NOT_ALLOWED_AFTER, ...) for a PROTOCOL_ERROR, else
	// the Reason.
	Rule string
	// State is the pair's state a state machine's refusal names: the type
	// of the last message the pair accepted ("revoke_offer" when a
	// revocation won the race with an acceptance); "" when the rule names
	// none.
	State string
	// Deadline is the deadline that passed (DEADLINE_PASSED) or whose
	// lapse ended the pair (PAIR_ENDED), if one did.
	Deadline string
	Detail   string // the server's sentence, naming the rule (and a deadline); for people, not for branching
	err      error
}

func (e *Refusal) Error() string {
	return fmt.Sprintf("%s refused (%s): %s", e.Type, e.Rule, e.Detail)
}

// Unwrap returns ErrRefused and the gRPC status error.
func (e *Refusal) Unwrap() []error { return []error{ErrRefused, e.err} }

// refusal wraps err of sending a message of type typ: a *Refusal for a
// refusal (FAILED_PRECONDITION, INVALID_ARGUMENT, PERMISSION_DENIED), else
// err with the type.
func refusal(typ string, err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return fmt.Errorf("%s: %w", typ, err)
	}
	switch st.Code() {
	case codes.FailedPrecondition, codes.InvalidArgument, codes.PermissionDenied:
	default:
		return fmt.Errorf("%s: %w", typ, err)
	}
	r := &Refusal{Type: typ, Reason: st.Code().String(), Detail: st.Message(), err: err}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			// A reply has one recipient: the first refusal is its.
			md := info.GetMetadata()
			r.Reason, r.Rule, r.State, r.Deadline = info.GetReason(), md["refused_0_rule"], md["refused_0_state"], md["refused_0_deadline"]
		}
	}
	if r.Rule == "" {
		r.Rule = r.Reason
	}
	return r
}

// CreatePayment creates a payment of the network's ledger provider from
// the agent to payee and returns the payment field an accept_offer
// carries. Each call sends a request_id of its own (AIP-155) and, when the
// server cannot be reached (UNAVAILABLE: the payment may or may not have
// been created), tries again with the same id, up to paymentAttempts
// times with the agent's backoff: a retry returns the payment an earlier
// attempt created rather than a second one.
func (s *ServiceAgent) CreatePayment(ctx context.Context, payee string, price Price) (PaymentReference, error) {
	req := &dispatcherv1.CreatePaymentRequest{
		Parent:    s.agent.Name(),
		Payment:   &dispatcherv1.Payment{Payee: payee, AmountMicros: price.AmountMicros, Currency: price.Currency},
		RequestId: rand.Text(), // 26 letters and digits: the server's request_id format
	}
	backoff := s.agent.opts.MinBackoff
	for attempt := 1; ; attempt++ {
		p, err := s.client.CreatePayment(s.agent.callContext(ctx), req)
		if err == nil {
			return PaymentReference{Provider: "ledger", Reference: p.GetName()[strings.LastIndex(p.GetName(), "/")+1:]}, nil
		}
		if status.Code(err) != codes.Unavailable || attempt == paymentAttempts {
			return PaymentReference{}, err
		}
		if werr := sleep(ctx, backoff); werr != nil {
			return PaymentReference{}, errors.Join(err, werr)
		}
		backoff = min(2*backoff, s.agent.opts.MaxBackoff)
	}
}

// paymentAttempts is how many times CreatePayment sends its request while
// the server cannot be reached.
const paymentAttempts = 4

// CapturePayment takes a ledger payment an acceptance reserved for the
// agent, its payee (before it sends payment_confirmed).
func (s *ServiceAgent) CapturePayment(ctx context.Context, ref PaymentReference) error {
	_, err := s.client.CapturePayment(s.agent.callContext(ctx), &dispatcherv1.CapturePaymentRequest{Name: s.agent.Name() + "/payments/" + ref.Reference})
	return err
}

// Price is an amount of a currency, in millionths of its unit, as an
// offer's price field states it.
type Price struct {
	AmountMicros int64  `json:"amount_micros"`
	Currency     string `json:"currency"`
}

// PaymentReference is an accept_offer's payment field.
type PaymentReference struct {
	Provider  string `json:"provider"`
	Reference string `json:"reference"`
}

// Request is a consumer's task for suppliers.
type Request struct {
	To   []string // the suppliers, clients/{c}/agents/{a}
	Task any      // a JSON object
	// Window is the protocol's opener deadline: how long suppliers have
	// to answer (delegate: offer_timeout; allocate: invite_offer_timeout;
	// transact: proposal_timeout). Whole seconds, at least one.
	Window time.Duration
}

// Bid is a supplier's proposal or offer.
type Bid struct {
	Supplier string
	Message  Message
	Price    *Price // the body's price, when it states one
}

func newBid(m Message) Bid {
	b := Bid{Supplier: m.Sender, Message: m}
	var body struct {
		Price *Price `json:"price"`
	}
	if json.Unmarshal(m.Body, &body) == nil {
		b.Price = body.Price
	}
	return b
}

// rank orders bids by score, best (highest) first; ties keep arrival
// order.
func rank(bids []Bid, score func(Bid) float64) []Bid {
	out := slices.Clone(bids)
	slices.SortStableFunc(out, func(a, b Bid) int {
		sa, sb := score(a), score(b)
		switch {
		case sa > sb:
			return -1
		case sa < sb:
			return 1
		}
		return 0
	})
	return out
}

// ErrNoSupplier is returned by Delegate and Transact when no supplier
// ended in an order.
var ErrNoSupplier = errors.New("no supplier formed an order")

// Order is an order a consumer formed.
type Order struct {
	ID       string // OrderID(Dialogue, Supplier)
	Dialogue string
	Supplier string
	Accept   string // the id of the message that formed it
}

// newRequest opens a service dialogue and returns its queue and the
// suppliers it reached.
func (s *ServiceAgent) newRequest(ctx context.Context, protocol, window string, req Request) (*dialogueQueue, *dispatcherv1.SendMessageResponse, error) {
	task, err := json.Marshal(req.Task)
	if err != nil {
		return nil, nil, err
	}
	r := &dispatcherv1.NewRequestRequest{
		Sender: s.agent.Name(), To: &dispatcherv1.DistributionList{Direct: req.To}, Protocol: protocol, TaskJson: string(task),
	}
	d := durationpb.New(req.Window)
	switch window {
	case "proposal_timeout":
		r.ProposalTimeout = d
	case "invite_offer_timeout":
		r.InviteOfferTimeout = d
	case "offer_timeout":
		r.OfferTimeout = d
	}
	s.requesting()
	res, err := s.client.NewRequest(s.agent.callContext(ctx), r)
	if err != nil {
		s.requested()
		return nil, nil, fmt.Errorf("new_task_request: %w", err)
	}
	return s.open(res.GetDialogueId()), res, nil
}

// expiredFor returns the counterpart of a <deadline>_expired message, or
// "" when m is not one.
func expiredFor(m Message) string {
	if m.Sender != "" || !strings.HasSuffix(m.Type, "_expired") {
		return ""
	}
	var body struct {
		Counterpart string `json:"counterpart"`
	}
	_ = json.Unmarshal(m.Body, &body)
	return body.Counterpart
}

// collect gathers the suppliers' answers of type bid to the opener until
// every supplier answered, declined or let its window lapse.
func collect(ctx context.Context, q *dialogueQueue, suppliers []string, bid string) ([]Bid, error) {
	pending := map[string]bool{}
	for _, s := range suppliers {
		pending[s] = true
	}
	var bids []Bid
	for len(pending) > 0 {
		m, err := q.awaitFunc(ctx, func(m Message) bool {
			return m.Type == bid || m.Type == "reject_task" || pending[expiredFor(m)]
		})
		if err != nil {
			return bids, err
		}
		who := m.Sender
		switch {
		case m.Type == bid:
			bids = append(bids, newBid(m))
		case expiredFor(m) != "":
			who = expiredFor(m)
		}
		delete(pending, who)
	}
	return bids, nil
}

// Round is an allocate round whose offers are in: the consumer accepts
// one (before its offer_timeout) and rejects the others.
type Round struct {
	s        *ServiceAgent
	q        *dialogueQueue
	Dialogue string
	Offers   []Bid // best first
}

// Allocate sends req under allocate, collects offers until every supplier
// answered or its window (req.Window) lapsed on the server, and returns
// them ranked by score, best (highest) first.
func (s *ServiceAgent) Allocate(ctx context.Context, req Request, score func(Bid) float64) (*Round, error) {
	q, res, err := s.newRequest(ctx, Allocate, "invite_offer_timeout", req)
	if err != nil {
		return nil, err
	}
	offers, err := collect(ctx, q, res.GetRecipients(), "offer")
	if err != nil {
		s.forget(res.GetDialogueId())
		return nil, err
	}
	return &Round{s: s, q: q, Dialogue: res.GetDialogueId(), Offers: rank(offers, score)}, nil
}

// Accept accepts offer with body (nil sends {}) and returns the order.
func (r *Round) Accept(ctx context.Context, offer Bid, body any) (Order, error) {
	if body == nil {
		body = struct{}{}
	}
	id, err := r.s.reply(ctx, offer.Message.ID, "accept_offer", body)
	if err != nil {
		return Order{}, err
	}
	return Order{ID: OrderID(r.Dialogue, offer.Supplier), Dialogue: r.Dialogue, Supplier: offer.Supplier, Accept: id}, nil
}

// Reject rejects an offer.
func (r *Round) Reject(ctx context.Context, offer Bid) error {
	_, err := r.s.reply(ctx, offer.Message.ID, "reject_offer", struct{}{})
	return err
}

// Await returns the next message of the round's dialogue from supplier of
// one of types (an expiry of its pair counts as from it), keeping the
// others for later calls.
func (r *Round) Await(ctx context.Context, supplier string, types ...string) (Message, error) {
	return r.q.await(ctx, supplier, types)
}

// Confirm signs an order off after its order_complete: confirm_success,
// or confirm_fail when success is false.
func (r *Round) Confirm(ctx context.Context, complete Message, success bool) error {
	typ := "confirm_success"
	if !success {
		typ = "confirm_fail"
	}
	_, err := r.s.reply(ctx, complete.ID, typ, struct{}{})
	return err
}

// Close ends the consumer's side of the dialogue: the network sends
// task_withdrawn to every supplier whose pair has not ended.
func (r *Round) Close(ctx context.Context) error {
	defer r.s.forget(r.Dialogue)
	_, err := r.s.client.CloseDialogue(r.s.agent.callContext(ctx), &dispatcherv1.CloseDialogueRequest{Name: r.s.agent.Name() + "/dialogues/" + r.Dialogue})
	return err
}

// Delegate sends req under delegate (the task is the offer; req.Window is
// the suppliers' offer_timeout) and returns the order of the first
// supplier that accepts; ErrNoSupplier when every one declined or lapsed.
func (s *ServiceAgent) Delegate(ctx context.Context, req Request) (*Round, Order, error) {
	q, res, err := s.newRequest(ctx, Delegate, "offer_timeout", req)
	if err != nil {
		return nil, Order{}, err
	}
	r := &Round{s: s, q: q, Dialogue: res.GetDialogueId()}
	pending := len(res.GetRecipients())
	for pending > 0 {
		m, err := q.awaitFunc(ctx, func(m Message) bool {
			return m.Type == "accept_offer" || m.Type == "reject_offer" || expiredFor(m) != ""
		})
		if err != nil {
			return r, Order{}, err
		}
		if m.Type == "accept_offer" {
			return r, Order{ID: OrderID(r.Dialogue, m.Sender), Dialogue: r.Dialogue, Supplier: m.Sender, Accept: m.ID}, nil
		}
		pending--
	}
	return r, Order{}, ErrNoSupplier
}

// Fallback is a supplier Transact passed over, and why: "rejected"
// (reject_invite_offer), "revoked", "lapsed" (a deadline expired),
// "payment error", or "refused" (the network refused the acceptance,
// naming the rule).
type Fallback struct {
	Supplier string `json:"supplier"`
	Reason   string `json:"reason"`
	Detail   string `json:"detail,omitempty"`
}

// Deal is a transact dialogue's result.
type Deal struct {
	*Round
	Proposals []Bid // best first
	Order     Order
	Offer     Bid
	Fallbacks []Fallback // in the order they happened
}

// TransactOptions tune Transact.
type TransactOptions struct {
	// InviteWindow is each invited supplier's invite_offer_timeout; 30 s.
	InviteWindow time.Duration
	// Accept writes the accept_offer body for an offer: its payment
	// reference and the owner's approval when the offer asks for them.
	// nil sends {}.
	Accept func(ctx context.Context, d *Deal, offer Bid) (any, error)
	// OnProposals hears the proposals once they are in, best first;
	// OnFallback each supplier passed over, as it happens. Both may be
	// nil.
	OnProposals func(ranked []Bid)
	OnFallback  func(Fallback)
}

// Transact sends req under transact, collects proposals until every
// supplier answered or the proposal window lapsed, ranks them with score,
// and invites them in turn: it accepts the first binding offer whose
// acceptance the network takes and, for a paid one, whose supplier
// confirms the payment. After a reject_invite_offer, a revoke_offer, a
// lapse, a refused acceptance or a payment_error it falls back to the
// next-best proposal. It returns ErrNoSupplier (with the Deal so far)
// when none is left.
func (s *ServiceAgent) Transact(ctx context.Context, req Request, score func(Bid) float64, opts TransactOptions) (*Deal, error) {
	if opts.InviteWindow <= 0 {
		opts.InviteWindow = 30 * time.Second
	}
	q, res, err := s.newRequest(ctx, Transact, "proposal_timeout", req)
	if err != nil {
		return nil, err
	}
	proposals, err := collect(ctx, q, res.GetRecipients(), "proposal")
	d := &Deal{Round: &Round{s: s, q: q, Dialogue: res.GetDialogueId()}, Proposals: rank(proposals, score)}
	if err != nil {
		return d, err
	}
	if opts.OnProposals != nil {
		opts.OnProposals(d.Proposals)
	}
	for _, p := range d.Proposals {
		fb, err := d.try(ctx, p, opts)
		if err != nil {
			return d, err
		}
		if fb == nil {
			return d, nil
		}
		d.Fallbacks = append(d.Fallbacks, *fb)
		if opts.OnFallback != nil {
			opts.OnFallback(*fb)
		}
	}
	return d, ErrNoSupplier
}

// try invites p's supplier and sees the deal through to an order; a
// Fallback says why not.
func (d *Deal) try(ctx context.Context, p Bid, opts TransactOptions) (*Fallback, error) {
	secs := int64(opts.InviteWindow / time.Second)
	if _, err := d.s.reply(ctx, p.Message.ID, "invite_offer", map[string]int64{"invite_offer_timeout": max(secs, 1)}); err != nil {
		if !errors.Is(err, ErrRefused) {
			return nil, err
		}
		return &Fallback{Supplier: p.Supplier, Reason: "refused", Detail: err.Error()}, nil
	}
	m, err := d.q.await(ctx, p.Supplier, []string{"offer", "reject_invite_offer", "revoke_offer"})
	switch {
	case err != nil:
		return nil, err
	case m.Type == "reject_invite_offer":
		return &Fallback{Supplier: p.Supplier, Reason: "rejected"}, nil
	case m.Type == "revoke_offer":
		return &Fallback{Supplier: p.Supplier, Reason: "revoked"}, nil
	case m.Type != "offer":
		return &Fallback{Supplier: p.Supplier, Reason: "lapsed", Detail: m.Type}, nil
	}
	offer := newBid(m)
	// A revoke_offer recorded before the acceptance wins it: do not send
	// an acceptance the network would refuse (socontra.md section 10).
	if _, ok := d.q.take(p.Supplier, "revoke_offer"); ok {
		return &Fallback{Supplier: p.Supplier, Reason: "revoked"}, nil
	}
	var body any = struct{}{}
	if opts.Accept != nil {
		if body, err = opts.Accept(ctx, d, offer); err != nil {
			return nil, err
		}
	}
	order, err := d.Accept(ctx, offer, body)
	if err != nil {
		// A revoke_offer that came first, the offer's deadline, or the
		// payment gate: the network names the rule. A revocation the
		// network ordered first is on its way to this agent's mailbox:
		// take it, so that it is not left for a later call.
		if !errors.Is(err, ErrRefused) {
			return nil, err
		}
		// The network ordered a revocation first: the pair ended in it.
		var ref *Refusal
		if errors.As(err, &ref) && ref.State == "revoke_offer" {
			if _, err := d.q.await(ctx, p.Supplier, []string{"revoke_offer"}); err != nil {
				return nil, err
			}
			return &Fallback{Supplier: p.Supplier, Reason: "revoked", Detail: err.Error()}, nil
		}
		return &Fallback{Supplier: p.Supplier, Reason: "refused", Detail: err.Error()}, nil
	}
	var terms struct {
		PaymentRequired bool `json:"payment_required"`
	}
	_ = json.Unmarshal(offer.Message.Body, &terms)
	if terms.PaymentRequired {
		m, err := d.q.await(ctx, p.Supplier, []string{"payment_confirmed", "payment_error"})
		switch {
		case err != nil:
			return nil, err
		case m.Type == "payment_error":
			return &Fallback{Supplier: p.Supplier, Reason: "payment error", Detail: string(m.Body)}, nil
		case m.Type != "payment_confirmed":
			return &Fallback{Supplier: p.Supplier, Reason: "lapsed", Detail: m.Type}, nil
		}
	}
	d.Order, d.Offer = order, offer
	return nil, nil
}

// dialogueQueue holds a consumer dialogue's messages until the helper
// waiting in it takes them.
type dialogueQueue struct {
	mu    sync.Mutex
	msgs  []Message
	ready chan struct{} // signalled on push
}

func newDialogueQueue() *dialogueQueue { return &dialogueQueue{ready: make(chan struct{}, 1)} }

func (q *dialogueQueue) push(m Message) {
	q.mu.Lock()
	q.msgs = append(q.msgs, m)
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// take removes the first message from supplier of one of types, or
// expiring its pair.
func (q *dialogueQueue) take(supplier string, types ...string) (Message, bool) {
	return q.takeFunc(func(m Message) bool {
		return (m.Sender == supplier && slices.Contains(types, m.Type)) || expiredFor(m) == supplier
	})
}

// takeFunc removes the first message match accepts.
func (q *dialogueQueue) takeFunc(match func(Message) bool) (Message, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for i, m := range q.msgs {
		if match(m) {
			q.msgs = slices.Delete(q.msgs, i, i+1)
			return m, true
		}
	}
	return Message{}, false
}

// await waits until take(supplier, types...) finds a message.
func (q *dialogueQueue) await(ctx context.Context, supplier string, types []string) (Message, error) {
	return q.awaitFunc(ctx, func(m Message) bool {
		return (m.Sender == supplier && slices.Contains(types, m.Type)) || expiredFor(m) == supplier
	})
}

// awaitFunc waits until takeFunc(match) finds a message, or ctx ends.
func (q *dialogueQueue) awaitFunc(ctx context.Context, match func(Message) bool) (Message, error) {
	for {
		if m, ok := q.takeFunc(match); ok {
			return m, nil
		}
		if err := q.wait(ctx); err != nil {
			return Message{}, err
		}
	}
}

func (q *dialogueQueue) wait(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-q.ready:
		return nil
	}
}

// supplierDialogues are the dialogues an agent serves as a supplier whose
// pair has not ended as far as it knows, least recently active first, at
// most max (see Supply).
type supplierDialogues struct {
	max   int
	byID  map[string]*list.Element // of *supplied
	order *list.List               // least recently active first
}

type supplied struct {
	id string
	// tookOrder: the supplier's accept_offer formed the order (delegate),
	// so its order_complete ends the pair: no confirmation follows.
	tookOrder bool
}

func newSupplierDialogues(bound int) supplierDialogues {
	return supplierDialogues{max: bound, byID: map[string]*list.Element{}, order: list.New()}
}

// endsPairReceived are the types whose receipt ends a supplier's pair in
// delegate, allocate and transact (an expiry does too).
var endsPairReceived = []string{"reject_proposal", "reject_offer", "task_withdrawn", "cancel_order", "confirm_success", "confirm_fail"}

// endsPairSent are the types whose acceptance from the supplier ends its
// pair in delegate, allocate and transact (order_complete does too after
// the supplier's own accept_offer).
var endsPairSent = []string{"reject_task", "reject_invite_offer", "revoke_offer", "reject_offer", "cancel_order", "order_failed"}

// add starts serving dialogue id, forgetting the least recently active
// one above max.
func (d *supplierDialogues) add(id string) {
	if e := d.byID[id]; e != nil {
		d.order.MoveToBack(e)
		return
	}
	d.byID[id] = d.order.PushBack(&supplied{id: id})
	for len(d.byID) > d.max {
		d.remove(d.order.Front())
	}
}

func (d *supplierDialogues) remove(e *list.Element) {
	delete(d.byID, e.Value.(*supplied).id)
	d.order.Remove(e)
}

// received reports whether m is of a dialogue served (counting m as its
// latest activity), and forgets the dialogue when m ends the pair.
func (d *supplierDialogues) received(m Message) bool {
	e := d.byID[m.DialogueID]
	if e == nil {
		return false
	}
	if slices.Contains(endsPairReceived, m.Type) || (m.Sender == "" && strings.HasSuffix(m.Type, "_expired")) {
		d.remove(e)
	} else {
		d.order.MoveToBack(e)
	}
	return true
}

// sent records a reply of type typ the network accepted in dialogue, and
// forgets the dialogue when that ends the pair.
func (d *supplierDialogues) sent(dialogue, typ string) {
	e := d.byID[dialogue]
	if e == nil {
		return
	}
	sp := e.Value.(*supplied)
	switch {
	case slices.Contains(endsPairSent, typ), typ == "order_complete" && sp.tookOrder:
		d.remove(e)
	case typ == "accept_offer":
		sp.tookOrder = true
	}
}
