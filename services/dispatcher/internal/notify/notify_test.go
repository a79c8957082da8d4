package notify_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/timestamppb"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
	"github.com/parleyhq/parley/services/dispatcher/internal/notify"
	"github.com/parleyhq/parley/services/dispatcher/internal/store/boltstore"
)

const (
	alice = "clients/acme/agents/alice"
	bob   = "clients/beta/agents/bob"
)

// fakeOutbox is the registry's outbox as ListNotifications serves it:
// notifications after a sequence, trimmed through trim_through, a poll on
// an empty tail waiting until one is added or the call ends. intercept,
// when set, may answer a call first.
type fakeOutbox struct {
	mu        sync.Mutex
	notes     []*registryv1.Notification
	next      uint64
	added     chan struct{} // closed and replaced by add
	intercept func(after uint64) error
}

func newFakeOutbox() *fakeOutbox { return &fakeOutbox{added: make(chan struct{})} }

func (f *fakeOutbox) add(typ, recipient string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.next++
	f.notes = append(f.notes, &registryv1.Notification{
		Sequence: f.next, Id: "ntf-" + string(rune('a'+f.next)), Type: typ, Recipient: recipient, Agent: alice,
		Group: "acme/travel", CreateTime: timestamppb.New(time.Unix(1700000000, 0)),
	})
	close(f.added)
	f.added = make(chan struct{})
}

func (f *fakeOutbox) kept() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.notes)
}

func (f *fakeOutbox) Notifications(ctx context.Context, after, trimThrough uint64, limit int, wait time.Duration) ([]*registryv1.Notification, uint64, error) {
	timeout := time.After(wait)
	f.mu.Lock()
	intercept := f.intercept
	f.mu.Unlock()
	if intercept != nil {
		if err := intercept(after); err != nil {
			return nil, 0, err
		}
	}
	for {
		f.mu.Lock()
		f.notes = slices.DeleteFunc(f.notes, func(n *registryv1.Notification) bool {
			return n.GetSequence() <= min(trimThrough, after)
		})
		var (
			out   []*registryv1.Notification
			first uint64
		)
		if len(f.notes) > 0 {
			first = f.notes[0].GetSequence()
		}
		for _, n := range f.notes {
			if n.GetSequence() > after && len(out) < limit {
				out = append(out, n)
			}
		}
		added := f.added
		f.mu.Unlock()
		if len(out) > 0 {
			return out, first, nil
		}
		select {
		case <-added:
		case <-timeout:
			return nil, first, nil
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		}
	}
}

// newMailboxes returns mailboxes bounded by bound over a new bbolt file,
// and the store, which also keeps the relay's waiting notifications.
func newMailboxes(t *testing.T, bound mailbox.Bound) (*mailbox.Mailboxes, *boltstore.Store) {
	t.Helper()
	return openMailboxes(t, t.TempDir(), bound)
}

