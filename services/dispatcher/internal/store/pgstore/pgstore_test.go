package pgstore_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/parleyhq/parley/platform/pgdb/pgdbtest"
	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
	"github.com/parleyhq/parley/services/dispatcher/internal/notify"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
	"github.com/parleyhq/parley/services/dispatcher/internal/store/pgstore"
	"github.com/parleyhq/parley/services/dispatcher/internal/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return open(t) })
}

// TestCreateConversation_perPeerCapHoldsAcrossReplicas opens two stores on
// one schema, as two replicas would, and races conversations of one peer
// through both: exactly the cap's worth are created.
func TestCreateConversation_perPeerCapHoldsAcrossReplicas(t *testing.T) {
	url, schema := pgdbtest.Schema(t)
	var replicas [2]*pgstore.Store
	for i := range replicas {
		s, err := pgstore.Open(t.Context(), url, schema, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		replicas[i] = s
	}
	const maxPerPeer, tries = 3, 64
	now := time.Unix(1_800_000_000, 0)
	var wg sync.WaitGroup
	errs := make(chan error, tries)
	for i := range tries {
		wg.Go(func() {
			c := store.Conversation{ID: fmt.Sprintf("c%02d", i), Agent: "clients/c/agents/a", Peer: "https://peer.example", CreateTime: now, ExpireTime: now.Add(time.Hour)}
			errs <- replicas[i%2].CreateConversation(t.Context(), c, maxPerPeer, now)
		})
	}
	wg.Wait()
	close(errs)
	created := 0
	for err := range errs {
		switch {
		case err == nil:
			created++
		case !errors.Is(err, store.ErrLimit):
			t.Errorf("CreateConversation = %v, want nil or ErrLimit", err)
		}
	}
	if created != maxPerPeer {
		t.Errorf("%d conversations created through two replicas, want the cap, %d", created, maxPerPeer)
	}
}

// open opens a store in a fresh schema of the test server.
func open(t *testing.T) *pgstore.Store {
	t.Helper()
	url, schema := pgdbtest.Schema(t)
	s, err := pgstore.Open(t.Context(), url, schema, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestNotificationRetryConformance(t *testing.T) {
	storetest.RunNotificationRetries(t, func(t *testing.T) notify.Store { return open(t) })
}

func TestMailboxConformance(t *testing.T) {
	storetest.RunMailboxes(t, func(t *testing.T) mailbox.Store { return open(t) })
}

func TestDialogueConformance(t *testing.T) {
	storetest.RunDialogues(t, func(t *testing.T) storetest.DialogueBackend { return open(t) })
}

func TestTimerConformance(t *testing.T) {
	storetest.RunTimers(t, func(t *testing.T) storetest.TimerBackend { return open(t) })
}

func TestOrderConformance(t *testing.T) {
	storetest.RunOrders(t, func(t *testing.T) store.OrderStore { return open(t) })
}

func TestPaymentConformance(t *testing.T) {
	storetest.RunPayments(t, func(t *testing.T) store.PaymentStore { return open(t) })
}
