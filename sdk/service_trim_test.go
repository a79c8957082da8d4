package sdk

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
)

// trimAgent is a ServiceAgent whose supplier stages and Fallback record
// the ids of the messages they get; bound is its supplier dialogue bound.
type trimAgent struct {
	*ServiceAgent
	mu       sync.Mutex
	staged   []string
	fellBack []string
	reported []error
}

func newTrimAgent(t *testing.T, bound int) *trimAgent {
	t.Helper()
	a := &trimAgent{}
	na := &NetworkAgent{opts: NetworkOptions{OnError: func(err error) {
		a.mu.Lock()
		defer a.mu.Unlock()
		a.reported = append(a.reported, err)
	}}}
	a.ServiceAgent = newServiceAgent(na, nil, func(_ context.Context, m Message) (any, error) {
		a.mu.Lock()
		defer a.mu.Unlock()
		a.fellBack = append(a.fellBack, m.ID)
		return nil, nil
	})
	a.supplying.max = bound
	for _, typ := range []string{"new_task_request", "invite_offer", "accept_offer", "reject_offer", "reject_proposal", "task_withdrawn",
		"cancel_order", "request_message", "confirm_success", "confirm_fail", "offer_timeout_expired", "protocol_error"} {
		a.Supply(typ, func(_ context.Context, m Message, _ Responder) error {
			a.mu.Lock()
			defer a.mu.Unlock()
			a.staged = append(a.staged, m.ID)
			return nil
		})
	}
	return a
}

// receive routes a message of dialogue d; an opener when typ is
// new_task_request.
func (a *trimAgent) receive(t *testing.T, id, d, typ string) {
	t.Helper()
	m := Message{ID: id, DialogueID: d, Sender: "clients/c/agents/consumer", Category: CategoryService, Type: typ, InReplyTo: "earlier"}
	switch typ {
	case "new_task_request":
		m.InReplyTo = ""
	case "offer_timeout_expired":
		m.Sender = "" // the network
	}
	if _, err := a.route(t.Context(), m); err != nil {
		t.Fatalf("route(%s) = %v", id, err)
	}
}

// A supplier's dialogue is kept while its pair may still bring it
// messages, and forgotten at the pair's end as the supplier sees it: a
// message received that ends it, or an accepted reply that ends it.
func TestServiceAgent_supplierDialogueEndsWithItsPair(t *testing.T) {
	type step struct {
		recv string // a message type received
		sent string // or a reply type the network accepted
	}
	tests := []struct {
		name  string
		steps []step
		kept  bool // still a supplier dialogue after the steps
	}{
		{"request only", []step{{recv: "new_task_request"}}, true},
		{"reject_task sent", []step{{recv: "new_task_request"}, {sent: "reject_task"}}, false},
		{"proposal sent", []step{{recv: "new_task_request"}, {sent: "proposal"}}, true},
		{"reject_proposal received", []step{{recv: "new_task_request"}, {sent: "proposal"}, {recv: "reject_proposal"}}, false},
		{"reject_invite_offer sent", []step{{recv: "new_task_request"}, {sent: "proposal"}, {recv: "invite_offer"}, {sent: "reject_invite_offer"}}, false},
		{"revoke_offer sent", []step{{recv: "new_task_request"}, {sent: "proposal"}, {recv: "invite_offer"}, {sent: "offer"}, {sent: "revoke_offer"}}, false},
		{"reject_offer received", []step{{recv: "new_task_request"}, {sent: "offer"}, {recv: "reject_offer"}}, false},
		{"task_withdrawn received", []step{{recv: "new_task_request"}, {sent: "offer"}, {recv: "task_withdrawn"}}, false},
		{"expiry received", []step{{recv: "new_task_request"}, {sent: "offer"}, {recv: "offer_timeout_expired"}}, false},
		{"order phase", []step{{recv: "new_task_request"}, {sent: "offer"}, {recv: "accept_offer"}, {recv: "request_message"}, {sent: "request_message"}}, true},
		{"order_complete sent, not yet confirmed", []step{{recv: "new_task_request"}, {sent: "offer"}, {recv: "accept_offer"}, {sent: "order_complete"}}, true},
		{"confirm_success received", []step{{recv: "new_task_request"}, {sent: "offer"}, {recv: "accept_offer"}, {sent: "order_complete"}, {recv: "confirm_success"}}, false},
		{"confirm_fail received", []step{{recv: "new_task_request"}, {sent: "offer"}, {recv: "accept_offer"}, {sent: "order_complete"}, {recv: "confirm_fail"}}, false},
		{"order_failed sent", []step{{recv: "new_task_request"}, {sent: "offer"}, {recv: "accept_offer"}, {sent: "order_failed"}}, false},
		{"cancel_order received", []step{{recv: "new_task_request"}, {sent: "offer"}, {recv: "accept_offer"}, {recv: "cancel_order"}}, false},
		{"cancel_order sent", []step{{recv: "new_task_request"}, {sent: "offer"}, {recv: "accept_offer"}, {sent: "cancel_order"}}, false},
		// delegate: the supplier forms the order itself, and its
		// order_complete ends the pair (no confirm follows).
		{"delegate accept_offer sent", []step{{recv: "new_task_request"}, {sent: "accept_offer"}}, true},
		{"delegate order_complete sent", []step{{recv: "new_task_request"}, {sent: "accept_offer"}, {sent: "order_complete"}}, false},
		{"delegate reject_offer sent", []step{{recv: "new_task_request"}, {sent: "reject_offer"}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newTrimAgent(t, maxSupplying)
			for i, s := range tt.steps {
				if s.recv != "" {
					a.receive(t, fmt.Sprintf("m%d", i), "d", s.recv)
					continue
				}
				a.replied("d", s.sent)
			}
			if got, want := a.SupplierDialogues(), map[bool]int{true: 1, false: 0}[tt.kept]; got != want {
				t.Errorf("SupplierDialogues() after %v = %d, want %d", tt.steps, got, want)
			}
			a.mu.Lock()
			defer a.mu.Unlock()
			if len(a.fellBack) > 0 {
				t.Errorf("Fallback got %v, want every message staged", a.fellBack)
			}
		})
	}
}

