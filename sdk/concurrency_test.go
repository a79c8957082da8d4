package sdk_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/sdk"
)

// inDialogue is a new_message to bob at cursor, with id m<cursor>, in
// dialogue.
func inDialogue(cursor uint64, dialogue string) *dispatcherv1.NetworkMessage {
	m := netMsg(cursor, fmt.Sprintf("m%d", cursor), sdk.Message{Recipient: bob, Type: "new_message", Category: sdk.CategoryMessage})
	m.DialogueId = dialogue
	return m
}

var inbox = sdk.RouteKey{Type: "new_message", Category: sdk.CategoryMessage}

// expectN takes n values from the agent's inbox route, in the order they
// came.
func expectN(t *testing.T, a *sdk.NetworkAgent, n int) []string {
	t.Helper()
	var got []string
	for range n {
		v, err := a.Expect(t.Context(), "inbox", 30*time.Second)
		if err != nil {
			t.Fatalf("Expect after %v: %v", got, err)
		}
		got = append(got, v.(string))
	}
	return got
}

// waitAck waits until the fake has an acknowledgement of cursor, failing
// with the ones it has after 30 s.
func waitAck(t *testing.T, f *fakeMailbox, cursor uint64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second) // bounds a broken run only
	for f.lastAck() != cursor {
		if time.Now().After(deadline) {
			f.mu.Lock()
			defer f.mu.Unlock()
			t.Fatalf("acknowledged cursors %v, want the last to be %d", f.acks, cursor)
		}
		time.Sleep(time.Millisecond)
	}
}

