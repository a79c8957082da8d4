package dialogue_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/parleyhq/parley/platform/pgdb/pgdbtest"
	"github.com/parleyhq/parley/services/dispatcher/internal/dialogue"
	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
	"github.com/parleyhq/parley/services/dispatcher/internal/store/boltstore"
	"github.com/parleyhq/parley/services/dispatcher/internal/store/pgstore"
)

const (
	alice = "clients/a/agents/alice"
	bob   = "clients/b/agents/bob"
	carol = "clients/c/agents/carol"
	dave  = "clients/d/agents/dave" // follows nobody's senders: refused
)

// boxes are the real mailboxes of the test's store, bounded by bytes so
// that fill can make one agent's mailbox full with a single message.
type boxes struct {
	*mailbox.Mailboxes
	t       testing.TB
	fillers int
}

// maxBytes is the test mailboxes' bound.
const maxBytes = 1 << 16

// fill makes agent's mailbox full: its next message is refused.
func (b *boxes) fill(agent string) {
	b.t.Helper()
	b.fillers++
	st, err := b.State(b.t.Context(), agent)
	if err != nil {
		b.t.Fatal(err)
	}
	body, _ := json.Marshal(strings.Repeat("x", maxBytes-int(st.PendingBytes)-2))
	m := mailbox.Message{ID: fmt.Sprint("filler", b.fillers), DialogueID: "filler", Category: mailbox.CategoryMessage, Type: "filler", Body: body}
	if refused, err := b.Append(b.t.Context(), m, []string{agent}); err != nil || len(refused) != 0 {
		b.t.Fatalf("fill(%s) = %v, %v", agent, refused, err)
	}
}

// drain acknowledges agent's whole mailbox, so it takes messages again.
func (b *boxes) drain(agent string) {
	b.t.Helper()
	if _, err := b.ClearBacklog(b.t.Context(), agent); err != nil {
		b.t.Fatal(err)
	}
}

// of returns agent's messages, acknowledged or not, but the fillers.
func (b *boxes) of(agent string) []mailbox.Message {
	b.t.Helper()
	ds, err := b.Read(b.t.Context(), agent, 0, 1000)
	if err != nil {
		b.t.Fatal(err)
	}
	var out []mailbox.Message
	for _, d := range ds {
		if d.Message.Type != "filler" {
			out = append(out, d.Message)
		}
	}
	return out
}

// total counts the messages of the test's agents.
func (b *boxes) total() int {
	n := 0
	for _, a := range []string{alice, bob, carol, dave} {
		n += len(b.of(a))
	}
	return n
}

// fakeResolver allows every direct recipient but dave; groups are not
// resolved here.
type fakeResolver struct{}

func (fakeResolver) Resolve(_ context.Context, _ string, l dialogue.List) ([]dialogue.Candidate, error) {
	var out []dialogue.Candidate
	for _, a := range l.Direct {
		c := dialogue.Candidate{Agent: a}
		if a == dave {
			c.Refused, c.Detail = dialogue.ReasonPermission, dave+" does not follow the sender"
		}
		out = append(out, c)
	}
	return out, nil
}

type env struct {
	svc  *dialogue.Service
	mail *boxes
	st   store.DialogueStore
	// replicas are the services racing calls go through: svc alone on
	// bbolt, two replicas of one schema on PostgreSQL (onEachBackend).
	replicas []*dialogue.Service
}

// replica returns the service the i-th of racing calls goes through.
func (e *env) replica(i int) *dialogue.Service { return e.replicas[i%len(e.replicas)] }