// openMailboxes opens the bbolt file in dir, as a restarted dispatcher
// does.
func openMailboxes(t *testing.T, dir string, bound mailbox.Bound) (*mailbox.Mailboxes, *boltstore.Store) {
	t.Helper()
	s, err := boltstore.Open(dir, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return mailbox.New(s, mailbox.Options{Bound: bound}), s
}

// start runs a relay until the test ends or stop is called.
func start(t *testing.T, src notify.Source, mb mailbox.Appender, st notify.Store) (stop func()) {
	t.Helper()
	return startWith(t, src, mb, st, notify.Options{})
}

// startWith runs a relay with opts, retrying within milliseconds unless
// opts says otherwise, until the test ends or stop is called.
func startWith(t *testing.T, src notify.Source, mb mailbox.Appender, st notify.Store, opts notify.Options) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	if opts.Backoff == 0 {
		opts.Backoff, opts.MaxBackoff = time.Millisecond, 10*time.Millisecond
	}
	r := notify.New(src, mb, st, opts)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run() = %v, want nil", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// waitFor polls cond until it holds or 10 s pass (a generous bound for
// a loaded machine; it normally holds within milliseconds).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func read(t *testing.T, mb *mailbox.Mailboxes, agent string) []mailbox.Delivery {
	t.Helper()
	d, err := mb.Read(t.Context(), agent, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func types(ds []mailbox.Delivery) []string {
	var out []string
	for _, d := range ds {
		out = append(out, d.Message.Type)
	}
	return out
}

// TestRelay_restartBeforeTrimDeliversEachOnce relays three notifications,
// stops the relay before it could tell the registry to trim them (as a
// crash would), and starts a new relay from nothing: it reads the same
// three again, and the mailbox still holds each once, in order.
func TestRelay_restartBeforeTrimDeliversEachOnce(t *testing.T) {
	out := newFakeOutbox()
	mb, st := newMailboxes(t, mailbox.Bound{})
	out.add("followed", bob)
	out.add("invite_to_group", bob)
	out.add("removed_from_group", bob)
	crashed := make(chan struct{})
	var once sync.Once
	out.intercept = func(after uint64) error {
		if after == 3 { // all three appended: "crash" before trimming
			once.Do(func() { close(crashed) })
			return errors.New("the relay crashed")
		}
		return nil
	}
	stop := start(t, out, mb, st)
	<-crashed
	stop()
	if got := out.kept(); got != 3 {
		t.Fatalf("outbox after the crash keeps %d, want all 3 (never trimmed)", got)
	}
	want := []string{"followed", "invite_to_group", "removed_from_group"}
	if got := types(read(t, mb, bob)); !slices.Equal(got, want) {
		t.Fatalf("bob's mailbox after the first relay = %v, want %v", got, want)
	}

	out.mu.Lock()
	out.intercept = nil
	out.mu.Unlock()
	start(t, out, mb, st)
	waitFor(t, "the second relay to trim the outbox", func() bool { return out.kept() == 0 })
	got := read(t, mb, bob)
	if !slices.Equal(types(got), want) {
		t.Errorf("bob's mailbox after a restart = %v, want %v, each once", types(got), want)
	}
	m := got[1].Message
	var body map[string]any
	if err := json.Unmarshal(m.Body, &body); err != nil || body["group"] != "acme/travel" || body["agent"] != alice {
		t.Errorf("invite body = %s (%v), want the notification as JSON", m.Body, err)
	}
	if m.Category != mailbox.CategoryNotifications || m.Sender != "" || m.ID != "ntf-c" || m.DialogueID == "" {
		t.Errorf("invite message = %+v, want category notifications, no sender, the notification's id", m)
	}
}

// TestRelay_fullMailboxDoesNotHoldUpOthers: a refused notification does
// not stop the next, for another agent, from being relayed.
func TestRelay_fullMailboxDoesNotHoldUpOthers(t *testing.T) {
	out := newFakeOutbox()
	mb, st := newMailboxes(t, mailbox.Bound{MaxMessages: 1})
	out.add("followed", bob)
	out.add("unfollowed", bob) // refused: bob's mailbox holds one unacknowledged
	out.add("followed", alice)
	start(t, out, mb, st)
	waitFor(t, "alice's notification", func() bool { return len(read(t, mb, alice)) == 1 })
	if got := types(read(t, mb, bob)); !slices.Equal(got, []string{"followed"}) {
		t.Errorf("bob's mailbox = %v, want only the first notification", got)
	}
}

// TestRelay_retriesAfterAFailure: the registry is unavailable once; the
// relay retries and relays.
func TestRelay_retriesAfterAFailure(t *testing.T) {
	out := newFakeOutbox()
	mb, st := newMailboxes(t, mailbox.Bound{})
	failed := false
	out.intercept = func(uint64) error {
		if !failed {
			failed = true
			return errors.New("registry down")
		}
		return nil
	}
	start(t, out, mb, st)
	out.add("followed", bob)
	waitFor(t, "bob's notification", func() bool { return len(read(t, mb, bob)) == 1 })
}

// A notification a full mailbox refused is retried, and delivered once
// its recipient acknowledged room. It waits in the dispatcher's store, so
// the registry's outbox may drop it meanwhile.
func TestRelay_retriesARefusedNotificationUntilThereIsRoom(t *testing.T) {
	out := newFakeOutbox()
	mb, st := newMailboxes(t, mailbox.Bound{MaxMessages: 1})
	out.add("followed", bob)
	out.add("unfollowed", bob) // refused: bob's mailbox holds one unacknowledged
	out.add("followed", alice)
	start(t, out, mb, st)
	waitFor(t, "alice's notification", func() bool { return len(read(t, mb, alice)) == 1 })
	waitFor(t, "the outbox to be trimmed past bob's waiting notification", func() bool { return out.kept() == 0 })
	if w, err := st.NotificationRetries(t.Context()); err != nil || len(w) != 1 || w[0].Sequence != 2 {
		t.Fatalf("waiting notifications = %+v, %v; want bob's refused one (sequence 2)", w, err)
	}
	if _, err := mb.Acknowledge(t.Context(), bob, 1); err != nil {
		t.Fatal(err)
	}
	want := []string{"followed", "unfollowed"}
	waitFor(t, "bob's refused notification", func() bool { return slices.Equal(types(read(t, mb, bob)), want) })
	waitFor(t, "the relayed notification to stop waiting", func() bool {
		w, err := st.NotificationRetries(t.Context())
		return err == nil && len(w) == 0
	})
}

// A notification still refused after RetryFor is given up: the relay
// stops retrying it and trims the outbox past it.
func TestRelay_givesUpAfterRetryFor(t *testing.T) {
	out := newFakeOutbox()
	mb, st := newMailboxes(t, mailbox.Bound{MaxMessages: 1})
	out.add("followed", bob)
	out.add("unfollowed", bob) // refused, and bob never acknowledges
	startWith(t, out, mb, st, notify.Options{RetryFor: time.Nanosecond})
	waitFor(t, "the outbox to be trimmed past the given-up notification", func() bool { return out.kept() == 0 })
	if got := types(read(t, mb, bob)); !slices.Equal(got, []string{"followed"}) {
		t.Errorf("bob's mailbox = %v, want only the first notification", got)
	}
}

// failingAppender fails every append to agent until healed.
type failingAppender struct {
	mailbox.Appender
	agent  string
	mu     sync.Mutex
	healed bool
}

func (f *failingAppender) heal() {
	f.mu.Lock()
	f.healed = true
	f.mu.Unlock()
}

func (f *failingAppender) Append(ctx context.Context, m mailbox.Message, recipients []string) ([]mailbox.Refusal, error) {
	f.mu.Lock()
	healed := f.healed
	f.mu.Unlock()
	if !healed && slices.Contains(recipients, f.agent) {
		return nil, errors.New("disk trouble")
	}
	return f.Appender.Append(ctx, m, recipients)
}

// A notification whose append fails does not hold up the ones after it,
// and is retried until it goes through.
func TestRelay_failedAppendIsRetriedWithoutHoldingUpOthers(t *testing.T) {
	out := newFakeOutbox()
	mb, st := newMailboxes(t, mailbox.Bound{})
	failing := &failingAppender{Appender: mb, agent: bob}
	out.add("followed", bob)
	out.add("followed", alice)
	start(t, out, failing, st)
	waitFor(t, "alice's notification", func() bool { return len(read(t, mb, alice)) == 1 })
	failing.heal()
	waitFor(t, "bob's notification", func() bool { return len(read(t, mb, bob)) == 1 })
	waitFor(t, "the outbox to be trimmed", func() bool { return out.kept() == 0 })
}

// clock is a settable Options.Now.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// A refused notification waits in the dispatcher's bbolt file, not in the
// registry's outbox (which is trimmed past it), so a dispatcher stopped
// and restarted on the same file still delivers it once there is room,
// once.
func TestRelay_waitingNotificationSurvivesARestart(t *testing.T) {
	dir := t.TempDir()
	out := newFakeOutbox()
	mb, st := openMailboxes(t, dir, mailbox.Bound{MaxMessages: 1})
	out.add("followed", bob)
	out.add("unfollowed", bob) // refused: bob's mailbox holds one unacknowledged
	stop := start(t, out, mb, st)
	waitFor(t, "the outbox to be trimmed past bob's waiting notification", func() bool { return out.kept() == 0 })
	stop()
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	mb, st = openMailboxes(t, dir, mailbox.Bound{MaxMessages: 1})
	start(t, out, mb, st)
	if _, err := mb.Acknowledge(t.Context(), bob, 1); err != nil {
		t.Fatal(err)
	}
	want := []string{"followed", "unfollowed"}
	waitFor(t, "bob's waiting notification after the restart", func() bool { return slices.Equal(types(read(t, mb, bob)), want) })
	waitFor(t, "it to stop waiting", func() bool {
		w, err := st.NotificationRetries(t.Context())
		return err == nil && len(w) == 0
	})
	if got := types(read(t, mb, bob)); !slices.Equal(got, want) {
		t.Errorf("bob's mailbox = %v, want %v, each once", got, want)
	}
}

// A restart resumes a waiting notification on its schedule: its
// RetryFor counts from its first failure before the restart, not from
// the restart, so one still refused past it is given up.
func TestRelay_restartKeepsTheRetrySchedule(t *testing.T) {
	dir := t.TempDir()
	out := newFakeOutbox()
	clk := &clock{now: time.Unix(1_800_000_000, 0)}
	opts := notify.Options{Now: clk.Now, RetryFor: time.Hour, Backoff: time.Minute, MaxBackoff: 10 * time.Minute}
	mb, st := openMailboxes(t, dir, mailbox.Bound{MaxMessages: 1})
	out.add("followed", bob)
	out.add("unfollowed", bob) // refused, and bob never acknowledges
	// The outbox is not trimmed past it before the stop (a crash can come
	// first): the restart reads both again.
	out.intercept = func(after uint64) error {
		if after > 0 {
			return errors.New("the registry is unreachable")
		}
		return nil
	}
	stop := startWith(t, out, mb, st, opts)
	var waiting []notify.Waiting
	waitFor(t, "bob's refused notification to wait in the store", func() bool {
		waiting, _ = st.NotificationRetries(t.Context())
		return len(waiting) == 1
	})
	stop()
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	w := waiting[0]
	if !w.First.Equal(clk.Now()) || !w.Next.Equal(clk.Now().Add(time.Minute)) || w.Backoff != 2*time.Minute {
		t.Errorf("waiting = first %v, next %v, backoff %v; want the failure's time, a minute later, 2m", w.First, w.Next, w.Backoff)
	}

	if out.kept() != 2 {
		t.Fatalf("the outbox keeps %d, want both, untrimmed", out.kept())
	}

	clk.add(61 * time.Minute) // past RetryFor since the first failure
	out.mu.Lock()
	out.intercept = nil
	out.mu.Unlock()
	mb, st = openMailboxes(t, dir, mailbox.Bound{MaxMessages: 1})
	reg := prometheus.NewRegistry()
	opts.Metrics = reg
	startWith(t, out, mb, st, opts)
	waitFor(t, "the notification to be given up on its first schedule", func() bool { return dropped(t, reg) == 1 })
	if w, err := st.NotificationRetries(t.Context()); err != nil || len(w) != 0 {
		t.Errorf("waiting after it was given up = %+v, %v; want none", w, err)
	}
	if got := types(read(t, mb, bob)); !slices.Equal(got, []string{"followed"}) {
		t.Errorf("bob's mailbox = %v, want only the first notification", got)
	}
	waitFor(t, "the outbox to be trimmed past the given-up notification", func() bool { return out.kept() == 0 })
	if w, err := st.NotificationRetries(t.Context()); err != nil || len(w) != 0 {
		t.Errorf("waiting once the outbox was read again = %+v, %v; want none: a given-up notification is not retried anew", w, err)
	}
}

// dropped is the relay's count of notifications given up.
func dropped(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" && l.GetValue() == "dropped" {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
