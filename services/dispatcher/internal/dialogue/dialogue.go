// Package dialogue is the agent network's dialogues: opening one with a new
// message or a broadcast, replying inside it, and the close filters each
// agent sets on what it receives (socontra.md sections 2 to 6).
//
// The server owns every id, the category, the sender and the time. An
// opener creates a dialogue; every later message answers one earlier
// message, and its sender must have received that message. Permission is
// checked when a dialogue starts (the Resolver, backed by the registry);
// inside an open dialogue, participants may reply until the initiator
// closes it. A broadcast opens a one-way dialogue that nobody can answer.
//
// A message is first recorded (store.DialogueStore), then appended to the
// recipients' mailboxes (mailbox.Appender); recipients whose mailbox did
// not take it are retracted from the record, so a refused recipient can
// never reply. Every recipient left out is reported in the Result with its
// reason; nothing is dropped silently. A message that no recipient accepts
// changes nothing and fails with a *RefusedError.
//
// When the dialogue's protocol declares a state machine (Protocols), each
// message is checked per (dialogue, counterpart) pair against the pair's
// stored state; a violation is not delivered to that counterpart, and the
// sender gets a protocol_error in the Result and in its mailbox.
package dialogue

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/parleyhq/parley/services/dispatcher/internal/fault"
	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

// Sentinels of the package; errors wrap one of them (fault.Error) with a
// message for the caller.
var (
	// ErrNotReceived: the sender did not receive the message it answers
	// (or no such message exists: the two are not told apart).
	ErrNotReceived = errors.New("message not received")
	// ErrBroadcast: the answered message is a broadcast, which is one-way.
	ErrBroadcast = errors.New("broadcasts cannot be answered")
	// ErrClosed: the initiator closed the dialogue.
	ErrClosed = errors.New("dialogue closed")
	// ErrUnavailable: the registry (permissions, protocols) is unreachable.
	ErrUnavailable = errors.New("unavailable")
	// ErrUnknownProtocol: the protocol named is not known to the registry.
	ErrUnknownProtocol = errors.New("unknown protocol")
	// ErrNoRecipient: no recipient accepted the message, for mixed
	// reasons; ErrPermission, ErrUnknownAgent, ErrMailboxFull, ErrProtocol
	// and ErrRecipientClosed when all had the same one. Such errors are
	// *RefusedError values.
	ErrNoRecipient     = errors.New("no recipient accepted the message")
	ErrPermission      = errors.New("permission denied")
	ErrUnknownAgent    = errors.New("unknown agent")
	ErrMailboxFull     = mailbox.ErrFull // one sentinel with the mailboxes' own
	ErrProtocol        = errors.New("protocol error")
	ErrRecipientClosed = errors.New("closed by the recipient")
	ErrGroupNotFound   = errors.New("group not found")
)

// Reason says why a recipient did not get a message.
type Reason string

// The reasons a recipient is refused.
const (
	// ReasonPermission: the sender may not start a dialogue with it
	// (socontra.md section 2).
	ReasonPermission Reason = "permission_denied"
	// ReasonUnknownAgent: no such agent.
	ReasonUnknownAgent Reason = "unknown_agent"
	// ReasonMailboxFull: its mailbox is at its size bound.
	ReasonMailboxFull Reason = "mailbox_full"
	// ReasonClosed: it closed the dialogue, the message type or the sender.
	ReasonClosed Reason = "closed"
	// ReasonProtocol: the message breaks the protocol's state machine for
	// this pair.
	ReasonProtocol Reason = "protocol_error"
	// ReasonGroupNotFound: a group addressed does not exist or is private
	// to its members (Refusal.Group names it).
	ReasonGroupNotFound Reason = "group_not_found"
)

var reasonKinds = map[Reason]error{
	ReasonPermission:    ErrPermission,
	ReasonUnknownAgent:  ErrUnknownAgent,
	ReasonMailboxFull:   ErrMailboxFull,
	ReasonClosed:        ErrRecipientClosed,
	ReasonProtocol:      ErrProtocol,
	ReasonGroupNotFound: ErrGroupNotFound,
}

// Refusal is a recipient left out of a message, and why: an agent, or a
// whole group addressed.
type Refusal struct {
	Agent  string
	Group  string // the group's path, for a group refused whole
	Reason Reason
	Rule   string // ReasonProtocol: the state machine's rule broken
	// State and Deadline are the Violation's, for ReasonProtocol.
	State, Deadline string
	// Detail is one sentence for the sender: the rule broken, the
	// connection missing.
	Detail string
}

