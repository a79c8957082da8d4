package deadline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
	"github.com/parleyhq/parley/services/dispatcher/internal/protocolcontrol"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
	"github.com/parleyhq/parley/services/dispatcher/internal/store/boltstore"
)

const (
	consumer = "clients/acme/agents/consumer"
	supplier = "clients/beta/agents/supplier"
	hash     = "0123456789abcdef0123456789abcdef01234567"
)

var t0 = time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)

// allocate is the built-in allocate PD's machine, as the registry parses it.
type allocate struct{ m *protocolcontrol.Machine }

func (a allocate) Machine(_ context.Context, h string) (*protocolcontrol.Machine, error) {
	if h != hash {
		return nil, errors.New("unknown protocol")
	}
	return a.m, nil
}

func machines(t testing.TB) allocate {
	t.Helper()
	raw, err := os.ReadFile("../serviceprotocol/testdata/allocate.json")
	if err != nil {
		t.Fatal(err)
	}
	sm := &registryv1.StateMachine{}
	if err := protojson.Unmarshal(raw, sm); err != nil {
		t.Fatal(err)
	}
	m, err := protocolcontrol.Compile(sm)
	if err != nil {
		t.Fatal(err)
	}
	return allocate{m}
}

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Set(t time.Time) { c.mu.Lock(); defer c.mu.Unlock(); c.now = t }

type env struct {
	dir   string
	st    *boltstore.Store
	mail  *mailbox.Mailboxes
	sched *Scheduler
	clk   *clock
	m     allocate
}

