package storetest

import (
	"bytes"
	"testing"
	"time"

	"github.com/parleyhq/parley/services/dispatcher/internal/notify"
)

// RunNotificationRetries runs the conformance suite of the notifications
// waiting for a retry; open returns a new empty store.
func RunNotificationRetries(t *testing.T, open func(t *testing.T) notify.Store) {
	t.Run("put, replace, list in order, delete", func(t *testing.T) { testNotificationRetries(t, open(t)) })
}

func testNotificationRetries(t *testing.T, s notify.Store) {
	ctx := t.Context()
	if got, err := s.NotificationRetries(ctx); err != nil || len(got) != 0 {
		t.Fatalf("NotificationRetries(empty) = %v, %v; want none", got, err)
	}
	w := func(seq uint64, body string, next time.Duration) notify.Waiting {
		return notify.Waiting{Sequence: seq, Notification: []byte(body), First: t0, Next: t0.Add(next), Backoff: 2 * next}
	}
	// Sequences list in numeric order, across byte boundaries too.
	for _, x := range []notify.Waiting{w(300, "c", time.Minute), w(2, "a", time.Second), w(1<<40+1, "d", time.Hour), w(7, "b", time.Second)} {
		if err := s.PutNotificationRetry(ctx, x); err != nil {
			t.Fatalf("PutNotificationRetry(%d) = %v", x.Sequence, err)
		}
	}
	// Replacing keeps one per sequence, with the new schedule.
	if err := s.PutNotificationRetry(ctx, w(7, "b", 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteNotificationRetry(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteNotificationRetry(ctx, 99); err != nil {
		t.Errorf("DeleteNotificationRetry(absent) = %v, want nil", err)
	}
	got, err := s.NotificationRetries(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []notify.Waiting{w(7, "b", 30*time.Second), w(300, "c", time.Minute), w(1<<40+1, "d", time.Hour)}
	if len(got) != len(want) {
		t.Fatalf("NotificationRetries = %+v, want %+v", got, want)
	}
	for i := range want {
		g := got[i]
		if g.Sequence != want[i].Sequence || !bytes.Equal(g.Notification, want[i].Notification) ||
			!g.First.Equal(want[i].First) || !g.Next.Equal(want[i].Next) || g.Backoff != want[i].Backoff {
			t.Errorf("NotificationRetries[%d] = %+v, want %+v", i, g, want[i])
		}
	}
}