// onEachBackend runs f on an env over bbolt and, with
// PARLEY_TEST_DATABASE_URL set (pgdbtest), over two PostgreSQL replicas of
// one schema, each a store, mailboxes and a service of its own, as two
// dispatcher processes would be: the dialogue writes that race in f race
// across them.
func onEachBackend(t *testing.T, opts dialogue.Options, f func(t *testing.T, e *env)) {
	t.Run("bbolt", func(t *testing.T) { f(t, newEnv(t, opts)) })
	t.Run("postgres", func(t *testing.T) {
		url, schema := pgdbtest.Schema(t)
		e := &env{}
		for i := range 2 {
			st, err := pgstore.Open(t.Context(), url, schema, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			mail := &boxes{Mailboxes: mailbox.New(st, mailbox.Options{Bound: mailbox.Bound{MaxBytes: maxBytes}}), t: t}
			svc := dialogue.New(st, mail, fakeResolver{}, opts)
			if i == 0 {
				e.svc, e.mail, e.st = svc, mail, st
			}
			e.replicas = append(e.replicas, svc)
		}
		f(t, e)
	})
}

func newEnv(t *testing.T, opts dialogue.Options) *env {
	t.Helper()
	st, err := boltstore.Open(t.TempDir(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	mail := &boxes{Mailboxes: mailbox.New(st, mailbox.Options{Bound: mailbox.Bound{MaxBytes: maxBytes}}), t: t}
	svc := dialogue.New(st, mail, fakeResolver{}, opts)
	return &env{svc: svc, mail: mail, st: st, replicas: []*dialogue.Service{svc}}
}

func text(s string) dialogue.Message {
	b, _ := json.Marshal(s)
	return dialogue.Message{Type: "new_message", RecipientType: "recipient", Body: b}
}

func (e *env) open(t *testing.T, to ...string) dialogue.Result {
	t.Helper()
	res, err := e.svc.Open(t.Context(), alice, mailbox.CategoryMessage, dialogue.List{Direct: to}, text("hi"))
	if err != nil {
		t.Fatalf("Open(alice → %v): %v", to, err)
	}
	return res
}

func TestOpen_setsServerFieldsAndReportsRefusals(t *testing.T) {
	now := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	e := newEnv(t, dialogue.Options{Now: func() time.Time { return now }})
	res := e.open(t, bob, alice, dave, bob, carol)
	if len(res.DialogueID) != 32 || len(res.MessageID) != 32 || res.DialogueID == res.MessageID {
		t.Errorf("ids = %q, %q; want two distinct 128-bit ids", res.DialogueID, res.MessageID)
	}
	if !slices.Equal(res.Recipients, []string{bob, carol}) {
		t.Errorf("Recipients = %v, want [bob carol]: the sender is removed and bob counted once", res.Recipients)
	}
	want := []dialogue.Refusal{{Agent: dave, Reason: dialogue.ReasonPermission, Detail: dave + " does not follow the sender"}}
	if !slices.Equal(res.Refusals, want) {
		t.Errorf("Refusals = %v, want %v", res.Refusals, want)
	}
	got := e.mail.of(bob)
	if len(got) != 1 {
		t.Fatalf("bob's mailbox = %v, want the message once", got)
	}
	m := got[0]
	if m.ID != res.MessageID || m.DialogueID != res.DialogueID || m.Sender != alice || m.Category != mailbox.CategoryMessage || !m.Time.Equal(now) || m.InReplyTo != "" {
		t.Errorf("delivered %+v, want the server's id, dialogue, sender alice, category message, time %v", m, now)
	}
	if len(e.mail.of(alice)) != 0 || len(e.mail.of(dave)) != 0 {
		t.Error("the sender or a refused recipient got the message")
	}
}

func TestOpen_noRecipientChangesNothing(t *testing.T) {
	e := newEnv(t, dialogue.Options{})
	_, err := e.svc.Open(t.Context(), alice, mailbox.CategoryMessage, dialogue.List{Direct: []string{dave}}, text("hi"))
	var refused *dialogue.RefusedError
	if !errors.Is(err, dialogue.ErrPermission) || !errors.As(err, &refused) || len(refused.Refusals) != 1 {
		t.Fatalf("Open(alice → dave) = %v, want a RefusedError of ErrPermission naming dave", err)
	}
	if n := e.mail.total(); n != 0 {
		t.Errorf("mailboxes hold %d messages after a refused open, want 0", n)
	}
	if _, err := e.st.GetDialogueMessage(t.Context(), refused.MessageID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the refused opener was stored: %v", err)
	}
	_, err = e.svc.Open(t.Context(), alice, mailbox.CategoryMessage, dialogue.List{Direct: []string{alice}}, text("hi"))
	if !errors.Is(err, dialogue.ErrNoRecipient) {
		t.Errorf("Open(alice → alice) = %v, want ErrNoRecipient", err)
	}
}

func TestReply_toSenderAndAll(t *testing.T) {
	e := newEnv(t, dialogue.Options{})
	open := e.open(t, bob, carol)
	reply := text("yes")
	reply.Type = "message_response"
	res, err := e.svc.Reply(t.Context(), bob, open.MessageID, false, reply)
	if err != nil || !slices.Equal(res.Recipients, []string{alice}) || res.DialogueID != open.DialogueID {
		t.Fatalf("Reply(bob → opener) = %+v, %v; want to alice in the same dialogue", res, err)
	}
	if got := e.mail.of(alice); len(got) != 1 || got[0].InReplyTo != open.MessageID || got[0].Sender != bob {
		t.Errorf("alice's mailbox = %+v, want bob's reply naming the opener", got)
	}
	res, err = e.svc.Reply(t.Context(), carol, open.MessageID, true, reply)
	if err != nil || !slices.Equal(res.Recipients, []string{alice, bob}) {
		t.Errorf("Reply(carol, all) = %+v, %v; want to alice and bob", res, err)
	}
	// alice received bob's reply, so she may answer it; bob may not.
	if _, err := e.svc.Reply(t.Context(), alice, res.MessageID, false, reply); err != nil {
		t.Errorf("Reply(alice → carol's reply) = %v", err)
	}
}

func TestReply_refusalsChangeNothing(t *testing.T) {
	e := newEnv(t, dialogue.Options{})
	open := e.open(t, bob)
	bc, err := e.svc.Open(t.Context(), alice, mailbox.CategorySubscription, dialogue.List{Direct: []string{bob}}, text("news"))
	if err != nil {
		t.Fatal(err)
	}
	before := e.mail.total()
	for _, c := range []struct {
		name      string
		sender    string
		inReplyTo string
		want      error
	}{
		{"not received", carol, open.MessageID, dialogue.ErrNotReceived},
		{"own message", alice, open.MessageID, dialogue.ErrNotReceived},
		{"unknown message", bob, "AAAAAAAAAAAAAAAAAAAAAA", dialogue.ErrNotReceived},
		{"broadcast", bob, bc.MessageID, dialogue.ErrBroadcast},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := e.svc.Reply(t.Context(), c.sender, c.inReplyTo, true, text("x")); !errors.Is(err, c.want) {
				t.Errorf("Reply(%s → %s) = %v, want %v", c.sender, c.inReplyTo, err, c.want)
			}
		})
	}
	if n := e.mail.total(); n != before {
		t.Errorf("mailboxes hold %d messages after refused replies, want %d", n, before)
	}
}

func TestMailboxFull_refusedRecipientCannotReply(t *testing.T) {
	e := newEnv(t, dialogue.Options{})
	e.mail.fill(carol)
	res := e.open(t, bob, carol)
	want := []dialogue.Refusal{{Agent: carol, Reason: dialogue.ReasonMailboxFull, Detail: carol + "'s mailbox is full"}}
	if !slices.Equal(res.Recipients, []string{bob}) || !slices.Equal(res.Refusals, want) {
		t.Errorf("Open = %+v, want bob delivered and carol refused as full", res)
	}
	e.mail.drain(carol)
	if _, err := e.svc.Reply(t.Context(), carol, res.MessageID, false, text("x")); !errors.Is(err, dialogue.ErrNotReceived) {
		t.Errorf("Reply(carol, whose mailbox refused the opener) = %v, want ErrNotReceived", err)
	}
	// Every mailbox full: the dialogue is not kept.
	e.mail.fill(bob)
	_, err := e.svc.Open(t.Context(), alice, mailbox.CategoryMessage, dialogue.List{Direct: []string{bob}}, text("hi"))
	var refused *dialogue.RefusedError
	if !errors.As(err, &refused) || !errors.Is(err, dialogue.ErrMailboxFull) {
		t.Fatalf("Open to a full mailbox = %v, want ErrMailboxFull", err)
	}
	if _, err := e.st.GetDialogueMessage(t.Context(), refused.MessageID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("an opener no mailbox took is still stored: %v", err)
	}
}

func TestClose(t *testing.T) {
	e := newEnv(t, dialogue.Options{})
	ctx := t.Context()
	open := e.open(t, bob, carol)
	r1, err := e.svc.Reply(ctx, bob, open.MessageID, true, text("r1")) // to alice and carol
	if err != nil {
		t.Fatal(err)
	}

	// carol closes bob: alice's reply-all to bob's message reaches bob only.
	if _, err := e.svc.CloseAgent(ctx, carol, open.DialogueID, alice); err != nil {
		t.Fatal(err)
	}
	res, err := e.svc.Reply(ctx, alice, r1.MessageID, true, text("r2"))
	if err != nil || !slices.Equal(res.Recipients, []string{bob}) || len(res.Refusals) != 1 || res.Refusals[0].Reason != dialogue.ReasonClosed {
		t.Errorf("Reply(alice, all) after carol closed alice = %+v, %v; want bob, and carol refused as closed", res, err)
	}

	// bob closes the type "nag": a nag to him alone is refused whole.
	if v, err := e.svc.CloseMessages(ctx, bob, open.DialogueID, []string{"nag", "nag"}); err != nil || !slices.Equal(v.Participant.ClosedTypes, []string{"nag"}) {
		t.Errorf("CloseMessages(bob, nag) = %+v, %v", v, err)
	}
	nag := text("nag")
	nag.Type = "nag"
	if _, err := e.svc.Reply(ctx, alice, r1.MessageID, false, nag); !errors.Is(err, dialogue.ErrRecipientClosed) {
		t.Errorf("Reply(alice → bob, type nag) = %v, want ErrRecipientClosed", err)
	}

	// Not a participant: not found.
	if _, err := e.svc.Close(ctx, dave, open.DialogueID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Close(dave) = %v, want ErrNotFound", err)
	}

	// carol closes for herself; the initiator's close ends the dialogue.
	if v, err := e.svc.Close(ctx, carol, open.DialogueID); err != nil || v.Dialogue.Closed || !v.Participant.Closed {
		t.Errorf("Close(carol) = %+v, %v; want closed for carol only", v, err)
	}
	if v, err := e.svc.Close(ctx, alice, open.DialogueID); err != nil || !v.Dialogue.Closed {
		t.Errorf("Close(alice, the initiator) = %+v, %v; want closed for all", v, err)
	}
	if _, err := e.svc.Reply(ctx, alice, r1.MessageID, false, text("late")); !errors.Is(err, dialogue.ErrClosed) {
		t.Errorf("Reply after the initiator closed = %v, want ErrClosed", err)
	}

	// CloseAll counts the dialogues still open for the agent.
	e.open(t, bob)
	e.open(t, bob)
	if n, err := e.svc.CloseAll(ctx, bob); err != nil || n != 2 {
		t.Errorf("CloseAll(bob) = %d, %v; want 2 (the first dialogue is closed already)", n, err)
	}
}

// fakeMachine is a state machine for tests: the state counts messages of
// the pair, a type "bad" breaks rule "no-bad", and a "numbered" message's
// body becomes its number in the pair.
type fakeMachine struct{}

// OpensOrder: type "accept" forms an order.
func (fakeMachine) OpensOrder(typ string) bool { return typ == "accept" }

func (fakeMachine) Step(state json.RawMessage, s dialogue.Step) (dialogue.Accepted, error) {
	if s.Type == "bad" {
		return dialogue.Accepted{}, &dialogue.Violation{Rule: "NO_BAD", Detail: "bad after " + s.AnsweredType}
	}
	var n int
	_ = json.Unmarshal(state, &n)
	out, _ := json.Marshal(n + 1)
	if s.Type == "numbered" {
		return dialogue.Accepted{State: out, Body: out}, nil
	}
	return dialogue.Accepted{State: out}, nil
}

type fakeProtocols struct{}

func (fakeProtocols) Machine(_ context.Context, hash string) (dialogue.Machine, error) {
	if hash == "" {
		return nil, nil
	}
	return fakeMachine{}, nil
}

func TestProtocolControl(t *testing.T) {
	e := newEnv(t, dialogue.Options{Protocols: fakeProtocols{}})
	ctx := t.Context()
	m := text("task")
	m.Protocol = "0123456789abcdef0123456789abcdef01234567"
	open, err := e.svc.Open(ctx, alice, mailbox.CategoryMessage, dialogue.List{Direct: []string{bob}}, m)
	if err != nil {
		t.Fatal(err)
	}
	bad := text("x")
	bad.Type = "bad"
	_, err = e.svc.Reply(ctx, bob, open.MessageID, false, bad)
	if !errors.Is(err, dialogue.ErrProtocol) {
		t.Fatalf("Reply(bad) = %v, want ErrProtocol", err)
	}
	if got := e.mail.of(alice); len(got) != 0 {
		t.Errorf("alice received %v after a protocol violation, want nothing", got)
	}
	got := e.mail.of(bob)
	if len(got) != 2 || got[1].Type != "protocol_error" || got[1].Sender != "" {
		t.Fatalf("bob's mailbox = %+v, want the opener then a protocol_error from the network", got)
	}
	var body map[string]string
	if err := json.Unmarshal(got[1].Body, &body); err != nil || body["recipient"] != alice || body["rule"] != "NO_BAD" {
		t.Errorf("protocol_error body = %s, want the recipient and the rule", got[1].Body)
	}
	// The next valid message goes through, and the pair's state moved by
	// exactly the delivered messages (opener, this reply).
	ok := text("fine")
	ok.Type = "message_response"
	res, err := e.svc.Reply(ctx, bob, open.MessageID, false, ok)
	if err != nil {
		t.Fatalf("Reply(valid after a violation) = %v", err)
	}
	got = e.mail.of(alice)
	if len(got) != 1 || got[0].Protocol != m.Protocol {
		t.Errorf("alice's mailbox = %+v, want the valid reply under the dialogue's protocol", got)
	}
	_, err = e.st.AddMessage(ctx, res.MessageID, mailbox.Bound{}, func(v store.DialogueView) (store.MessageWrite, error) {
		if s := string(v.PairState(store.Pair{A: alice, B: bob})); s != "2" {
			t.Errorf("pair state = %s, want 2", s)
		}
		return store.MessageWrite{}, errors.New("read only")
	})
	if err == nil {
		t.Fatal("read-only AddMessage wrote")
	}
}

func TestRequestID_repeatReturnsTheFirstResult(t *testing.T) {
	e := newEnv(t, dialogue.Options{})
	ctx := t.Context()
	m := text("once")
	m.RequestID = "req-1"
	first, err := e.svc.Open(ctx, alice, mailbox.CategoryMessage, dialogue.List{Direct: []string{bob}}, m)
	if err != nil {
		t.Fatal(err)
	}
	again, err := e.svc.Open(ctx, alice, mailbox.CategoryMessage, dialogue.List{Direct: []string{bob}}, m)
	if err != nil || again.MessageID != first.MessageID || again.DialogueID != first.DialogueID || !slices.Equal(again.Recipients, first.Recipients) {
		t.Errorf("repeated Open = %+v, %v; want the first result %+v", again, err, first)
	}
	if n := len(e.mail.of(bob)); n != 1 {
		t.Errorf("bob holds %d messages after a repeated request, want 1", n)
	}
	// The same id from another sender is another request.
	if other, err := e.svc.Open(ctx, carol, mailbox.CategoryMessage, dialogue.List{Direct: []string{bob}}, m); err != nil || other.MessageID == first.MessageID {
		t.Errorf("Open(carol, same request_id) = %+v, %v; want a send of its own", other, err)
	}
	// A failed send is forgotten: its repeat runs again.
	m.RequestID = "req-2"
	if _, err := e.svc.Open(ctx, alice, mailbox.CategoryMessage, dialogue.List{Direct: []string{dave}}, m); !errors.Is(err, dialogue.ErrPermission) {
		t.Fatalf("Open(dave) = %v, want ErrPermission", err)
	}
	if _, err := e.svc.Open(ctx, alice, mailbox.CategoryMessage, dialogue.List{Direct: []string{bob}}, m); err != nil {
		t.Errorf("repeat of a failed request = %v, want it to run", err)
	}
	// Replies too.
	r := text("yes")
	r.RequestID = "req-3"
	r1, err := e.svc.Reply(ctx, bob, first.MessageID, false, r)
	if err != nil {
		t.Fatal(err)
	}
	if r2, err := e.svc.Reply(ctx, bob, first.MessageID, false, r); err != nil || r2.MessageID != r1.MessageID {
		t.Errorf("repeated Reply = %+v, %v; want %s", r2, err, r1.MessageID)
	}
	if n := len(e.mail.of(alice)); n != 1 {
		t.Errorf("alice holds %d replies after a repeated request, want 1", n)
	}
}

// TestProtocolControl_concurrentRepliesSerialisePerPair: replies racing on
// one pair (through two replicas on PostgreSQL) each move its state from
// the one the previous left, so the count the fake machine keeps equals
// the messages delivered.
func TestProtocolControl_concurrentRepliesSerialisePerPair(t *testing.T) {
	onEachBackend(t, dialogue.Options{Protocols: fakeProtocols{}}, testConcurrentRepliesSerialisePerPair)
}

func testConcurrentRepliesSerialisePerPair(t *testing.T, e *env) {
	ctx := t.Context()
	m := text("task")
	m.Protocol = "0123456789abcdef0123456789abcdef01234567"
	open, err := e.svc.Open(ctx, alice, mailbox.CategoryMessage, dialogue.List{Direct: []string{bob}}, m)
	if err != nil {
		t.Fatal(err)
	}
	const n = 16
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			if _, err := e.replica(i).Reply(ctx, bob, open.MessageID, false, text("r")); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("concurrent Reply: %v", err)
	}
	if got := len(e.mail.of(alice)); got != n {
		t.Fatalf("alice holds %d replies, want %d", got, n)
	}
	_, _ = e.st.AddMessage(ctx, open.MessageID, mailbox.Bound{}, func(v store.DialogueView) (store.MessageWrite, error) {
		if s := string(v.PairState(store.Pair{A: alice, B: bob})); s != "17" {
			t.Errorf("pair state after the opener and %d racing replies = %s, want 17", n, s)
		}
		return store.MessageWrite{}, errors.New("read only")
	})
}

