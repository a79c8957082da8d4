package boltstore_test

import (
	"testing"
	"time"

	"github.com/parleyhq/parley/platform/boltdb"
	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
	"github.com/parleyhq/parley/services/dispatcher/internal/notify"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
	"github.com/parleyhq/parley/services/dispatcher/internal/store/boltstore"
	"github.com/parleyhq/parley/services/dispatcher/internal/store/storetest"
)

func openWith(t *testing.T, opts boltstore.Options) *boltstore.Store {
	t.Helper()
	s, err := boltstore.OpenWith(t.TempDir(), time.Second, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// The suites run twice: with bbolt syncing each commit, and through the
// write-ahead journal (the dispatcher's default, --dispatcher-journal).
var backends = []struct {
	name string
	opts boltstore.Options
}{
	{"bbolt", boltstore.Options{}},
	{"journal", boltstore.Options{Journal: &boltdb.JournalOptions{}}},
}

func TestConformance(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			storetest.Run(t, func(t *testing.T) store.Store { return openWith(t, b.opts) })
		})
	}
}

func TestNotificationRetryConformance(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			storetest.RunNotificationRetries(t, func(t *testing.T) notify.Store { return openWith(t, b.opts) })
		})
	}
}

func TestMailboxConformance(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			storetest.RunMailboxes(t, func(t *testing.T) mailbox.Store { return openWith(t, b.opts) })
		})
	}
}

func TestDialogueConformance(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			storetest.RunDialogues(t, func(t *testing.T) storetest.DialogueBackend { return openWith(t, b.opts) })
		})
	}
}

func TestTimerConformance(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			storetest.RunTimers(t, func(t *testing.T) storetest.TimerBackend { return openWith(t, b.opts) })
		})
	}
}

func TestOrderConformance(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			storetest.RunOrders(t, func(t *testing.T) store.OrderStore { return openWith(t, b.opts) })
		})
	}
}

func TestPaymentConformance(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			storetest.RunPayments(t, func(t *testing.T) store.PaymentStore { return openWith(t, b.opts) })
		})
	}
}