// open (re)opens the store in dir: a restart of the dispatcher's storage.
func (e *env) open(t testing.TB) {
	t.Helper()
	st, err := boltstore.Open(e.dir, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	e.st = st
	e.mail = mailbox.New(st, mailbox.Options{Now: e.clk.Now})
	e.sched = New(st, e.m, e.mail, Options{Now: e.clk.Now})
}

func (e *env) restart(t testing.TB) {
	t.Helper()
	if err := e.st.Close(); err != nil {
		t.Fatal(err)
	}
	e.open(t)
}

func newEnv(t testing.TB) *env {
	t.Helper()
	e := &env{dir: t.TempDir(), clk: &clock{now: t0}, m: machines(t)}
	e.open(t)
	t.Cleanup(func() { e.st.Close() })
	return e
}

// request opens dialogue d with a new_task_request to the supplier with a
// 30-second offer window, and arms its deadline.
func (e *env) request(t testing.TB, d string) json.RawMessage {
	t.Helper()
	return e.requestAt(t, d, e.clk.Now())
}

// requestAt is request at time now.
func (e *env) requestAt(t testing.TB, d string, now time.Time) json.RawMessage {
	t.Helper()
	state := e.dialogueAt(t, d, now)
	if err := e.sched.Arm(t.Context(), Pair{Dialogue: d, Initiator: consumer, Counterpart: supplier, Protocol: hash}, state); err != nil {
		t.Fatalf("Arm() error = %v", err)
	}
	return state
}

// dialogueAt stores dialogue d as request does at time now, without arming
// its deadline, and returns the pair's state.
func (e *env) dialogueAt(t testing.TB, d string, now time.Time) json.RawMessage {
	t.Helper()
	res, err := e.m.m.Check(nil, protocolcontrol.Input{
		Sender: protocolcontrol.Initiator, Type: "new_task_request",
		Body: []byte(`{"task":{"what":"deliver"},"invite_offer_timeout":30}`), Now: now,
	})
	if err != nil {
		t.Fatal(err)
	}
	dlg := store.Dialogue{ID: d, Initiator: consumer, Category: "service", Protocol: hash, CreateTime: t0}
	msg := store.DialogueMessage{ID: d + "-m1", DialogueID: d, Sender: consumer, Type: "new_task_request", Time: t0}
	pair := store.PairState{Pair: store.Pair{A: consumer, B: supplier}, State: res.State}
	w := store.MessageWrite{
		Message: msg, Recipients: []string{supplier}, Pairs: []store.PairState{pair},
		Mail: mailbox.Message{Sender: consumer, Category: mailbox.CategoryService, Type: msg.Type, Body: []byte(`{}`), Time: t0},
	}
	if _, err := e.st.CreateDialogue(t.Context(), dlg, w, mailbox.Bound{}); err != nil {
		t.Fatal(err)
	}
	return res.State
}

// expiries returns the expiry messages in agent's mailbox: those the
// network sent, not the dialogue's own messages.
func (e *env) expiries(t testing.TB, agent string) []mailbox.Message {
	t.Helper()
	ds, err := e.mail.Read(t.Context(), agent, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	var out []mailbox.Message
	for _, d := range ds {
		if d.Message.Sender == "" {
			out = append(out, d.Message)
		}
	}
	return out
}

// pair returns d's pair as it stands now (protocolcontrol.InspectAt).
func (e *env) pair(t testing.TB, d string) protocolcontrol.Pair {
	t.Helper()
	st, err := e.st.PairState(t.Context(), d, store.Pair{A: consumer, B: supplier})
	if err != nil {
		t.Fatal(err)
	}
	p, err := protocolcontrol.InspectAt(st, e.clk.Now())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDeadline_firesOnceAcrossRestarts(t *testing.T) {
	e := newEnv(t)
	before := e.request(t, "d1")

	e.clk.Set(t0.Add(29 * time.Second))
	if n, err := e.sched.FireDue(t.Context()); n != 0 || err != nil {
		t.Fatalf("FireDue(before the deadline) = %d, %v; want 0", n, err)
	}
	e.restart(t)

	// The server was down when the deadline passed.
	e.clk.Set(t0.Add(31 * time.Second))
	// A late offer is refused naming the deadline, even before the timer fires.
	_, err := e.m.m.Check(before, protocolcontrol.Input{Sender: protocolcontrol.Counterpart, Type: "offer", AnswersType: "new_task_request", Body: []byte(`{"offer":{}}`), Now: e.clk.Now()})
	var v *protocolcontrol.Violation
	if !errors.As(err, &v) || v.Rule != protocolcontrol.RuleDeadlinePassed || v.Deadline != "invite_offer_timeout" {
		t.Errorf("late offer: error = %v, want DEADLINE_PASSED naming invite_offer_timeout", err)
	}

	if n, err := e.sched.FireDue(t.Context()); n != 1 || err != nil {
		t.Fatalf("FireDue(after restart) = %d, %v; want 1", n, err)
	}
	for _, agent := range []string{consumer, supplier} {
		got := e.expiries(t, agent)
		if len(got) != 1 || got[0].Type != "invite_offer_timeout_expired" || got[0].Category != mailbox.CategoryService || got[0].DialogueID != "d1" || got[0].Sender != "" {
			t.Fatalf("%s's mailbox = %+v, want one invite_offer_timeout_expired of d1 from the network", agent, got)
		}
		var body struct{ Deadline, DeadlineTime, Outcome string }
		if err := json.Unmarshal(got[0].Body, &body); err != nil || body.Deadline != "invite_offer_timeout" || body.DeadlineTime != "2026-12-02T10:00:30Z" || body.Outcome != "failure" {
			t.Errorf("expiry body = %s, want the deadline, its time and the failure", got[0].Body)
		}
	}
	if p := e.pair(t, "d1"); !p.Ended || p.Outcome != protocolcontrol.OutcomeFailure || p.Expired != "invite_offer_timeout" {
		t.Errorf("pair after expiry = %+v, want ended in failure by invite_offer_timeout", p)
	}

	// Never again: not on the next pass, not after another restart.
	e.clk.Set(t0.Add(time.Hour))
	if n, err := e.sched.FireDue(t.Context()); n != 0 || err != nil {
		t.Errorf("FireDue(again) = %d, %v; want 0", n, err)
	}
	e.restart(t)
	if n, err := e.sched.FireDue(t.Context()); n != 0 || err != nil {
		t.Errorf("FireDue(after a second restart) = %d, %v; want 0", n, err)
	}
	if got := e.expiries(t, supplier); len(got) != 1 {
		t.Errorf("supplier's mailbox holds %d messages, want 1", len(got))
	}
}

func TestDeadline_metDeadlineDoesNotFire(t *testing.T) {
	e := newEnv(t)
	state := e.request(t, "d1")
	// The supplier offers in time; the dialogue layer stores the new state.
	e.clk.Set(t0.Add(10 * time.Second))
	res, err := e.m.m.Check(state, protocolcontrol.Input{Sender: protocolcontrol.Counterpart, Type: "offer", AnswersType: "new_task_request", Body: []byte(`{"offer":{}}`), Now: e.clk.Now()})
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.st.AddMessage(t.Context(), "d1-m1", mailbox.Bound{}, func(store.DialogueView) (store.MessageWrite, error) {
		return store.MessageWrite{
			Message:    store.DialogueMessage{ID: "d1-m2", DialogueID: "d1", Sender: supplier, Type: "offer", InReplyTo: "d1-m1", Time: e.clk.Now()},
			Recipients: []string{consumer},
			Pairs:      []store.PairState{{Pair: store.Pair{A: supplier, B: consumer}, State: res.State}},
			Mail:       mailbox.Message{Sender: supplier, Category: mailbox.CategoryService, Type: "offer", InReplyTo: "d1-m1", Body: []byte(`{}`), Time: e.clk.Now()},
		}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	e.clk.Set(t0.Add(time.Minute))
	if n, err := e.sched.FireDue(t.Context()); n != 0 || err != nil {
		t.Errorf("FireDue(met deadline) = %d, %v; want 0", n, err)
	}
	if got := e.expiries(t, consumer); len(got) != 0 {
		t.Errorf("consumer's mailbox = %+v, want no expiry", got)
	}
	if _, ok, _ := e.st.NextTimer(t.Context()); ok {
		t.Error("the met timer is still stored")
	}
}

// failOnce fails the first FireTimers as a crash before its commit would:
// expire runs, nothing is written.
type failOnce struct {
	store.TimerStore
	failed bool
}

func (f *failOnce) FireTimers(ctx context.Context, ts []store.Timer, bound mailbox.Bound, expire func(store.Timer, json.RawMessage) (store.TimerFiring, error)) ([]store.FiredTimer, error) {
	if !f.failed {
		f.failed = true
		for _, t := range ts {
			st, _ := f.PairState(ctx, t.Dialogue, store.Pair{A: t.Initiator, B: t.Counterpart})
			_, _ = expire(t, st)
		}
		return nil, errors.New("disk full")
	}
	return f.TimerStore.FireTimers(ctx, ts, bound, expire)
}

// The message and the state change are one commit: a failed commit leaves
// neither, and the retry sends the message once.
func TestDeadline_failedCommitLeavesNothingAndTheRetrySendsOnce(t *testing.T) {
	e := newEnv(t)
	e.request(t, "d1")
	e.clk.Set(t0.Add(time.Minute))
	s := New(&failOnce{TimerStore: e.st}, e.m, e.mail, Options{Now: e.clk.Now})
	if n, err := s.FireDue(t.Context()); n != 0 || err == nil {
		t.Fatalf("FireDue(failing store) = %d, %v; want 0 and an error", n, err)
	}
	if _, ok, _ := e.st.NextTimer(t.Context()); !ok {
		t.Fatal("the timer went with a failed commit")
	}
	if got := e.expiries(t, consumer); len(got) != 0 {
		t.Fatalf("consumer's mailbox = %+v after a failed commit, want nothing", got)
	}
	if n, err := s.FireDue(t.Context()); n != 1 || err != nil {
		t.Fatalf("FireDue(retry) = %d, %v; want 1", n, err)
	}
	for _, agent := range []string{consumer, supplier} {
		if got := e.expiries(t, agent); len(got) != 1 {
			t.Errorf("%s's mailbox holds %d expiry messages, want exactly 1", agent, len(got))
		}
	}
	if p := e.pair(t, "d1"); !p.Ended || p.Expired != "invite_offer_timeout" {
		t.Errorf("pair = %+v, want expired", p)
	}
}

// A timer whose protocol cannot be resolved stays stored; the rest of its
// batch fires, and FireDue reports the failure.
func TestDeadline_unknownProtocolStaysAndTheRestFire(t *testing.T) {
	e := newEnv(t)
	e.request(t, "d1")
	bad := store.Timer{Dialogue: "d0", Initiator: consumer, Counterpart: supplier, Protocol: "ffffffffffffffffffffffffffffffffffffffff", Name: "offer_timeout", At: t0}
	if err := e.st.PutTimers(t.Context(), []store.Timer{bad}); err != nil {
		t.Fatal(err)
	}
	e.clk.Set(t0.Add(time.Minute))
	if n, err := e.sched.FireDue(t.Context()); n != 1 || err == nil || !strings.Contains(err.Error(), "unknown protocol") {
		t.Fatalf("FireDue() = %d, %v; want d1 expired and the unknown protocol reported", n, err)
	}
	// Stored, put off until its retry (Options.Retry, a second).
	due, err := e.st.DueTimers(t.Context(), e.clk.Now().Add(time.Second), 10)
	if err != nil || len(due) != 1 || due[0].Dialogue != bad.Dialogue || !due[0].At.Equal(bad.At) || due[0].Failures != 1 {
		t.Errorf("timers left = %+v, %v; want the unresolved one, failed once", due, err)
	}
}

// Run fires what fell due while it was not running, then sleeps until the
// next timer; After is the fake clock's wait.
func TestRun_firesDueTimersAndWaitsForTheNext(t *testing.T) {
	e := newEnv(t)
	e.request(t, "d1")
	waits := make(chan time.Duration, 10)
	tick := make(chan time.Time)
	s := New(e.st, e.m, e.mail, Options{Now: e.clk.Now, After: func(d time.Duration) <-chan time.Time {
		waits <- d
		return tick
	}})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()

	// Nothing due: Run waits exactly until the deadline.
	if d := <-waits; d != 30*time.Second {
		t.Errorf("Run waits %v, want 30s (until the deadline)", d)
	}
	e.clk.Set(t0.Add(30 * time.Second))
	tick <- e.clk.Now()
	// It fired, and with no timer left it waits the idle time.
	if d := <-waits; d != time.Minute {
		t.Errorf("Run then waits %v, want the idle minute", d)
	}
	if got := e.expiries(t, supplier); len(got) != 1 {
		t.Errorf("supplier's mailbox holds %d messages, want 1", len(got))
	}
	cancel()
	<-done
}

// The hook hears of the expiry before the timer goes: when it fails, the
// timer stays and no message is sent; the retry tells it again, with the
// same message id, and fires once.
func TestDeadline_expiredHookBeforeTheTimerGoes(t *testing.T) {
	e := newEnv(t)
	e.request(t, "d1")
	var (
		got  []Expiry
		down = true
	)
	s := New(e.st, e.m, e.mail, Options{Now: e.clk.Now, Expired: func(_ context.Context, x Expiry) error {
		got = append(got, x)
		if down {
			return errors.New("order store down")
		}
		return nil
	}})
	e.clk.Set(t0.Add(time.Minute))
	if n, err := s.FireDue(t.Context()); n != 0 || err == nil || !strings.Contains(err.Error(), "order store down") {
		t.Fatalf("FireDue(hook failing) = %d, %v; want 0 and the hook's error", n, err)
	}
	if _, ok, _ := e.st.NextTimer(t.Context()); !ok {
		t.Fatal("the timer went though its expiry was not recorded")
	}
	if ms := e.expiries(t, consumer); len(ms) != 0 {
		t.Fatalf("expiry sent though not recorded: %+v", ms)
	}
	down = false
	// The failed timer is held back for Options.Retry (a second).
	if n, err := s.FireDue(t.Context()); n != 0 || err != nil {
		t.Fatalf("FireDue(before the retry) = %d, %v; want 0, the timer held back", n, err)
	}
	e.clk.Set(t0.Add(time.Minute + time.Second))
	if n, err := s.FireDue(t.Context()); n != 1 || err != nil {
		t.Fatalf("FireDue() = %d, %v; want 1", n, err)
	}
	if n, _ := s.FireDue(t.Context()); n != 0 {
		t.Fatalf("FireDue(again) = %d, want 0", n)
	}
	if len(got) != 2 || got[0].MessageID != got[1].MessageID {
		t.Fatalf("Expired called %d times (%+v), want twice with one message id", len(got), got)
	}
	prev, _ := protocolcontrol.Inspect(got[1].Prev)
	next, _ := protocolcontrol.Inspect(got[1].Next)
	if prev.Ended || !next.Ended || next.Expired != "invite_offer_timeout" || got[1].MessageID != ID(got[1].Timer) {
		t.Errorf("Expired(%+v): prev %+v, next %+v; want the move to expired, with the message id", got[1], prev, next)
	}
	if ms := e.expiries(t, consumer); len(ms) != 1 || ms[0].ID != got[1].MessageID {
		t.Errorf("consumer's expiries = %+v, want one, with the id the hook saw", ms)
	}
}

// Timers that keep failing do not hold up the others: with a full batch of
// them due first, a good timer due after them still fires, and the failing
// ones stay stored for a later retry.
func TestDeadline_aFullBatchOfFailingTimersDoesNotBlockTheRest(t *testing.T) {
	e := newEnv(t)
	s := New(e.st, e.m, e.mail, Options{Now: e.clk.Now, Batch: 2, Retry: time.Hour})
	var bad []store.Timer
	for _, d := range []string{"d0a", "d0b", "d0c"} {
		bad = append(bad, store.Timer{Dialogue: d, Initiator: consumer, Counterpart: supplier, Protocol: "ffffffffffffffffffffffffffffffffffffffff", Name: "offer_timeout", At: t0})
	}
	if err := e.st.PutTimers(t.Context(), bad); err != nil {
		t.Fatal(err)
	}
	e.request(t, "d1")
	e.clk.Set(t0.Add(time.Minute))
	if n, err := s.FireDue(t.Context()); n != 1 || err == nil || !strings.Contains(err.Error(), "unknown protocol") {
		t.Fatalf("FireDue() = %d, %v; want d1 expired past the failing batch, and the failures reported", n, err)
	}
	if p := e.pair(t, "d1"); !p.Ended || p.Expired != "invite_offer_timeout" {
		t.Errorf("pair d1 = %+v, want expired", p)
	}
	// Kept, and put off in the store until their retry.
	if due, err := e.st.DueTimers(t.Context(), e.clk.Now(), 10); err != nil || len(due) != 0 {
		t.Errorf("timers due = %+v, %v; want none: the failing ones are put off", due, err)
	}
	due, err := e.st.DueTimers(t.Context(), e.clk.Now().Add(time.Hour), 10)
	if err != nil || len(due) != len(bad) {
		t.Fatalf("timers left = %+v, %v; want the %d failing ones kept", due, err, len(bad))
	}
	for _, d := range due {
		if d.Failures != 1 || !d.Retry.Equal(e.clk.Now().Add(time.Hour)) {
			t.Errorf("failing timer %s = %+v, want one failure and its retry in an hour", d.Dialogue, d)
		}
	}
	// A later good timer fires at once, before the failing ones' retry.
	e.requestAt(t, "d2", t0.Add(time.Minute))
	e.clk.Set(t0.Add(2 * time.Minute))
	if n, err := s.FireDue(t.Context()); n != 1 || err != nil {
		t.Fatalf("FireDue(failing ones backing off) = %d, %v; want d2 expired and no retry yet", n, err)
	}
}

// Run does not spin on a failing timer held back: it waits for its retry,
// or for a good timer due sooner.
func TestRun_waitsForTheRetryOfAFailingTimer(t *testing.T) {
	e := newEnv(t)
	bad := store.Timer{Dialogue: "d0", Initiator: consumer, Counterpart: supplier, Protocol: "ffffffffffffffffffffffffffffffffffffffff", Name: "offer_timeout", At: t0}
	if err := e.st.PutTimers(t.Context(), []store.Timer{bad}); err != nil {
		t.Fatal(err)
	}
	waits := make(chan time.Duration, 10)
	tick := make(chan time.Time)
	s := New(e.st, e.m, e.mail, Options{Now: e.clk.Now, Retry: 10 * time.Second, After: func(d time.Duration) <-chan time.Time {
		waits <- d
		return tick
	}})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	if d := <-waits; d != 10*time.Second {
		t.Errorf("Run waits %v after the failure, want the retry (10s)", d)
	}
	e.clk.Set(t0.Add(5 * time.Second))
	tick <- e.clk.Now()
	if d := <-waits; d != 5*time.Second {
		t.Errorf("Run waits %v with the timer held back, want until its retry (5s)", d)
	}
	cancel()
	<-done
}

// countingStore counts the timers each DueTimers call may list.
type countingStore struct {
	store.TimerStore
	mu     sync.Mutex
	limits []int
}

func (c *countingStore) DueTimers(ctx context.Context, now time.Time, limit int) ([]store.Timer, error) {
	c.mu.Lock()
	c.limits = append(c.limits, limit)
	c.mu.Unlock()
	return c.TimerStore.DueTimers(ctx, now, limit)
}

func (c *countingStore) DueTimersAfter(ctx context.Context, now time.Time, after store.Timer, limit int) ([]store.Timer, error) {
	c.mu.Lock()
	c.limits = append(c.limits, limit)
	c.mu.Unlock()
	return c.TimerStore.DueTimersAfter(ctx, now, after, limit)
}

// A failing timer's back-off is kept in the store, not in memory: it
// holds across a restart, doubles with each failure, and however many
// timers fail, each listing asks for one batch.
func TestDeadline_failingTimersBackOffInTheStore(t *testing.T) {
	e := newEnv(t)
	var bad []store.Timer
	for _, d := range []string{"d0a", "d0b", "d0c", "d0d", "d0e"} {
		bad = append(bad, store.Timer{Dialogue: d, Initiator: consumer, Counterpart: supplier, Protocol: "ffffffffffffffffffffffffffffffffffffffff", Name: "offer_timeout", At: t0})
	}
	if err := e.st.PutTimers(t.Context(), bad); err != nil {
		t.Fatal(err)
	}
	cs := &countingStore{TimerStore: e.st}
	opts := Options{Now: e.clk.Now, Batch: 2, Retry: time.Second, RetryMax: 4 * time.Second}
	s := New(cs, e.m, e.mail, opts)
	// Each round fails all five (retries at +1s, then +2s, +4s, +4s); a
	// restart between rounds keeps the back-off.
	at := t0
	for round, wait := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 4 * time.Second} {
		e.clk.Set(at)
		if n, err := s.FireDue(t.Context()); n != 0 || err == nil {
			t.Fatalf("round %d: FireDue() = %d, %v; want the failures reported", round, n, err)
		}
		due, err := e.st.DueTimers(t.Context(), at.Add(time.Hour), 10)
		if err != nil || len(due) != len(bad) {
			t.Fatalf("round %d: timers = %+v, %v; want the %d failing ones", round, due, err, len(bad))
		}
		for _, d := range due {
			if d.Failures != round+1 || !d.Retry.Equal(at.Add(wait)) {
				t.Fatalf("round %d: timer %s = failures %d, retry %v; want %d, %v", round, d.Dialogue, d.Failures, d.Retry, round+1, at.Add(wait))
			}
		}
		e.restart(t)
		cs = &countingStore{TimerStore: e.st, limits: cs.limits}
		s = New(cs, e.m, e.mail, opts)
		// Not before its retry, after the restart too.
		e.clk.Set(at.Add(wait - time.Nanosecond))
		if n, err := s.FireDue(t.Context()); n != 0 || err != nil {
			t.Fatalf("round %d: FireDue(before the retry, restarted) = %d, %v; want nothing tried", round, n, err)
		}
		at = at.Add(wait)
	}
	for _, l := range cs.limits {
		if l != opts.Batch {
			t.Fatalf("DueTimers limits = %v, want every one the batch (%d)", cs.limits, opts.Batch)
		}
	}
}

// FireDue reads and tells of the next batch while the one before commits:
// each deadline is still told of and fired once, failing ones (here every
// third, its hook failing) are put off once and fire on their retry, and
// every expiry reaches both mailboxes once.
func TestFireDue_overlappingBatchesFireEachOnce(t *testing.T) {
	e := newEnv(t)
	var (
		mu    sync.Mutex
		told  = map[string]int{}
		fails = true
	)
	s := New(e.st, e.m, e.mail, Options{Now: e.clk.Now, Batch: 3, Expired: func(_ context.Context, x Expiry) error {
		mu.Lock()
		defer mu.Unlock()
		told[x.Timer.Dialogue]++
		if fails && x.Timer.Dialogue[len(x.Timer.Dialogue)-1]%3 == 0 {
			return errors.New("order store down")
		}
		return nil
	}})
	const n = 20
	for i := range n {
		e.request(t, fmt.Sprintf("d%02d", i))
	}
	e.clk.Set(t0.Add(time.Minute))
	failing := 0
	for i := range n {
		if i%10%3 == 0 {
			failing++
		}
	}
	if got, err := s.FireDue(t.Context()); got != n-failing || err == nil {
		t.Fatalf("FireDue() = %d, %v; want %d expired and the hook's error", got, err, n-failing)
	}
	for i := range n {
		if d := fmt.Sprintf("d%02d", i); told[d] != 1 {
			t.Errorf("%s told of %d times, want once", d, told[d])
		}
	}
	fails = false
	e.clk.Set(t0.Add(time.Minute + time.Second)) // the failing ones' retry
	if got, err := s.FireDue(t.Context()); got != failing || err != nil {
		t.Fatalf("FireDue(the retry) = %d, %v; want the %d put off", got, err, failing)
	}
	for _, agent := range []string{consumer, supplier} {
		ds, err := e.mail.Read(t.Context(), agent, 0, 100)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]int{}
		for _, d := range ds {
			if d.Message.Sender == "" {
				seen[d.Message.DialogueID]++
			}
		}
		for i := range n {
			if d := fmt.Sprintf("d%02d", i); seen[d] != 1 {
				t.Errorf("%s's mailbox holds %d expiries of %s, want one", agent, seen[d], d)
			}
		}
	}
	if _, ok, _ := e.st.NextTimer(t.Context()); ok {
		t.Error("a timer is left after every deadline fired")
	}
}
