// Package mailbox is the network's durable delivery: one mailbox per agent,
// each a sequence of message references with an acknowledged cursor.
//
// A message's body is stored once, however many recipients it has; each
// recipient's mailbox holds its own cursor-ordered reference to it. Append
// returns only after every accepting recipient's mailbox holds the message
// durably (the commit is synced). Delivery is at least once, in cursor order;
// message ids let receivers drop redeliveries.
//
// The package is plain Go: the gRPC stream and the SSE route that read
// mailboxes live in internal/server, and storage sits behind Store.
package mailbox

import (
	"context"
	"errors"
	"time"
)

// Category is a dialogue's kind. The server sets it from the operation used.
type Category string

// The categories of the network (socontra.md section 4).
const (
	CategoryMessage       Category = "message"
	CategorySubscription  Category = "subscription"
	CategoryService       Category = "service"
	CategoryNotifications Category = "notifications"
)

// Message is one message as stored and delivered. Everything except Type,
// Protocol, RecipientType and Body is set by the server.
type Message struct {
	ID            string    `json:"id"`
	DialogueID    string    `json:"dialogueId"`
	Sender        string    `json:"sender,omitempty"` // clients/{c}/agents/{a}; "" for the network
	Category      Category  `json:"category"`
	Type          string    `json:"type"`
	Protocol      string    `json:"protocol,omitempty"` // PD SHA-1, 40 hex
	RecipientType string    `json:"recipientType,omitempty"`
	InReplyTo     string    `json:"inReplyTo,omitempty"`
	Body          []byte    `json:"body"` // one JSON value
	Time          time.Time `json:"time"`
}

// Delivery is a message in one recipient's mailbox.
type Delivery struct {
	Agent   string // the recipient, clients/{c}/agents/{a}
	Cursor  uint64 // the recipient's sequence number, strictly increasing
	Message Message
}

// Refusal names a recipient whose mailbox did not take a message, and why.
type Refusal struct {
	Agent string
	Err   error // ErrFull, or a *resource.Error for an unknown agent
}

// ErrFull is returned when the recipient's mailbox is at its size bound; the message was not
// appended for that recipient.
var ErrFull = errors.New("mailbox full")

// Appender is what senders (dialogues, notifications, service transactions)
// need from the mailboxes.
type Appender interface {
	// Append stores m once and appends a reference to it to each recipient's
	// mailbox. It returns after the commit is durable. Recipients whose
	// mailbox is full are returned as refusals and get nothing; the others
	// all get the message, or none does and err is set.
	Append(ctx context.Context, m Message, recipients []string) ([]Refusal, error)
}