// TestReply_racingSendsReachTheMailboxInRecordOrder: replies racing in one
// dialogue reach the recipient's mailbox in the order they were recorded
// (the order the state machine numbered them), because the record and the
// mailbox append are one transaction (through two replicas on PostgreSQL).
func TestReply_racingSendsReachTheMailboxInRecordOrder(t *testing.T) {
	onEachBackend(t, dialogue.Options{Protocols: fakeProtocols{}}, testRacingSendsInRecordOrder)
}

func testRacingSendsInRecordOrder(t *testing.T, e *env) {
	ctx := t.Context()
	m := text("task")
	m.Protocol = "0123456789abcdef0123456789abcdef01234567"
	open, err := e.svc.Open(ctx, alice, mailbox.CategoryMessage, dialogue.List{Direct: []string{bob}}, m)
	if err != nil {
		t.Fatal(err)
	}
	const senders, each = 8, 8
	var wg sync.WaitGroup
	for i := range senders {
		wg.Go(func() {
			for range each {
				r := text("r")
				r.Type = "numbered"
				if _, err := e.replica(i).Reply(ctx, bob, open.MessageID, false, r); err != nil {
					t.Errorf("Reply: %v", err)
				}
			}
		})
	}
	wg.Wait()
	var got []string
	for _, msg := range e.mail.of(alice) {
		got = append(got, string(msg.Body))
	}
	want := make([]string, senders*each)
	for i := range want {
		want[i] = fmt.Sprint(i + 2) // the opener was 1
	}
	if !slices.Equal(got, want) {
		t.Errorf("alice's mailbox in cursor order = %v, want %v", got, want)
	}
}

