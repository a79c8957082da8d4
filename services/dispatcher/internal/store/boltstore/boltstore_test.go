package boltstore_test

import (
	"testing"
	"time"

	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
	"github.com/parleyhq/parley/services/dispatcher/internal/notify"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
	"github.com/parleyhq/parley/services/dispatcher/internal/store/boltstore"
	"github.com/parleyhq/parley/services/dispatcher/internal/store/storetest"
)

func open(t *testing.T) *boltstore.Store {
	t.Helper()
	s, err := boltstore.Open(t.TempDir(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return open(t) })
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