// A reply to another agent's dialogue, or to a consumer dialogue, changes
// no supplier dialogue.
func TestServiceAgent_repliesElsewhereKeepSupplierDialogues(t *testing.T) {
	a := newTrimAgent(t, maxSupplying)
	a.receive(t, "m1", "d", "new_task_request")
	a.replied("other", "reject_task")
	a.replied("", "reject_task")
	if got := a.SupplierDialogues(); got != 1 {
		t.Errorf("SupplierDialogues() = %d, want 1", got)
	}
}

// Above the bound the least recently active supplier dialogue is
// forgotten; its later messages go to the Fallback, like any message the
// agent does not place.
func TestServiceAgent_supplierDialoguesAreBounded(t *testing.T) {
	a := newTrimAgent(t, 2)
	a.receive(t, "a1", "a", "new_task_request")
	a.receive(t, "b1", "b", "new_task_request")
	a.receive(t, "a2", "a", "invite_offer") // a is now the more recent
	a.receive(t, "c1", "c", "new_task_request")
	if got := a.SupplierDialogues(); got != 2 {
		t.Fatalf("SupplierDialogues() = %d, want the bound, 2", got)
	}
	a.receive(t, "b2", "b", "invite_offer")
	a.receive(t, "a3", "a", "accept_offer")
	a.receive(t, "c2", "c", "invite_offer")
	a.mu.Lock()
	defer a.mu.Unlock()
	if want := []string{"a1", "b1", "a2", "c1", "a3", "c2"}; !slices.Equal(a.staged, want) {
		t.Errorf("staged %v, want %v", a.staged, want)
	}
	if want := []string{"b2"}; !slices.Equal(a.fellBack, want) {
		t.Errorf("Fallback got %v, want %v (b was the least recently active)", a.fellBack, want)
	}
}

// A service message of a dialogue the agent neither supplies nor
// consumes is held only while a NewRequest is in flight (it may be an
// early answer to it): otherwise it goes to the Fallback. What no call
// claims is dropped, and reported, when the last call returns.
func TestServiceAgent_unplacedServiceMessagesGoToTheFallback(t *testing.T) {
	a := newTrimAgent(t, maxSupplying)
	a.receive(t, "x1", "x", "cancel_order") // a dialogue forgotten, or never known
	a.mu.Lock()
	if want := []string{"x1"}; !slices.Equal(a.fellBack, want) {
		t.Errorf("Fallback got %v, want %v", a.fellBack, want)
	}
	a.mu.Unlock()

	a.requesting()
	a.requesting()
	a.receive(t, "p1", "p", "offer")
	a.receive(t, "y1", "y", "cancel_order")
	q := a.open("p")
	if m, ok := q.takeFunc(func(Message) bool { return true }); !ok || m.ID != "p1" {
		t.Errorf("open(p) queue holds %v, %v; want p1, held for it", m.ID, ok)
	}
	a.mu.Lock()
	if len(a.fellBack) != 1 || len(a.reported) != 0 {
		t.Errorf("with a request still in flight: Fallback got %v, reported %v; want y1 still held", a.fellBack, a.reported)
	}
	a.mu.Unlock()
	a.requested()
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.reported) != 1 || !errors.Is(a.reported[0], ErrNoRoute) {
		t.Errorf("after the last request: reported %v, want y1's ErrNoRoute", a.reported)
	}
	if n := len(a.orphans); n != 0 {
		t.Errorf("%d dialogues' messages still held, want none", n)
	}
}