// A dialogue its initiator closed is removed by SweepDialogues once it has
// been closed for the retention, not before; a reply to it is then refused
// as not received. An open dialogue stays however old.
func TestSweepDialogues_removesClosedDialoguesAfterTheRetention(t *testing.T) {
	now := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	e := newEnv(t, dialogue.Options{Now: clock, Retention: time.Hour})
	ctx := t.Context()
	closed, kept := e.open(t, bob), e.open(t, bob)
	now = now.Add(30 * time.Minute) // the retention counts from the close, not the opening
	if _, err := e.svc.Close(ctx, alice, closed.DialogueID); err != nil {
		t.Fatal(err)
	}
	now = now.Add(59 * time.Minute) // closed for 59 min
	if n, err := e.svc.SweepDialogues(ctx); err != nil || n != 0 {
		t.Fatalf("SweepDialogues 59 min after the close = %d, %v; want 0", n, err)
	}
	now = now.Add(2 * time.Minute)
	if n, err := e.svc.SweepDialogues(ctx); err != nil || n != 1 {
		t.Fatalf("SweepDialogues 61 min after the close = %d, %v; want 1", n, err)
	}
	if _, err := e.svc.Reply(ctx, bob, closed.MessageID, false, text("late")); !errors.Is(err, dialogue.ErrNotReceived) {
		t.Errorf("Reply in a swept dialogue = %v, want ErrNotReceived", err)
	}
	if _, err := e.svc.Reply(ctx, bob, kept.MessageID, false, text("still here")); err != nil {
		t.Errorf("Reply in the open dialogue after the sweep: %v", err)
	}
}
