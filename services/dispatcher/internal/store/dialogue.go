package store

import (
	"context"
	"encoding/json"
	"time"

	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
)

// Dialogue is a dialogue of the agent network: opened by one message,
// extended by replies, each answering an earlier message of it.
type Dialogue struct {
	ID        string `json:"id"`
	Initiator string `json:"initiator"` // clients/{c}/agents/{a}, who sent the opener
	// Category is message, subscription or service (mailbox.Category).
	Category string `json:"category"`
	// Protocol is the PD's SHA-1 (40 hex), or "" for none.
	Protocol   string    `json:"protocol,omitempty"`
	CreateTime time.Time `json:"createTime"`
	// Opener is the id of the message that opened it; "" in dialogues
	// stored before it was kept.
	Opener string `json:"opener,omitempty"`
	// Closed is set when the initiator closed the dialogue for everyone,
	// at CloseTime. A closed dialogue is removed (SweepDialogues) once it
	// has been closed for the retention; so is a broadcast, which nobody
	// can answer, counted from its CreateTime.
	Closed    bool      `json:"closed,omitempty"`
	CloseTime time.Time `json:"closeTime,omitzero"`
}

// DialogueMessage is what the dispatcher keeps of one message of a
// dialogue to check replies to it. The body is the mailboxes'.
type DialogueMessage struct {
	ID         string    `json:"id"`
	DialogueID string    `json:"dialogueId"`
	Sender     string    `json:"sender"`
	Type       string    `json:"type"`
	InReplyTo  string    `json:"inReplyTo,omitempty"` // "" for the opener
	Time       time.Time `json:"time"`
}

// Participant is one agent's standing in a dialogue: the filters it set
// with the close operations. Every sender and receiver of a two-way
// dialogue is a participant; receivers of a broadcast are not.
type Participant struct {
	Agent string `json:"agent"`
	// Closed: the agent closed the dialogue for itself and receives nothing
	// more in it.
	Closed bool `json:"closed,omitempty"`
	// ClosedTypes are message types the agent no longer receives here.
	ClosedTypes []string `json:"closedTypes,omitempty"`
	// ClosedAgents are counterparts the agent no longer receives from here.
	ClosedAgents []string `json:"closedAgents,omitempty"`
}

// Pair names the two agents of a (dialogue, counterpart) pair, in either
// order: a pair's state is the same whichever of the two sends.
type Pair struct {
	A, B string
}

// Key returns the pair with its agents in sorted order, the form stores
// key it by.
func (p Pair) Key() Pair {
	if p.B < p.A {
		return Pair{A: p.B, B: p.A}
	}
	return p
}

// PairState is the protocol-control state of one pair, opaque bytes owned
// by the protocol engine (protocolcontrol's binary form; JSON before it).
type PairState struct {
	Pair  Pair
	State json.RawMessage
	// Timers are the pending deadlines of State, stored with it (each
	// replacing the pair's timer of its name, as TimerStore.PutTimers
	// does), so that no crash separates a deadline from its timer.
	Timers []Timer
	// Order, when set, is recorded with the state (OrderStore.RecordOrder,
	// in the same transaction).
	Order *OrderWrite
}

// MessageWrite is what a dialogue write stores: the message, the agents it
// goes to and the pair states it moves, and the message as their mailboxes
// get it. The record and the mailbox append are one transaction, so they
// never disagree and one commit makes both durable.
type MessageWrite struct {
	Message    DialogueMessage
	Recipients []string // distinct
	Pairs      []PairState
	// Mail is the message as delivered (its ID and DialogueID are
	// Message's). Each recipient's mailbox gets it, within the bound; the
	// body is stored once.
	Mail mailbox.Message
	// NoReceipts is set for a broadcast: its recipients get the message in
	// their mailboxes but no receipt, and become no participants, since
	// nobody may answer it.
	NoReceipts bool
}

// Delivered is what the mailbox half of a write did. A recipient whose
// mailbox was full got nothing: no mailbox entry, no receipt, and no pair
// state with it was written. When every recipient was refused, nothing at
// all was written.
type Delivered struct {
	Deliveries []mailbox.Delivery // one per recipient whose mailbox took it
	Refused    []mailbox.Refusal
}

