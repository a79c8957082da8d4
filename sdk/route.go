package sdk

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Category is a network message's dialogue kind, set by the server.
type Category string

// The categories of the network.
const (
	CategoryMessage       Category = "message"
	CategorySubscription  Category = "subscription"
	CategoryService       Category = "service"
	CategoryNotifications Category = "notifications"
)

// The message types the network itself routes on.
const (
	// TypeProtocolError is a message breaking a protocol (from the network
	// or a peer), and the route for messages of a protocol no handler takes.
	TypeProtocolError = "protocol_error"
	// TypeGeneralError is the last route: messages nothing else takes.
	TypeGeneralError = "general_error"
)

// Message is a network message as its recipient receives it.
type Message struct {
	ID            string
	DialogueID    string
	Sender        string // clients/{c}/agents/{a}; "" when the network sent it
	Recipient     string // the receiving agent
	Category      Category
	Type          string
	Protocol      string // a PD's SHA-1, 40 hex; "" for none
	RecipientType string
	Body          json.RawMessage
	InReplyTo     string // the message this one answers; "" for an opener
	Time          time.Time
	Cursor        uint64 // the position in the recipient's mailbox
}

// RouteKey selects the handler of a received message: its type, category,
// protocol and recipient type. Agent "" makes the key generic, for every
// agent sharing the Router; an agent's own key (Agent set to its name) wins
// over the generic one. Routes for TypeProtocolError and TypeGeneralError
// match on Type (and Agent) alone.
type RouteKey struct {
	Agent         string
	Type          string
	Category      Category
	Protocol      string
	RecipientType string
}

// HandlerFunc handles one received message. A non-nil value is queued for
// Expect under the route's name; an error is reported to the agent's
// OnError.
type HandlerFunc func(ctx context.Context, m Message) (any, error)

// Errors of routing.
var (
	// ErrDuplicateRoute: a key is registered once.
	ErrDuplicateRoute = errors.New("route already registered")
	// ErrNoRoute: no handler takes the message (it is dropped).
	ErrNoRoute = errors.New("no route for the message")
)

type route struct {
	name string
	h    HandlerFunc
}

// Router maps route keys to handlers. Several agents may share one: it
// holds no per-agent state. Register routes before the agents run.
type Router struct {
	mu      sync.RWMutex // guards routes and ignored
	routes  map[RouteKey]route
	ignored map[string]bool // protocols whose messages without a route are dropped
}

// NewRouter returns an empty Router.
func NewRouter() *Router {
	return &Router{routes: map[RouteKey]route{}, ignored: map[string]bool{}}
}

// Handle registers h under key, named name for Expect. A key already
// registered, an empty name or a nil handler is an error.
func (r *Router) Handle(key RouteKey, name string, h HandlerFunc) error {
	switch {
	case h == nil:
		return errors.New("route handler is nil")
	case name == "":
		return errors.New("route name is empty")
	case key.Type == "":
		return errors.New("route key has no message type")
	}
	if key.Type == TypeProtocolError || key.Type == TypeGeneralError {
		key = RouteKey{Agent: key.Agent, Type: key.Type}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.routes[key]; ok {
		return fmt.Errorf("%+v: %w", key, ErrDuplicateRoute)
	}
	r.routes[key] = route{name: name, h: h}
	return nil
}

// IgnoreMissingRoutes drops messages of protocol that no route (not even a
// protocol_error route) takes, instead of handing them to general_error.
func (r *Router) IgnoreMissingRoutes(protocol string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ignored[protocol] = true
}

// lookup finds m's route, in the order of socontra.md section 7: the
// agent's key, the generic key, protocol_error (agent, generic) for a
// protocol_error message or one of a protocol, a protocol whose missing
// routes are ignored (dropped), then general_error (agent, generic).
func (r *Router) lookup(m Message) (route, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	key := RouteKey{Agent: m.Recipient, Type: m.Type, Category: m.Category, Protocol: m.Protocol, RecipientType: m.RecipientType}
	if rt, ok := r.routes[key]; ok {
		return rt, true
	}
	key.Agent = ""
	if rt, ok := r.routes[key]; ok {
		return rt, true
	}
	if m.Type == TypeProtocolError || m.Protocol != "" {
		for _, agent := range []string{m.Recipient, ""} {
			if rt, ok := r.routes[RouteKey{Agent: agent, Type: TypeProtocolError}]; ok {
				return rt, true
			}
		}
	}
	if m.Protocol != "" && r.ignored[m.Protocol] {
		return route{}, false
	}
	for _, agent := range []string{m.Recipient, ""} {
		if rt, ok := r.routes[RouteKey{Agent: agent, Type: TypeGeneralError}]; ok {
			return rt, true
		}
	}
	return route{}, false
}
