package mailbox_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
	"github.com/parleyhq/parley/services/dispatcher/internal/store/boltstore"
)

const (
	bob   = "clients/c/agents/bob"
	carol = "clients/c/agents/carol"
)

func newMailboxes(t testing.TB, opts mailbox.Options) *mailbox.Mailboxes {
	t.Helper()
	s, err := boltstore.Open(t.TempDir(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if opts.Retention == 0 {
		opts.Retention = 24 * time.Hour // the config's default; New fills in nothing
	}
	return mailbox.New(s, opts)
}

func message(id string) mailbox.Message {
	return mailbox.Message{ID: id, DialogueID: "d1", Category: mailbox.CategoryMessage, Type: "new_message", Body: []byte(`"` + id + `"`)}
}

func appendTo(t *testing.T, m *mailbox.Mailboxes, id string, to ...string) {
	t.Helper()
	if refused, err := m.Append(t.Context(), message(id), to); err != nil || len(refused) != 0 {
		t.Fatalf("Append(%s) = %v, %v", id, refused, err)
	}
}

func TestAppend_rejectsInvalidMessagesAndRecipients(t *testing.T) {
	m := newMailboxes(t, mailbox.Options{})
	tests := []struct {
		name string
		msg  mailbox.Message
		to   []string
	}{
		{"no id", mailbox.Message{DialogueID: "d", Category: mailbox.CategoryMessage, Type: "t"}, []string{bob}},
		{"no dialogue", mailbox.Message{ID: "m", Category: mailbox.CategoryMessage, Type: "t"}, []string{bob}},
		{"no category", mailbox.Message{ID: "m", DialogueID: "d", Type: "t"}, []string{bob}},
		{"no type", mailbox.Message{ID: "m", DialogueID: "d", Category: mailbox.CategoryMessage}, []string{bob}},
		{"empty recipient", message("m"), []string{bob, ""}},
		{"NUL in recipient", message("m"), []string{"clients/c/agents/b\x00x"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := m.Append(t.Context(), tt.msg, tt.to); !errors.Is(err, mailbox.ErrInvalid) {
				t.Errorf("Append(%+v, %q) = %v, want ErrInvalid", tt.msg, tt.to, err)
			}
		})
	}
	if st, _ := m.State(t.Context(), bob); st.Head != 0 {
		t.Errorf("bob's mailbox after refused appends = %+v, want empty", st)
	}
}

func TestAppend_deduplicatesRecipientsAndReportsFullOnes(t *testing.T) {
	m := newMailboxes(t, mailbox.Options{Bound: mailbox.Bound{MaxMessages: 1}})
	appendTo(t, m, "m1", bob, bob)
	refused, err := m.Append(t.Context(), message("m2"), []string{bob, carol})
	if err != nil || len(refused) != 1 || refused[0].Agent != bob || !errors.Is(refused[0].Err, mailbox.ErrFull) {
		t.Fatalf("Append to full bob and empty carol = %v, %v; want bob refused with ErrFull", refused, err)
	}
	got, _ := m.Read(t.Context(), bob, 0, 10)
	if len(got) != 1 || got[0].Message.ID != "m1" {
		t.Errorf("bob's mailbox = %v, want m1 once", got)
	}
}

// receiver runs Receive for agent in the background and hands each
// non-empty batch to the test.
type receiver struct {
	batches chan []mailbox.Delivery
	done    chan error
	cancel  context.CancelFunc
}

func receive(t *testing.T, m *mailbox.Mailboxes, agent string, opts mailbox.ReceiveOptions) *receiver {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	r := &receiver{batches: make(chan []mailbox.Delivery, 100), done: make(chan error, 1), cancel: cancel}
	opts = withStreamDefaults(opts)
	go func() {
		r.done <- m.Receive(ctx, agent, opts, func(b []mailbox.Delivery) error {
			if len(b) > 0 {
				r.batches <- b
			}
			return nil
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-r.done; err == nil {
			t.Error("Receive returned nil; it only ends with an error")
		}
	})
	return r
}

// next waits for deliveries until it has n messages and returns their ids
// with cursors.
func (r *receiver) next(t *testing.T, n int) string {
	t.Helper()
	got := ""
	timeout := time.After(10 * time.Second) // generous: a wakeup is immediate
	for i := 0; i < n; {
		select {
		case b := <-r.batches:
			for _, d := range b {
				got += fmt.Sprintf("%d:%s ", d.Cursor, d.Message.ID)
				i++
			}
		case err := <-r.done:
			t.Fatalf("Receive ended with %v after %q", err, got)
		case <-timeout:
			t.Fatalf("received %q, waiting for %d messages", got, n)
		}
	}
	return got
}

func (r *receiver) end(t *testing.T) error {
	t.Helper()
	select {
	case err := <-r.done:
		r.done <- err // for the cleanup
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("Receive did not end")
		return nil
	}
}

func TestReceive_deliversBacklogThenWakesOnAppend(t *testing.T) {
	m := newMailboxes(t, mailbox.Options{})
	appendTo(t, m, "m1", bob)
	appendTo(t, m, "m2", bob)
	r := receive(t, m, bob, mailbox.ReceiveOptions{Batch: 1})
	if got := r.next(t, 2); got != "1:m1 2:m2 " {
		t.Errorf("backlog = %q, want 1:m1 2:m2", got)
	}
	appendTo(t, m, "m3", bob, carol)
	if got := r.next(t, 1); got != "3:m3 " {
		t.Errorf("after Append = %q, want 3:m3", got)
	}
}

func TestReceive_resumesAfterTheAcknowledgedCursor(t *testing.T) {
	m := newMailboxes(t, mailbox.Options{})
	for _, id := range []string{"m1", "m2", "m3", "m4"} {
		appendTo(t, m, id, bob)
	}
	if _, err := m.Acknowledge(t.Context(), bob, 2); err != nil {
		t.Fatal(err)
	}
	r := receive(t, m, bob, mailbox.ReceiveOptions{})
	if got := r.next(t, 2); got != "3:m3 4:m4 " {
		t.Errorf("after ack 2 = %q, want 3:m3 4:m4", got)
	}
	r.cancel()
	if err := r.end(t); !errors.Is(err, context.Canceled) {
		t.Errorf("Receive after cancel = %v, want context.Canceled", err)
	}
	// A later After than the acknowledged cursor wins.
	r = receive(t, m, bob, mailbox.ReceiveOptions{After: 3})
	if got := r.next(t, 1); got != "4:m4 " {
		t.Errorf("after 3 = %q, want 4:m4", got)
	}
}

func TestReceive_clearBacklogSkipsWhatWasWaiting(t *testing.T) {
	m := newMailboxes(t, mailbox.Options{})
	appendTo(t, m, "old", bob)
	r := receive(t, m, bob, mailbox.ReceiveOptions{ClearBacklog: true})
	// The clear happens before Receive reads; wait for the connection so
	// that the new message is appended after it.
	waitConnected(t, m, 1)
	appendTo(t, m, "new", bob)
	if got := r.next(t, 1); got != "2:new " {
		t.Errorf("with clear backlog = %q, want 2:new", got)
	}
	if st, _ := m.State(t.Context(), bob); st.Acked < 1 {
		t.Errorf("state after clear = %+v, want the old message acknowledged", st)
	}
}

func waitConnected(t *testing.T, m *mailbox.Mailboxes, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for m.Connected() != n {
		if time.Now().After(deadline) {
			t.Fatalf("Connected() = %d, want %d", m.Connected(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestReceive_aSecondConnectionTakesOver(t *testing.T) {
	m := newMailboxes(t, mailbox.Options{})
	appendTo(t, m, "m1", bob)
	first := receive(t, m, bob, mailbox.ReceiveOptions{})
	first.next(t, 1)
	second := receive(t, m, bob, mailbox.ReceiveOptions{})
	if err := first.end(t); !errors.Is(err, mailbox.ErrReplaced) {
		t.Errorf("first Receive after a second connect = %v, want ErrReplaced", err)
	}
	if got := second.next(t, 1); got != "1:m1 " {
		t.Errorf("second connection got %q, want the unacknowledged 1:m1", got)
	}
	appendTo(t, m, "m2", bob)
	if got := second.next(t, 1); got != "2:m2 " {
		t.Errorf("second connection got %q, want 2:m2", got)
	}
	if m.Connected() != 1 {
		t.Errorf("Connected() = %d, want 1", m.Connected())
	}
}

// epochs hands out the epochs given, in order, as another replica's
// sequence would.
type epochs chan uint64

func (e epochs) OpenStream(context.Context, string) (uint64, error) { return <-e, nil }

func (e epochs) CloseStream(context.Context, string, uint64) error { return nil }

func (e epochs) CloseStreams(context.Context, []mailbox.StreamEnd) error { return nil }

// With Streams, the greater epoch wins wherever it opened: a stream that
// took a smaller epoch but connected later is replaced at once, and
// Supersede (a stream on another replica) ends an older one only.
func TestReceive_theGreaterEpochWinsAcrossReplicas(t *testing.T) {
	e := make(epochs, 2)
	m := newMailboxes(t, mailbox.Options{Streams: e})
	appendTo(t, m, "m1", bob)
	e <- 5
	first := receive(t, m, bob, mailbox.ReceiveOptions{})
	first.next(t, 1)
	e <- 4 // took its epoch before first, connected after
	late := receive(t, m, bob, mailbox.ReceiveOptions{})
	if err := late.end(t); !errors.Is(err, mailbox.ErrReplaced) {
		t.Errorf("Receive with an older epoch = %v, want ErrReplaced", err)
	}
	m.Supersede(bob, 3)
	m.Supersede(carol, 9)
	if got := m.StreamEpochs(); len(got) != 1 || got[bob] != 5 {
		t.Errorf("StreamEpochs() after older or other agents' streams = %v, want bob at 5", got)
	}
	appendTo(t, m, "m2", bob)
	if got := first.next(t, 1); got != "2:m2 " {
		t.Errorf("stream of epoch 5 got %q, want 2:m2", got)
	}
	m.Supersede(bob, 6)
	if err := first.end(t); !errors.Is(err, mailbox.ErrReplaced) {
		t.Errorf("Receive after a newer stream elsewhere = %v, want ErrReplaced", err)
	}
	if m.Connected() != 0 {
		t.Errorf("Connected() = %d, want 0", m.Connected())
	}
}

// Recheck ends the streams the store no longer names: one whose row is
// gone (bob: a newer stream came and went elsewhere) or names another
// stream (carol), each ErrReplaced as a takeover; one the store names
// (dave) stays, and so does one that connected after the check (bob's next
// stream: its epoch is not the one checked).
func TestRecheck_endsTheStreamsTheStoreNoLongerNames(t *testing.T) {
	const dave = "clients/d/agents/dave"
	e := make(epochs, 4)
	m := newMailboxes(t, mailbox.Options{Streams: e})
	rs := map[string]*receiver{}
	for i, agent := range []string{bob, carol, dave} {
		appendTo(t, m, fmt.Sprint("m-", i), agent)
		e <- uint64(10 + i)
		rs[agent] = receive(t, m, agent, mailbox.ReceiveOptions{})
		rs[agent].next(t, 1)
	}
	checked := m.StreamEpochs()
	e <- 20
	later := receive(t, m, bob, mailbox.ReceiveOptions{}) // bob again, after the check
	if err := rs[bob].end(t); !errors.Is(err, mailbox.ErrReplaced) {
		t.Fatalf("bob's first stream after his second connected = %v, want ErrReplaced", err)
	}
	m.Recheck(checked, map[string]uint64{carol: 99, dave: checked[dave]})
	if err := rs[carol].end(t); !errors.Is(err, mailbox.ErrReplaced) {
		t.Errorf("carol's stream, its row naming another = %v, want ErrReplaced", err)
	}
	if got := m.StreamEpochs(); len(got) != 2 || got[dave] != 12 || got[bob] != 20 {
		t.Errorf("StreamEpochs() after Recheck = %v, want dave at 12 (named) and bob at 20 (connected after the check)", got)
	}
	appendTo(t, m, "m-later", bob)
	if got := later.next(t, 2); got != "1:m-0 2:m-later " {
		t.Errorf("bob's later stream got %q, want its backlog and then 2:m-later", got)
	}
}

// notifiedMeanwhile hands out epoch 5 after another replica's stream of
// epoch 6 was announced (Supersede): the notification overtook the
// older stream, which took its epoch first but had not connected yet.
type notifiedMeanwhile struct{ m **mailbox.Mailboxes }

func (n notifiedMeanwhile) OpenStream(_ context.Context, agent string) (uint64, error) {
	(*n.m).Supersede(agent, 6)
	return 5, nil
}

func (n notifiedMeanwhile) CloseStream(context.Context, string, uint64) error { return nil }

func (n notifiedMeanwhile) CloseStreams(context.Context, []mailbox.StreamEnd) error { return nil }

// closedStreams hands out epochs 1, 2, ... and records the streams
// closed, as "agent@epoch": one by one in closed, in batches in batched
// (one call each).
type closedStreams struct {
	mu      sync.Mutex
	epoch   uint64
	closed  []string
	batched [][]string
}

func (c *closedStreams) OpenStream(context.Context, string) (uint64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.epoch++
	return c.epoch, nil
}

func (c *closedStreams) CloseStream(ctx context.Context, agent string, epoch uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	c.closed = append(c.closed, fmt.Sprintf("%s@%d", agent, epoch))
	return nil
}

func (c *closedStreams) CloseStreams(ctx context.Context, ended []mailbox.StreamEnd) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var b []string
	for _, e := range ended {
		b = append(b, fmt.Sprintf("%s@%d", e.Agent, e.Epoch))
	}
	c.batched = append(c.batched, b)
	return nil
}

func (c *closedStreams) batches() [][]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.batched)
}

func (c *closedStreams) list() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.closed)
}

// waitStream waits until agent's stream of epoch is connected to m.
func waitStream(t *testing.T, m *mailbox.Mailboxes, agent string, epoch uint64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for m.StreamEpochs()[agent] != epoch {
		if time.Now().After(deadline) {
			t.Fatalf("streams connected = %v, want %s at %d", m.StreamEpochs(), agent, epoch)
		}
		time.Sleep(time.Millisecond)
	}
}

// A stream that ends (its caller gone) is closed in Streams, with its
// epoch, even though its context ended; a stream replaced by a newer one,
// here or on another replica, is not: the newer one's record stays.
func TestReceive_closesItsStreamWhenItEnds(t *testing.T) {
	cs := &closedStreams{}
	m := newMailboxes(t, mailbox.Options{Streams: cs})
	first := receive(t, m, bob, mailbox.ReceiveOptions{}) // epoch 1
	waitStream(t, m, bob, 1)
	second := receive(t, m, bob, mailbox.ReceiveOptions{}) // epoch 2 replaces 1
	if err := first.end(t); !errors.Is(err, mailbox.ErrReplaced) {
		t.Fatalf("first Receive = %v, want ErrReplaced", err)
	}
	waitStream(t, m, bob, 2)
	m.Supersede(bob, 7) // a newer stream elsewhere
	if err := second.end(t); !errors.Is(err, mailbox.ErrReplaced) {
		t.Fatalf("second Receive = %v, want ErrReplaced", err)
	}
	if got := cs.list(); len(got) != 0 {
		t.Errorf("streams closed after two replaced = %v, want none", got)
	}
	third := receive(t, m, carol, mailbox.ReceiveOptions{}) // epoch 3
	waitStream(t, m, carol, 3)
	third.cancel()
	if err := third.end(t); !errors.Is(err, context.Canceled) {
		t.Fatalf("third Receive = %v, want context.Canceled", err)
	}
	if got := cs.list(); !slices.Equal(got, []string{carol + "@3"}) {
		t.Errorf("streams closed after carol's ended = %v, want [%s@3]", got, carol)
	}
}

// The streams that a stopping server ends are closed in one batch by
// EndStreams (a statement per thousand streams in PostgreSQL), not one by
// one; a stream replaced meanwhile is not closed at all, and a stream that
// ends after EndStreams returned is closed on its own again.
func TestEndStreams_closesTheStreamsOfAStoppingServerInOneBatch(t *testing.T) {
	cs := &closedStreams{}
	m := newMailboxes(t, mailbox.Options{Streams: cs})
	stop := make(chan struct{})
	const n = 40
	var (
		rs   []*receiver
		want []string
	)
	for i := range n {
		agent := fmt.Sprintf("clients/c/agents/a%02d", i)
		rs = append(rs, receive(t, m, agent, mailbox.ReceiveOptions{Stop: stop}))
		waitStream(t, m, agent, uint64(i+1))
		want = append(want, fmt.Sprintf("%s@%d", agent, i+1))
	}
	m.Supersede("clients/c/agents/a00", 1000) // replaced elsewhere: its row is the newer stream's
	want = want[1:]
	close(stop)
	for i, r := range rs {
		if err := r.end(t); !errors.Is(err, mailbox.ErrStopping) && (i > 0 || !errors.Is(err, mailbox.ErrReplaced)) {
			t.Fatalf("Receive %d after stop = %v, want ErrStopping", i, err)
		}
	}
	if got := cs.list(); len(got) != 0 {
		t.Errorf("streams closed one by one while stopping = %v, want none", got)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second) // generous: a failure, not a measure
	defer cancel()
	if err := m.EndStreams(ctx); err != nil {
		t.Fatalf("EndStreams = %v", err)
	}
	b := cs.batches()
	if len(b) != 1 {
		t.Fatalf("CloseStreams calls = %d (%v), want 1", len(b), b)
	}
	slices.Sort(b[0])
	if !slices.Equal(b[0], want) {
		t.Errorf("streams closed in the batch = %v, want %v", b[0], want)
	}
	late := receive(t, m, bob, mailbox.ReceiveOptions{Stop: stop})
	if err := late.end(t); !errors.Is(err, mailbox.ErrStopping) {
		t.Fatalf("Receive opened after the stop = %v, want ErrStopping", err)
	}
	if got := cs.list(); !slices.Equal(got, []string{fmt.Sprintf("%s@%d", bob, n+1)}) {
		t.Errorf("streams closed one by one after EndStreams = %v, want [%s@%d]", got, bob, n+1)
	}
}

// A newer stream announced between an older stream's OpenStream and its
// connection ends the older one as it connects: otherwise both replicas
// would keep a stream of the agent.
func TestReceive_aNewerStreamAnnouncedWhileOpeningWins(t *testing.T) {
	var m *mailbox.Mailboxes
	m = newMailboxes(t, mailbox.Options{Streams: notifiedMeanwhile{&m}})
	r := receive(t, m, bob, mailbox.ReceiveOptions{})
	if err := r.end(t); !errors.Is(err, mailbox.ErrReplaced) {
		t.Errorf("Receive of epoch 5 with 6 announced while it opened = %v, want ErrReplaced", err)
	}
	if m.Connected() != 0 {
		t.Errorf("Connected() = %d, want 0", m.Connected())
	}
}

func TestReceive_endsWhenTheServerStops(t *testing.T) {
	m := newMailboxes(t, mailbox.Options{})
	stop := make(chan struct{})
	r := receive(t, m, bob, mailbox.ReceiveOptions{Stop: stop})
	close(stop)
	if err := r.end(t); !errors.Is(err, mailbox.ErrStopping) {
		t.Errorf("Receive after stop = %v, want ErrStopping", err)
	}
	if m.Connected() != 0 {
		t.Errorf("Connected() after the end = %d, want 0", m.Connected())
	}
}

func TestReceive_sendsKeepalivesWhenIdle(t *testing.T) {
	m := newMailboxes(t, mailbox.Options{})
	empty := make(chan struct{}, 1)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- m.Receive(ctx, bob, withStreamDefaults(mailbox.ReceiveOptions{Keepalive: time.Millisecond}), func(b []mailbox.Delivery) error {
			if len(b) == 0 {
				select {
				case empty <- struct{}{}:
				default:
				}
			}
			return nil
		})
	}()
	select {
	case <-empty:
	case <-time.After(10 * time.Second):
		t.Error("no keepalive (empty batch) within 10s at a 1ms interval")
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Receive after cancel = %v, want context.Canceled", err)
	}
}

func TestReceive_endsWithSendsError(t *testing.T) {
	m := newMailboxes(t, mailbox.Options{})
	appendTo(t, m, "m1", bob)
	boom := errors.New("client gone")
	if err := m.Receive(t.Context(), bob, withStreamDefaults(mailbox.ReceiveOptions{}), func([]mailbox.Delivery) error { return boom }); !errors.Is(err, boom) {
		t.Errorf("Receive with failing send = %v, want its error", err)
	}
}

func TestCompact_keepsMessagesWithinTheRetention(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	m := newMailboxes(t, mailbox.Options{Retention: time.Hour, Now: func() time.Time { return now }})
	appendTo(t, m, "m1", bob)
	if _, err := m.ClearBacklog(t.Context(), bob); err != nil {
		t.Fatal(err)
	}
	if n, err := m.Compact(t.Context(), 10); err != nil || n != 0 {
		t.Errorf("Compact within the retention = %d, %v; want 0", n, err)
	}
	now = now.Add(61 * time.Minute)
	if n, err := m.Compact(t.Context(), 10); err != nil || n != 1 {
		t.Errorf("Compact past the retention = %d, %v; want 1", n, err)
	}
}

// withStreamDefaults fills the stream options a test leaves zero with the
// config's defaults (batch 100, keepalive 30 s); Receive fills in nothing.
func withStreamDefaults(o mailbox.ReceiveOptions) mailbox.ReceiveOptions {
	if o.Batch == 0 {
		o.Batch = 100
	}
	if o.Keepalive == 0 {
		o.Keepalive = 30 * time.Second
	}
	return o
}