// Under Concurrency, messages of one dialogue are still handled one at a
// time in mailbox order, every message is handled once, and the last
// cursor is acknowledged.
func TestNetworkAgent_concurrencyKeepsEachDialoguesOrder(t *testing.T) {
	var batch []*dispatcherv1.NetworkMessage
	for c := uint64(1); c <= 60; c++ {
		batch = append(batch, inDialogue(c, fmt.Sprintf("d%d", c%5)))
	}
	f := &fakeMailbox{script: []connScript{{send: [][]*dispatcherv1.NetworkMessage{batch[:30], batch[30:]}}}}
	a := newAgent(t, f, bob, sdk.NetworkOptions{Concurrency: 4, AckDelay: time.Millisecond})
	var (
		mu      sync.Mutex
		active  = map[string]int{}
		order   = map[string][]uint64{}
		overlap []string
	)
	err := a.Handle(inbox, "inbox", func(_ context.Context, m sdk.Message) (any, error) {
		mu.Lock()
		active[m.DialogueID]++
		if active[m.DialogueID] > 1 {
			overlap = append(overlap, m.ID)
		}
		order[m.DialogueID] = append(order[m.DialogueID], m.Cursor)
		mu.Unlock()
		runtime.Gosched() // a chance for another handler of the dialogue, were one running
		mu.Lock()
		active[m.DialogueID]--
		mu.Unlock()
		return m.ID, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := runAgent(t, a)
	got := expectN(t, a, 60)
	waitAck(t, f, 60)
	stop()
	slices.Sort(got)
	if n := len(slices.Compact(got)); n != 60 {
		t.Errorf("%d distinct messages handled, want 60", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(overlap) > 0 {
		t.Errorf("messages %v were handled while another of their dialogue was", overlap)
	}
	for d, cs := range order {
		if !slices.IsSorted(cs) {
			t.Errorf("dialogue %s handled in order %v, want mailbox order", d, cs)
		}
	}
	if a.Cursor() != 60 {
		t.Errorf("Cursor() = %d, want 60", a.Cursor())
	}
}

// A handler that waits on one dialogue does not hold up another's: the
// first message's handler returns only after the second's ran, which the
// default of one at a time would never reach.
func TestNetworkAgent_concurrencyOverlapsDialogues(t *testing.T) {
	f := &fakeMailbox{script: []connScript{{send: [][]*dispatcherv1.NetworkMessage{{inDialogue(1, "a"), inDialogue(2, "b")}}}}}
	a := newAgent(t, f, bob, sdk.NetworkOptions{Concurrency: 2})
	bRan := make(chan struct{})
	err := a.Handle(inbox, "inbox", func(ctx context.Context, m sdk.Message) (any, error) {
		if m.DialogueID == "b" {
			close(bRan)
			return m.ID, nil
		}
		select {
		case <-bRan:
			return m.ID, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer runAgent(t, a)()
	got := expectN(t, a, 2) // one at a time, m1 would wait here for good
	slices.Sort(got)
	if fmt.Sprint(got) != "[m1 m2]" {
		t.Errorf("handled %v, want [m1 m2]", got)
	}
}

// A slow handler on an early message holds the acknowledged cursor (and
// Cursor()) below it while later messages of other dialogues are done, so
// the server keeps it for a new agent; a reconnect does not receive again
// what this process has taken in, and a redelivered id is dropped.
func TestNetworkAgent_concurrencyAcknowledgesOnlyBelowUnfinishedHandlers(t *testing.T) {
	hold := make(chan struct{})
	f := &fakeMailbox{script: []connScript{
		{
			send: [][]*dispatcherv1.NetworkMessage{{inDialogue(1, "x"), inDialogue(2, "a"), inDialogue(3, "x"), inDialogue(4, "b"), inDialogue(5, "c"), inDialogue(6, "c")}},
			hold: hold, err: status.Error(codes.Unavailable, "server restarting"),
		},
		{send: [][]*dispatcherv1.NetworkMessage{{inDialogue(6, "c"), inDialogue(7, "d")}}},
	}}
	// No acknowledgement goes out on a timer: only when a stream ends and
	// when Run returns, so each one's cursor is known.
	a := newAgent(t, f, bob, sdk.NetworkOptions{Concurrency: 4, AckDelay: time.Hour})
	release := make(chan struct{})
	err := a.Handle(inbox, "inbox", func(_ context.Context, m sdk.Message) (any, error) {
		if m.ID == "m2" {
			<-release
		}
		return m.ID, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := runAgent(t, a)
	got := expectN(t, a, 5)
	slices.Sort(got)
	if fmt.Sprint(got) != "[m1 m3 m4 m5 m6]" {
		t.Fatalf("handled %v while m2's handler waits, want [m1 m3 m4 m5 m6]", got)
	}
	// m3 came after m1 in its dialogue and m6 after m5, so m1 and m5 are
	// fully done: only m2 holds the cursor at 1.
	if c := a.Cursor(); c != 1 {
		t.Errorf("Cursor() with m2 unfinished = %d, want 1", c)
	}
	close(hold) // the stream ends: its acknowledger sends what is handled
	waitAck(t, f, 1)
	if got := expectN(t, a, 1); got[0] != "m7" {
		t.Errorf("after the reconnect handled %v, want m7 (m6 again dropped)", got)
	}
	close(release)
	if got := expectN(t, a, 1); got[0] != "m2" {
		t.Errorf("after the release handled %v, want m2", got)
	}
	stop()
	if v, err := a.Expect(t.Context(), "inbox", 0); !errors.Is(err, sdk.ErrNothingExpected) {
		t.Errorf("Expect with nothing queued = %v, %v; want ErrNothingExpected (m6 handled once)", v, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.acks[0] != 1 || f.acks[len(f.acks)-1] != 7 {
		t.Errorf("acknowledged cursors %v, want 1 first (m2 unfinished) and 7 last", f.acks)
	}
	if len(f.requests) < 2 || f.requests[1].GetAfterCursor() != 6 {
		t.Errorf("reconnect request = %v, want after cursor 6 (what this process took in)", f.requests)
	}
	if a.Cursor() != 7 {
		t.Errorf("Cursor() after Run = %d, want 7", a.Cursor())
	}
}

// Run returns only after the handlers in flight return, and then
// acknowledges what they handled.
func TestNetworkAgent_concurrencyRunWaitsForHandlersThenAcknowledges(t *testing.T) {
	f := &fakeMailbox{script: []connScript{{send: [][]*dispatcherv1.NetworkMessage{{inDialogue(1, "a"), inDialogue(2, "b")}}}}}
	a := newAgent(t, f, bob, sdk.NetworkOptions{Concurrency: 2, AckDelay: time.Hour})
	var finished atomic.Bool
	started := make(chan struct{})
	err := a.Handle(inbox, "inbox", func(ctx context.Context, m sdk.Message) (any, error) {
		if m.ID == "m1" {
			close(started)
			<-ctx.Done() // until Run's context ends
			finished.Store(true)
		}
		return m.ID, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := runAgent(t, a)
	if got := expectN(t, a, 1); got[0] != "m2" {
		t.Fatalf("handled %v, want m2 while m1's handler waits", got)
	}
	recv(t, started, "start of m1's handler") // one not started when Run ends is left for later
	stop()
	if !finished.Load() {
		t.Error("Run returned before m1's handler did")
	}
	if c := f.lastAck(); c != 2 {
		t.Errorf("last acknowledgement after Run = %d, want 2", c)
	}
}

// A message a Run took in but never started is received again by the next
// Run, with the messages after it that were handled already: those are
// dropped as seen, and their cursors are acknowledged all the same once
// the message before them is handled, as the default of one at a time
// does. Otherwise the server keeps them, and a restarted process, which
// has seen nothing, handles them a second time.
func TestNetworkAgent_concurrencyAcknowledgesRedeliveredIDs(t *testing.T) {
	f := &fakeMailbox{script: []connScript{
		// Held open until the first Run ends, so that the second Run's
		// stream is the next.
		{send: [][]*dispatcherv1.NetworkMessage{{inDialogue(1, "x"), inDialogue(2, "x"), inDialogue(3, "y")}}, hold: make(chan struct{})},
		{send: [][]*dispatcherv1.NetworkMessage{{inDialogue(2, "x"), inDialogue(3, "y")}}},
	}}
	a := newAgent(t, f, bob, sdk.NetworkOptions{Concurrency: 2, AckDelay: time.Hour})
	started := make(chan struct{})
	err := a.Handle(inbox, "inbox", func(ctx context.Context, m sdk.Message) (any, error) {
		if m.ID == "m1" {
			close(started)
			<-ctx.Done() // until the first Run ends: m2 waits behind it
			return nil, ctx.Err()
		}
		return m.ID, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := runAgent(t, a)
	if got := expectN(t, a, 1); got[0] != "m3" {
		t.Fatalf("first Run handled %v, want m3 while m1's handler waits", got)
	}
	recv(t, started, "start of m1's handler")
	stop() // m2 never started: left for the next Run
	if c := a.Cursor(); c != 1 {
		t.Fatalf("Cursor() after the first Run = %d, want 1 (m2 not handled)", c)
	}
	stop = runAgent(t, a)
	if got := expectN(t, a, 1); got[0] != "m2" {
		t.Fatalf("second Run handled %v, want m2", got)
	}
	stop()
	if v, err := a.Expect(t.Context(), "inbox", 0); !errors.Is(err, sdk.ErrNothingExpected) {
		t.Errorf("Expect with nothing queued = %v, %v; want ErrNothingExpected (m3 handled once)", v, err)
	}
	if c := f.lastAck(); c != 3 {
		t.Errorf("last acknowledgement after the second Run = %d, want 3 (m3 was handled by the first)", c)
	}
	if c := a.Cursor(); c != 3 {
		t.Errorf("Cursor() after the second Run = %d, want 3", c)
	}
}