// RefusedError is the error of a message no recipient accepted. It
// wraps the kind shared by every refusal, else ErrNoRecipient.
type RefusedError struct {
	Refusals []Refusal
	// MessageID is the id the refused message had, which a protocol_error
	// in the sender's mailbox answers.
	MessageID string
}

func (e *RefusedError) Error() string {
	parts := make([]string, 0, len(e.Refusals))
	for _, r := range e.Refusals {
		who := r.Agent
		if who == "" {
			who = "group " + r.Group
		}
		parts = append(parts, fmt.Sprintf("%s (%s: %s)", who, r.Reason, r.Detail))
	}
	if len(parts) == 0 {
		return "the distribution list names no recipient but the sender"
	}
	return "no recipient accepted the message: " + strings.Join(parts, "; ")
}

// Unwrap returns the kind: the one reason all refusals share, else
// ErrNoRecipient.
func (e *RefusedError) Unwrap() error {
	if len(e.Refusals) == 0 {
		return ErrNoRecipient
	}
	first := e.Refusals[0].Reason
	for _, r := range e.Refusals[1:] {
		if r.Reason != first {
			return ErrNoRecipient
		}
	}
	return reasonKinds[first]
}

// Scope is how far a group address reaches in the group tree.
type Scope string

// The scopes of socontra.md section 3.
const (
	ScopeDirect    Scope = "direct"    // the group only
	ScopeLocal     Scope = "local"     // the group and its descendants
	ScopeGlobal    Scope = "global"    // the group, its descendants and its ancestors
	ScopeExclusive Scope = "exclusive" // the group and its ancestors
)

// GroupAddress is one group of a distribution list.
type GroupAddress struct {
	Path  string // owner's client id and group names: acme/travel/hotel
	Scope Scope
}

// Region filters group members by their membership's region.
type Region struct {
	Country, State, City string
}

// List is a distribution list: direct agents, groups, and a region filter
// on the groups' members.
type List struct {
	Direct  []string // clients/{c}/agents/{a}
	Groups  []GroupAddress
	Regions []Region
}

// Candidate is a recipient a Resolver found, allowed or refused; or a
// group it refused whole (Agent empty, Group set).
type Candidate struct {
	Agent   string
	Group   string
	Refused Reason // "" when the sender may start a dialogue with it
	Detail  string
}

// Resolver resolves a distribution list into recipients and checks, for
// each, whether sender may start a dialogue with it.
type Resolver interface {
	// Resolve returns the recipients of l for sender. Errors wrapping
	// ErrUnavailable are the registry's outages.
	Resolve(ctx context.Context, sender string, l List) ([]Candidate, error)
}

// Violation is a message that breaks a state machine, naming the rule.
type Violation struct {
	Rule   string // stable, UPPER_SNAKE
	Detail string // one sentence for the sender
	// State is the pair's state (the type of the last message it
	// accepted) when the rule names it; Deadline the deadline that passed
	// (or whose lapse ended the pair). Either may be "".
	State, Deadline string
}

func (v *Violation) Error() string { return v.Detail }

// Step is one message of a pair, as a state machine checks it.
type Step struct {
	Initiator string // who opened the dialogue
	Sender    string
	Receiver  string
	Type      string
	// AnsweredType is the type of the message answered; "" for an opener.
	AnsweredType string
	Body         []byte
	Time         time.Time // when the server accepted the message
}

// Accepted is what a state machine made of an accepted message.
type Accepted struct {
	State json.RawMessage // the pair's next state, to store
	Body  []byte          // the body to deliver; nil delivers it as sent
	// Deadlines are the next state's pending deadlines: their timers are
	// stored with the state, in the same transaction.
	Deadlines []Deadline
}

// Deadline is a pending deadline of a pair: name and instant.
type Deadline struct {
	Name string
	At   time.Time
}