// DialogueView is a dialogue as one transaction of AddMessage sees it,
// around the message being answered.
type DialogueView interface {
	// Dialogue is the dialogue of the answered message.
	Dialogue() Dialogue
	// Answered is the message being answered.
	Answered() DialogueMessage
	// Received reports whether agent received the answered message.
	Received(agent string) bool
	// Receivers lists the agents that received the answered message, in
	// name order.
	Receivers() []string
	// Participant returns agent's record in the dialogue, and whether it
	// is one.
	Participant(agent string) (Participant, bool)
	// PairState returns the pair's protocol state; nil when it has none.
	PairState(p Pair) json.RawMessage
}

// Request is a send made with a request_id (AIP-155): pending while it
// runs, then done with its result, which a repeat gets instead of sending
// again.
type Request struct {
	Sender string          `json:"sender"`
	ID     string          `json:"id"`
	Time   time.Time       `json:"time"` // when it started
	Done   bool            `json:"done,omitempty"`
	Result json.RawMessage `json:"result,omitempty"` // the core's, opaque here
}

// DialogueStore keeps the network's dialogues: who took part, who received
// which message, the close filters, and per-pair protocol state. Every
// method checks ctx first.
type DialogueStore interface {
	// CreateDialogue stores a new dialogue d with its opener w.Message and
	// appends w.Mail to the recipients' mailboxes (bounded by bound), in one
	// transaction. Unless w.NoReceipts, each recipient that got the message
	// gets a receipt of it and, with the sender, becomes a participant.
	// w.Pairs are the pairs' first protocol states. ErrAlreadyExists when
	// d.ID or the message id is taken.
	CreateDialogue(ctx context.Context, d Dialogue, w MessageWrite, bound mailbox.Bound) (Delivered, error)
	// AddMessage answers the message answered in one transaction: plan
	// sees the dialogue around it and returns what to write, which is
	// written as CreateDialogue writes an opener (the message joins the
	// answered one's dialogue). The new message's sender and recipients
	// become participants. If plan fails, nothing is written and its error
	// is returned as is. ErrNotFound when answered is unknown.
	AddMessage(ctx context.Context, answered string, bound mailbox.Bound, plan func(DialogueView) (MessageWrite, error)) (Delivered, error)
	// GetDialogueMessage returns a stored message; ErrNotFound when absent.
	GetDialogueMessage(ctx context.Context, id string) (DialogueMessage, error)
	// GetDialogue returns a dialogue; ErrNotFound when absent.
	GetDialogue(ctx context.Context, id string) (Dialogue, error)
	// UpdateParticipant applies mutate to the dialogue and agent's record
	// in it in one transaction, and returns both as written. ErrNotFound
	// when the dialogue is unknown or agent takes no part in it (the error
	// does not say which). If mutate fails, nothing is written.
	UpdateParticipant(ctx context.Context, dialogue, agent string, mutate func(*Dialogue, *Participant) error) (Dialogue, Participant, error)
	// UpdateAgentDialogues applies mutate to each dialogue agent takes part
	// in that is open for it (neither closed for all nor by it), in one
	// transaction, and returns how many it changed (mutate reports that).
	UpdateAgentDialogues(ctx context.Context, agent string, mutate func(*Dialogue, *Participant) (bool, error)) (int, error)

	// SweepDialogues removes up to limit dialogues closed before before
	// (by CloseTime; a subscription dialogue by its CreateTime), each with
	// all that is kept of it: its messages, receipts, participants, pair
	// states and offer terms (PaymentStore.SetOfferTerms). It returns how many it removed; fewer than limit means none
	// is left. The mailboxes keep their own copies, which compaction
	// removes.
	SweepDialogues(ctx context.Context, before time.Time, limit int) (int, error)

	// BeginRequest records request (sender, id) as pending, started at
	// now, unless it is recorded: then it returns the record and true. A
	// pending record started before stale is taken over (its send died
	// with its process) as if absent.
	BeginRequest(ctx context.Context, sender, id string, now, stale time.Time) (Request, bool, error)
	// FinishRequest marks the request done with result; a nil result
	// forgets the request, so that a repeat runs again.
	FinishRequest(ctx context.Context, sender, id string, result json.RawMessage) error
	// SweepRequests removes at most limit of the requests started before
	// before, the oldest first, in one transaction, and returns how many
	// it removed: fewer than limit when no more are due (or being changed,
	// as in SweepConversations). It reads only what it removes.
	SweepRequests(ctx context.Context, before time.Time, limit int) (int, error)
}
