package sdk

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// gatedHandler is a handler that records each message it starts and then
// waits until the test releases that message's id.
type gatedHandler struct {
	mu      sync.Mutex
	active  map[string]int // handlers running, by dialogue
	most    int            // the most handlers running at once
	running int
	order   map[string][]uint64 // cursors started, by dialogue
	overlap []string            // dialogues that had two handlers at once
	gates   map[string]chan struct{}
	started chan string
}

func newGatedHandler() *gatedHandler {
	return &gatedHandler{
		active: map[string]int{}, order: map[string][]uint64{}, gates: map[string]chan struct{}{},
		started: make(chan string, 100),
	}
}

func (g *gatedHandler) gate(id string) chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.gates[id] == nil {
		g.gates[id] = make(chan struct{})
	}
	return g.gates[id]
}

func (g *gatedHandler) handle(_ context.Context, m Message) {
	g.mu.Lock()
	g.active[m.DialogueID]++
	if g.active[m.DialogueID] > 1 {
		g.overlap = append(g.overlap, m.DialogueID)
	}
	g.running++
	g.most = max(g.most, g.running)
	g.order[m.DialogueID] = append(g.order[m.DialogueID], m.Cursor)
	g.mu.Unlock()
	g.started <- m.ID
	<-g.gate(m.ID)
	g.mu.Lock()
	g.active[m.DialogueID]--
	g.running--
	g.mu.Unlock()
}

func msg(cursor uint64, dialogue string) Message {
	return Message{ID: fmt.Sprintf("m%d", cursor), DialogueID: dialogue, Cursor: cursor}
}

// recvWithin returns the next value from ch, failing the test when none
// comes in 30 s (a hung run, not a timing assertion).
func recvWithin[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(30 * time.Second):
		t.Fatalf("no %s within 30 s", what)
		var zero T
		return zero
	}
}

// With every handler busy and the waiting messages at their bound, taking
// in one more waits (here: fails on a cancelled context); handlers never
// exceed the limit, one dialogue's run one at a time in order, and once
// all are done no per-dialogue state is left.
func TestDialogues_boundsHandlersAndWaitingMessages(t *testing.T) {
	g := newGatedHandler()
	marks := make(chan uint64, 100)
	d := newDialogues(2, g.handle, func(w uint64) { marks <- w })
	ctx := t.Context()
	if err := d.dispatch(ctx, msg(1, "a")); err != nil {
		t.Fatal(err)
	}
	if err := d.dispatch(ctx, msg(2, "b")); err != nil {
		t.Fatal(err)
	}
	recvWithin(t, g.started, "start of m1")
	recvWithin(t, g.started, "start of m2")
	// 2 running; the bound lets 4 per handler wait: 8 more.
	dialogues := []string{"a", "a", "b", "c", "c", "d", "e", "a"}
	for i, dlg := range dialogues {
		if err := d.dispatch(ctx, msg(uint64(3+i), dlg)); err != nil {
			t.Fatalf("dispatch #%d = %v, want it taken in under the bound", 3+i, err)
		}
	}
	full, cancel := context.WithCancel(ctx)
	cancel()
	if err := d.dispatch(full, msg(11, "f")); err == nil {
		t.Fatal("dispatch past the bound with a cancelled context = nil, want it to have waited for room")
	}
	d.mu.Lock()
	running, waiting := d.running, d.waiting
	d.mu.Unlock()
	if running != 2 || waiting != 8 {
		t.Errorf("running, waiting = %d, %d; want 2, 8", running, waiting)
	}
	for c := uint64(1); c <= 10; c++ {
		close(g.gate(fmt.Sprintf("m%d", c)))
	}
	for {
		if w := recvWithin(t, marks, "watermark"); w == 10 {
			break
		}
	}
	deadline := time.Now().Add(30 * time.Second) // bounds a broken run only
	for {
		d.mu.Lock()
		lanes, running := len(d.lanes), d.running
		d.mu.Unlock()
		if lanes == 0 && running == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after every handler returned: %d dialogues and %d handlers left, want none", lanes, running)
		}
		time.Sleep(time.Millisecond)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.most > 2 {
		t.Errorf("%d handlers ran at once, want at most 2", g.most)
	}
	if len(g.overlap) > 0 {
		t.Errorf("dialogues %v had two handlers at once", g.overlap)
	}
	want := map[string]string{"a": "[1 3 4 10]", "b": "[2 5]", "c": "[6 7]", "d": "[8]", "e": "[9]"}
	for dlg, w := range want {
		if got := fmt.Sprint(g.order[dlg]); got != w {
			t.Errorf("dialogue %s handled %s, want %s", dlg, got, w)
		}
	}
}

// The watermark is the highest cursor at and below which every message
// taken in is handled: later messages done before an earlier one do not
// move it.
func TestDialogues_watermarkWaitsForTheEarliestUnfinished(t *testing.T) {
	g := newGatedHandler()
	marks := make(chan uint64, 100)
	d := newDialogues(3, g.handle, func(w uint64) { marks <- w })
	for i, dlg := range []string{"a", "b", "c"} {
		if err := d.dispatch(t.Context(), msg(uint64(1+i)*10, dlg)); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		recvWithin(t, g.started, "a start")
	}
	close(g.gate("m20"))
	close(g.gate("m30"))
	for range 2 {
		if w := recvWithin(t, marks, "watermark"); w != 0 {
			t.Fatalf("watermark %d with m10 unfinished, want 0", w)
		}
	}
	close(g.gate("m10"))
	if w := recvWithin(t, marks, "watermark"); w != 30 {
		t.Errorf("watermark after m10 = %d, want 30", w)
	}
}

// When the context ends, handlers running finish, the messages waiting
// are not started, and drop returns them, oldest first.
func TestDialogues_stopsStartingWhenTheContextEnds(t *testing.T) {
	g := newGatedHandler()
	d := newDialogues(1, g.handle, func(uint64) {})
	ctx, cancel := context.WithCancel(t.Context())
	for i, dlg := range []string{"a", "b", "a"} {
		if err := d.dispatch(ctx, msg(uint64(1+i), dlg)); err != nil {
			t.Fatal(err)
		}
	}
	recvWithin(t, g.started, "start of m1")
	cancel()
	close(g.gate("m1"))
	d.wait()
	var ids []string
	for _, m := range d.drop() {
		ids = append(ids, m.ID)
	}
	if fmt.Sprint(ids) != "[m2 m3]" {
		t.Errorf("drop() = %v, want [m2 m3]", ids)
	}
	if len(g.started) != 0 {
		t.Errorf("a message started after the context ended")
	}
}