// pairState is a pair's next state as a dialogue write of message dm
// stores it: with the timers of its pending deadlines and, when
// Options.Orders says so, its order's record, so that a crash after the
// commit cannot separate them from the message.
func (s *Service) pairState(d store.Dialogue, p store.Pair, prev json.RawMessage, a Accepted, dm store.DialogueMessage) (store.PairState, error) {
	counterpart := p.B
	if counterpart == d.Initiator {
		counterpart = p.A
	}
	out := store.PairState{Pair: p, State: a.State}
	for _, dl := range a.Deadlines {
		out.Timers = append(out.Timers, store.Timer{
			Dialogue: d.ID, Initiator: d.Initiator, Counterpart: counterpart, Protocol: d.Protocol, Name: dl.Name, At: dl.At,
		})
	}
	if s.opts.Orders != nil {
		o, err := s.opts.Orders(PairMove{
			Dialogue: d.ID, Protocol: d.Protocol, Initiator: d.Initiator, Counterpart: counterpart,
			Prev: prev, Next: a.State, MessageID: dm.ID, Type: dm.Type, Sender: dm.Sender, Time: dm.Time,
		})
		if err != nil {
			return store.PairState{}, err
		}
		out.Order = o
	}
	return out, nil
}

// Machine is a PD's state machine.
type Machine interface {
	// Step checks s against the pair's state (nil before its first
	// message). It is pure. A message that breaks a rule gets a *Violation;
	// any other error means the stored state is corrupt.
	Step(state json.RawMessage, s Step) (Accepted, error)
	// OpensOrder reports whether accepting a message of type typ forms
	// an order (or, once formed, renews its acceptance): the
	// AcceptanceGate checks those.
	OpensOrder(typ string) bool
}

// Protocols finds a PD's state machine.
type Protocols interface {
	// Machine returns the state machine of the PD hash, or nil when it
	// declares none. Errors wrap ErrUnknownProtocol or ErrUnavailable.
	Machine(ctx context.Context, hash string) (Machine, error)
}

// Message is what a sender chooses of a message.
type Message struct {
	Type          string
	Protocol      string // openers only; replies keep the dialogue's
	RecipientType string
	Body          []byte // one JSON value
	// RequestID, when set, makes a repeat of the same send return the
	// first result instead of sending again (per sender, for a day).
	RequestID string
	// ID, when set, is the id a reply is recorded under (NewID's
	// otherwise): the caller recorded something under it before sending.
	// It must be as fresh and unguessable as NewID's.
	ID string
}

// Result is what a sent message became.
type Result struct {
	DialogueID string
	MessageID  string
	Category   mailbox.Category
	Time       time.Time
	// Recipients are the agents whose mailboxes hold the message, in the
	// order resolved.
	Recipients []string
	// Refusals are the recipients left out, with their reasons.
	Refusals []Refusal
}

// View is one agent's view of a dialogue.
type View struct {
	Dialogue    store.Dialogue
	Participant store.Participant
}

// Options configures a Service. Zero values take the defaults noted.
type Options struct {
	// Protocols checks messages of dialogues with a protocol; none are
	// checked when nil.
	Protocols Protocols
	// Logger reports what cannot reach a caller; discarded when nil.
	Logger *slog.Logger
	// Now is the clock; time.Now when nil.
	Now func() time.Time
	// NewID returns a fresh unguessable id; 128 random bits, URL-safe
	// base64, when nil.
	NewID func() string
	// Orders, when set, maps a pair a message moves to the record of its
	// order (nil: none) that the message's transaction writes with it.
	Orders func(PairMove) (*store.OrderWrite, error)
	// Observer is told of the pair states each delivered message moved
	// (deadlines to arm, orders to record); nil tells no one.
	Observer Observer
	// Acceptances checks each message that would form an order before it
	// is recorded; nil lets every one through to the state machine.
	Acceptances AcceptanceGate
	// Retention is how long a dialogue is kept once its initiator closed
	// it (a broadcast: once sent); SweepDialogues then removes it. The
	// dispatcher's config owns the default (--dialogue-retention); zero
	// removes a closed dialogue at the next sweep.
	Retention time.Duration
}

// Mailboxes is what a Service needs of the mailboxes. The dialogue store
// appends a message to them in the same transaction as its record, within
// Bound; Delivered then wakes the connected recipients. Append puts the
// network's own messages (protocol_error) in a sender's mailbox.
type Mailboxes interface {
	mailbox.Appender
	Bound() mailbox.Bound
	Delivered(ds []mailbox.Delivery)
}

// Service sends the network's messages.
type Service struct {
	store    store.DialogueStore
	mail     Mailboxes
	resolver Resolver
	opts     Options
}

