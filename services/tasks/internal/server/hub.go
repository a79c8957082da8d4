package server

import (
	"errors"
	"sync"

	"google.golang.org/protobuf/proto"

	tasksv1 "github.com/parleyhq/parley/gen/parley/tasks/v1"
)

// subscriberBuffer is how many updates a subscriber may lag behind before
// it is dropped (its channel closed), so a slow reader never blocks steps.
const subscriberBuffer = 64

var errTooManySubscribers = errors.New("too many subscribers")

// hub fans step updates out to the subscribers of each task.
type hub struct {
	max int

	mu   sync.Mutex // guards n and subs
	n    int
	subs map[string]map[*subscriber]struct{} // by task id
}

type subscriber struct {
	ch     chan *tasksv1.Step
	closed bool // guarded by hub.mu
}

func newHub(maxSubscribers int) *hub {
	return &hub{max: maxSubscribers, subs: map[string]map[*subscriber]struct{}{}}
}

func (h *hub) subscribe(taskID string) (*subscriber, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n >= h.max {
		return nil, errTooManySubscribers
	}
	sub := &subscriber{ch: make(chan *tasksv1.Step, subscriberBuffer)}
	if h.subs[taskID] == nil {
		h.subs[taskID] = map[*subscriber]struct{}{}
	}
	h.subs[taskID][sub] = struct{}{}
	h.n++
	return sub, nil
}

// unsubscribe removes sub and closes its channel; it is idempotent.
func (h *hub) unsubscribe(taskID string, sub *subscriber) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.removeLocked(taskID, sub)
}

func (h *hub) removeLocked(taskID string, sub *subscriber) {
	if sub.closed {
		return
	}
	sub.closed = true
	close(sub.ch)
	delete(h.subs[taskID], sub)
	if len(h.subs[taskID]) == 0 {
		delete(h.subs, taskID)
	}
	h.n--
}

// watched reports whether the task has subscribers, so callers can skip
// building updates nobody reads.
func (h *hub) watched(taskID string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.subs[taskID]) > 0
}

// publish sends a copy of st to the task's subscribers without blocking.
func (h *hub) publish(taskID string, st *tasksv1.Step) {
	h.mu.Lock()
	defer h.mu.Unlock()
	subs := h.subs[taskID]
	if len(subs) == 0 {
		return
	}
	c := proto.CloneOf(st)
	for sub := range subs {
		select {
		case sub.ch <- c:
		default:
			h.removeLocked(taskID, sub)
		}
	}
}
