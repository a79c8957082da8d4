package server

import (
	"context"
	"strconv"
	"sync"
	"time"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/grpcerr"
	"github.com/parleyhq/parley/platform/pagetoken"
)

// outboxSignal wakes ListNotifications calls waiting for a new
// notification. Every write that may notify calls wake after it commits;
// waiters take the channel before reading the store, so a write that
// commits between their read and their wait still wakes them.
type outboxSignal struct {
	mu sync.Mutex
	ch chan struct{} // closed and replaced by wake
}

func newOutboxSignal() *outboxSignal { return &outboxSignal{ch: make(chan struct{})} }

// changed returns a channel closed by the next wake.
func (o *outboxSignal) changed() <-chan struct{} {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.ch
}

func (o *outboxSignal) wake() {
	o.mu.Lock()
	defer o.mu.Unlock()
	close(o.ch)
	o.ch = make(chan struct{})
}

// ListNotifications implements RegistryService: the dispatcher's relay
// reads the outbox after its cursor, waiting up to `wait` for a
// notification, and trims what it has relayed durably.
func (s *Server) ListNotifications(ctx context.Context, req *registryv1.ListNotificationsRequest) (*registryv1.ListNotificationsResponse, error) {
	var v grpcerr.Violations
	size, ok := pagetoken.Size(req.GetPageSize(), defaultNotificationsPage, 1000)
	if !ok {
		v.Add("page_size", "must not be negative")
	}
	wait := req.GetWait().AsDuration()
	if req.GetWait() != nil && (!req.GetWait().IsValid() || wait < 0 || wait > maxNotificationsWait*time.Second) {
		v.Add("wait", "must be between 0 and "+strconv.Itoa(maxNotificationsWait)+"s")
	}
	if err := v.Err(reasonInvalidArgument, Domain); err != nil {
		return nil, err
	}
	if t := req.GetTrimThrough(); t > 0 {
		if err := s.trimNotifications(ctx, min(t, req.GetAfter())); err != nil {
			return nil, s.toStatus(ctx, err)
		}
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		changed := s.outbox.changed()
		notes, first, err := s.store.ListNotifications(ctx, req.GetAfter(), size)
		if err != nil {
			return nil, s.toStatus(ctx, err)
		}
		if len(notes) > 0 || wait == 0 {
			return &registryv1.ListNotificationsResponse{Notifications: notes, FirstSequence: first}, nil
		}
		select {
		case <-changed:
		case <-timer.C:
			wait = 0 // one last read, then answer
		case <-ctx.Done():
			return nil, s.toStatus(ctx, ctx.Err())
		}
	}
}

// trimNotifications drops the outbox's notifications through through, in
// transactions of at most notificationsTrimBatch, so that a reader that
// trims a long backlog at once never makes one long write. It trims all of
// them: the dispatcher's relay reads on from the oldest kept after a
// restart.
func (s *Server) trimNotifications(ctx context.Context, through uint64) error {
	for {
		n, err := s.store.TrimNotifications(ctx, through, notificationsTrimBatch)
		if err != nil || n < notificationsTrimBatch {
			return err
		}
	}
}