// New returns a Service recording dialogues in st, delivering to mail's
// mailboxes (which st must hold) and resolving distribution lists with r.
func New(st store.DialogueStore, mail Mailboxes, r Resolver, opts Options) *Service {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.NewID == nil {
		opts.NewID = NewID
	}
	return &Service{store: st, mail: mail, resolver: r, opts: opts}
}

// NewID returns a new dialogue or message id: 32 lowercase hex digits,
// the current Unix time in milliseconds (48 bits), then 80 random bits.
// The time first makes ids sort by creation, so the stores' B+trees
// keyed by them take each new record at their right edge instead of on a
// random page (a bbolt commit writes every page it touched); 80 random
// bits keep an id unguessable. Hex, not base64: an id that starts with
// "-" would read as a flag on a command line (parley reply MESSAGE_ID).
func NewID() string { return newIDAt(time.Now()) }

func newIDAt(t time.Time) string {
	var b [16]byte
	ms := uint64(t.UnixMilli()) //nolint:gosec // after 1970
	for i := range 6 {
		b[i] = byte(ms >> (8 * (5 - i)))
	}
	_, _ = rand.Read(b[6:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}

// machine returns the state machine of hash; nil when there is none to
// check.
func (s *Service) machine(ctx context.Context, hash string) (Machine, error) {
	if hash == "" || s.opts.Protocols == nil {
		return nil, nil
	}
	return s.opts.Protocols.Machine(ctx, hash)
}

// Open starts a dialogue of category cat (message for a new message,
// subscription for a broadcast, service for a service request) from
// sender to the recipients of l.
func (s *Service) Open(ctx context.Context, sender string, cat mailbox.Category, l List, m Message) (Result, error) {
	return s.once(ctx, sender, m.RequestID, func() (Result, error) { return s.open(ctx, sender, cat, l, m) })
}

func (s *Service) open(ctx context.Context, sender string, cat mailbox.Category, l List, m Message) (Result, error) {
	candidates, err := s.resolver.Resolve(ctx, sender, l)
	if err != nil {
		return Result{}, err
	}
	machine, err := s.machine(ctx, m.Protocol)
	if err != nil {
		return Result{}, err
	}
	now := s.opts.Now().UTC()
	d := store.Dialogue{ID: s.opts.NewID(), Initiator: sender, Category: string(cat), Protocol: m.Protocol, CreateTime: now}
	dm := store.DialogueMessage{ID: s.opts.NewID(), DialogueID: d.ID, Sender: sender, Type: m.Type, Time: now}
	d.Opener = dm.ID
	var (
		accepted []string
		refusals []Refusal
		pairs    []store.PairState
		body     []byte // the body as the state machine rewrote it
		seen     = map[string]bool{sender: true}
	)
	for _, c := range candidates {
		if c.Agent != "" && seen[c.Agent] {
			continue
		}
		seen[c.Agent] = true
		if c.Refused != "" {
			refusals = append(refusals, Refusal{Agent: c.Agent, Group: c.Group, Reason: c.Refused, Detail: c.Detail})
			continue
		}
		if machine != nil {
			a, err := machine.Step(nil, Step{Initiator: sender, Sender: sender, Receiver: c.Agent, Type: m.Type, Body: m.Body, Time: now})
			var v *Violation
			if errors.As(err, &v) {
				refusals = append(refusals, protocolRefusal(c.Agent, v))
				continue
			}
			if err != nil {
				return Result{}, err
			}
			ps, err := s.pairState(d, store.Pair{A: sender, B: c.Agent}, nil, a, dm)
			if err != nil {
				return Result{}, err
			}
			pairs = append(pairs, ps)
			if a.Body != nil && body == nil {
				body = a.Body
			}
		}
		accepted = append(accepted, c.Agent)
	}
	if body != nil {
		m.Body = body
	}
	msg := mailbox.Message{
		ID: dm.ID, DialogueID: d.ID, Sender: sender, Category: cat, Type: m.Type, Protocol: m.Protocol,
		RecipientType: m.RecipientType, Body: m.Body, Time: now,
	}
	if len(accepted) == 0 {
		s.protocolErrors(ctx, msg, refusals)
		return Result{}, &RefusedError{Refusals: refusals, MessageID: dm.ID}
	}
	w := store.MessageWrite{
		Message: dm, Recipients: accepted, Pairs: pairs, Mail: msg,
		// Nobody may answer a broadcast, so nobody needs a receipt.
		NoReceipts: cat == mailbox.CategorySubscription,
	}
	got, err := s.store.CreateDialogue(ctx, d, w, s.mail.Bound())
	if err != nil {
		return Result{}, err
	}
	changes := make([]pairChange, len(pairs))
	for i, p := range pairs {
		changes[i] = pairChange{pair: p.Pair, next: p.State}
	}
	return s.observe(ctx, d, msg, changes)(s.report(ctx, msg, accepted, refusals, got))
}

// Reply answers message inReplyTo as sender: to its sender, or with all
// to its sender and every recipient of it but sender.
func (s *Service) Reply(ctx context.Context, sender, inReplyTo string, all bool, m Message) (Result, error) {
	return s.once(ctx, sender, m.RequestID, func() (Result, error) { return s.reply(ctx, sender, inReplyTo, all, m) })
}

func (s *Service) reply(ctx context.Context, sender, inReplyTo string, all bool, m Message) (Result, error) {
	notReceived := fault.New(ErrNotReceived, fmt.Sprintf("%s did not receive message %q, so it cannot answer it", sender, inReplyTo))
	answered, err := s.store.GetDialogueMessage(ctx, inReplyTo)
	if errors.Is(err, store.ErrNotFound) {
		return Result{}, notReceived
	}
	if err != nil {
		return Result{}, err
	}
	d, err := s.store.GetDialogue(ctx, answered.DialogueID)
	if errors.Is(err, store.ErrNotFound) {
		return Result{}, notReceived
	}
	if err != nil {
		return Result{}, err
	}
	if d.Category == string(mailbox.CategorySubscription) {
		return Result{}, fault.New(ErrBroadcast, fmt.Sprintf("message %q is a broadcast, which cannot be answered", inReplyTo))
	}
	// Outside the transaction: it may ask the registry.
	machine, err := s.machine(ctx, d.Protocol)
	if err != nil {
		return Result{}, err
	}
	now := s.opts.Now().UTC()
	dm := store.DialogueMessage{ID: cmp.Or(m.ID, s.opts.NewID()), DialogueID: d.ID, Sender: sender, Type: m.Type, InReplyTo: inReplyTo, Time: now}
	if err := s.checkAcceptance(ctx, machine, d, answered, sender, dm.ID, m, now); err != nil {
		return Result{}, err
	}
	var (
		accepted []string
		refusals []Refusal
		changes  []pairChange
		msg      mailbox.Message
	)
	got, err := s.store.AddMessage(ctx, inReplyTo, s.mail.Bound(), func(v store.DialogueView) (store.MessageWrite, error) {
		accepted, refusals, changes = nil, nil, nil // the store may run plan more than once
		d = v.Dialogue()
		msg = mailbox.Message{
			ID: dm.ID, DialogueID: d.ID, Sender: sender, Category: mailbox.Category(d.Category), Type: m.Type, Protocol: d.Protocol,
			RecipientType: m.RecipientType, InReplyTo: inReplyTo, Body: m.Body, Time: now,
		}
		if !v.Received(sender) {
			return store.MessageWrite{}, notReceived
		}
		if d.Closed {
			return store.MessageWrite{}, fault.New(ErrClosed, fmt.Sprintf("dialogue %q was closed by its initiator", d.ID))
		}
		to := []string{v.Answered().Sender}
		if all {
			to = append(to, v.Receivers()...)
		}
		var pairs []store.PairState
		rewritten := false
		seen := map[string]bool{sender: true}
		for _, r := range to {
			if seen[r] {
				continue
			}
			seen[r] = true
			if p, ok := v.Participant(r); ok && closedTo(p, sender, m.Type) {
				refusals = append(refusals, Refusal{Agent: r, Reason: ReasonClosed, Detail: r + " closed the dialogue, this message type or this sender"})
				continue
			}
			if machine != nil {
				change, a, err := stepPair(machine, v, sender, r, m, now)
				var viol *Violation
				if errors.As(err, &viol) {
					refusals = append(refusals, protocolRefusal(r, viol))
					continue
				}
				if err != nil {
					return store.MessageWrite{}, err
				}
				ps, err := s.pairState(v.Dialogue(), change.pair, change.prev, a, dm)
				if err != nil {
					return store.MessageWrite{}, err
				}
				pairs = append(pairs, ps)
				changes = append(changes, change)
				if a.Body != nil && !rewritten {
					msg.Body, rewritten = a.Body, true // the body as the first step rewrote it
				}
			}
			accepted = append(accepted, r)
		}
		if len(accepted) == 0 {
			return store.MessageWrite{}, &RefusedError{Refusals: refusals, MessageID: dm.ID}
		}
		return store.MessageWrite{Message: dm, Recipients: accepted, Pairs: pairs, Mail: msg}, nil
	})
	if errors.Is(err, store.ErrNotFound) {
		return Result{}, notReceived
	}
	var refused *RefusedError
	if errors.As(err, &refused) {
		s.protocolErrors(ctx, msg, refused.Refusals)
	}
	if err != nil {
		return Result{}, err
	}
	return s.observe(ctx, d, msg, changes)(s.report(ctx, msg, accepted, refusals, got))
}

// stepPair checks m from sender to r against the state of their pair in
// v's dialogue: what the machine accepted, and the pair's change.
func stepPair(machine Machine, v store.DialogueView, sender, r string, m Message, now time.Time) (pairChange, Accepted, error) {
	pair := store.Pair{A: sender, B: r}
	prev := v.PairState(pair)
	a, err := machine.Step(prev, Step{
		Initiator: v.Dialogue().Initiator, Sender: sender, Receiver: r, Type: m.Type, AnsweredType: v.Answered().Type, Body: m.Body, Time: now,
	})
	return pairChange{pair: pair, next: a.State, prev: prev}, a, err
}

// closedTo reports whether p's filters keep a message of type typ from
// sender away from p.
func closedTo(p store.Participant, sender, typ string) bool {
	return p.Closed || slices.Contains(p.ClosedTypes, typ) || slices.Contains(p.ClosedAgents, sender)
}

func protocolRefusal(agent string, v *Violation) Refusal {
	detail := "the message breaks rule " + v.Rule + " of the protocol's state machine"
	if v.Detail != "" {
		detail += ": " + v.Detail
	}
	return Refusal{Agent: agent, Reason: ReasonProtocol, Detail: detail, Rule: v.Rule, State: v.State, Deadline: v.Deadline}
}

// report wakes the recipients that got msg and reports them, with the
// refusals and the recipients whose mailboxes were full.
func (s *Service) report(ctx context.Context, msg mailbox.Message, accepted []string, refusals []Refusal, got store.Delivered) (Result, error) {
	s.mail.Delivered(got.Deliveries)
	if len(got.Refused) > 0 {
		out := map[string]bool{}
		for _, f := range got.Refused {
			out[f.Agent] = true
			r := Refusal{Agent: f.Agent, Reason: ReasonMailboxFull, Detail: f.Agent + "'s mailbox is full"}
			if !errors.Is(f.Err, mailbox.ErrFull) {
				r = Refusal{Agent: f.Agent, Reason: ReasonUnknownAgent, Detail: f.Agent + " does not exist"}
			}
			refusals = append(refusals, r)
		}
		accepted = slices.DeleteFunc(slices.Clone(accepted), func(a string) bool { return out[a] })
	}
	s.protocolErrors(ctx, msg, refusals)
	if len(accepted) == 0 {
		return Result{}, &RefusedError{Refusals: refusals, MessageID: msg.ID}
	}
	return Result{DialogueID: msg.DialogueID, MessageID: msg.ID, Category: msg.Category, Time: msg.Time, Recipients: accepted, Refusals: refusals}, nil
}

// protocolErrors puts a protocol_error in the sender's mailbox for each
// recipient msg broke the state machine with. The sender also has them in
// its Result, so a failure here is logged, not returned.
func (s *Service) protocolErrors(ctx context.Context, msg mailbox.Message, refusals []Refusal) {
	for _, r := range refusals {
		if r.Reason != ReasonProtocol {
			continue
		}
		body, _ := json.Marshal(map[string]string{"recipient": r.Agent, "messageType": msg.Type, "rule": r.Rule, "error": r.Detail})
		e := mailbox.Message{
			ID: s.opts.NewID(), DialogueID: msg.DialogueID, Category: msg.Category, Type: "protocol_error",
			Protocol: msg.Protocol, InReplyTo: msg.ID, Body: body, Time: msg.Time,
		}
		if _, err := s.mail.Append(ctx, e, []string{msg.Sender}); err != nil {
			s.opts.Logger.WarnContext(ctx, "protocol_error not put in the sender's mailbox; the send result carries it", slog.String("agent", msg.Sender), slog.Any("err", err))
		}
	}
}
