package pgstore_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/platform/pgdb/pgdbtest"
	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
	"github.com/parleyhq/parley/services/dispatcher/internal/store/pgstore"
)

// replicas opens n stores on one schema, as n dispatcher replicas would.
func replicas(t *testing.T, n int) []*pgstore.Store {
	t.Helper()
	url, schema := pgdbtest.Schema(t)
	return replicasOn(t, url, schema, n)
}

// replicasOn is replicas on the schema given.
func replicasOn(t *testing.T, url, schema string, n int) []*pgstore.Store {
	t.Helper()
	out := make([]*pgstore.Store, n)
	for i := range out {
		s, err := pgstore.Open(t.Context(), url, schema, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		out[i] = s
	}
	return out
}

// Appends to one mailbox racing through two replicas each get their own
// cursor: the mailbox holds every message once, at cursors 1..n.
func TestAppendMessage_concurrentReplicasGiveDistinctCursors(t *testing.T) {
	rs := replicas(t, 2)
	const n = 40
	const bob = "clients/c/agents/bob"
	t0 := time.Unix(1_800_000_000, 0)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			m := mailbox.Message{ID: fmt.Sprintf("m%02d", i), DialogueID: "d", Category: mailbox.CategoryMessage, Type: "t", Body: []byte(`1`), Time: t0}
			// alice in every fan-out too: two rows locked per append.
			if _, _, err := rs[i%2].AppendMessage(t.Context(), m, []string{bob, "clients/c/agents/alice"}, mailbox.Bound{}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	got, err := rs[0].ReadMailbox(t.Context(), bob, 0, 2*n)
	if err != nil {
		t.Fatal(err)
	}
	var cursors []uint64
	ids := map[string]bool{}
	for _, d := range got {
		cursors = append(cursors, d.Cursor)
		ids[d.Message.ID] = true
	}
	want := make([]uint64, n)
	for i := range want {
		want[i] = uint64(i + 1)
	}
	if !slices.Equal(cursors, want) || len(ids) != n {
		t.Errorf("bob's mailbox after %d racing appends: cursors %v, %d distinct messages; want 1..%d, %d", n, cursors, len(ids), n, n)
	}
	st, err := rs[1].GetMailbox(t.Context(), bob)
	if err != nil || st.Head != n || st.Pending != n {
		t.Errorf("GetMailbox(bob) = %+v, %v; want head and pending %d", st, err, n)
	}
}

// An agent receiving on replica B gets, in order and without waiting for
// a keepalive, the messages appended through replica A: A's commits notify
// B, which wakes the agent's stream.
func TestReceive_onOneReplicaGetsWhatAnotherAppends(t *testing.T) {
	rs := replicas(t, 2)
	const bob = "clients/c/agents/bob"
	a := mailbox.New(rs[0], mailbox.Options{})
	b := mailbox.New(rs[1], mailbox.Options{})
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	wg.Go(func() { rs[1].Listen(ctx, slog.New(slog.DiscardHandler), pgstore.Wakeups{Mailboxes: b.Nudge}) })
	got := make(chan mailbox.Delivery, 16)
	wg.Go(func() {
		// A keepalive of an hour: only a wake-up delivers within the test.
		_ = b.Receive(ctx, bob, mailbox.ReceiveOptions{Batch: 10, Keepalive: time.Hour}, func(ds []mailbox.Delivery) error {
			for _, d := range ds {
				got <- d
			}
			return nil
		})
	})
	appendOn := func(mb *mailbox.Mailboxes, id string) {
		m := mailbox.Message{ID: id, DialogueID: "d", Category: mailbox.CategoryMessage, Type: "t", Body: []byte(`1`)}
		if _, err := mb.Append(t.Context(), m, []string{bob}); err != nil {
			t.Fatal(err)
		}
	}
	expect := func(ids ...string) {
		t.Helper()
		for _, id := range ids {
			select {
			case d := <-got:
				if d.Message.ID != id {
					t.Fatalf("B delivered %s at cursor %d, want %s", d.Message.ID, d.Cursor, id)
				}
			case <-time.After(30 * time.Second): // generous: a failure, not a measure
				t.Fatalf("B did not deliver %s, appended through A", id)
			}
		}
	}
	// m1 may reach B by its first read; once B has sent it, its stream
	// waits, and only a wake-up delivers what follows.
	appendOn(a, "m1")
	expect("m1")
	appendOn(a, "m2")
	appendOn(b, "m3") // B's own append, handed over directly, after A's
	appendOn(a, "m4")
	expect("m2", "m3", "m4")
}

// A routine or tool changed through one replica is named to the others,
// which drop their cached copy (hosted.Set.Changed).
func TestListen_namesRoutinesAndToolsChangedElsewhere(t *testing.T) {
	rs := replicas(t, 2)
	names := make(chan string, 16)
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	wg.Go(func() {
		rs[1].Listen(ctx, slog.New(slog.DiscardHandler), pgstore.Wakeups{Routines: func(name string) { names <- name }})
	})
	expect := func(want string) {
		t.Helper()
		select {
		case got := <-names:
			if got != want {
				t.Fatalf("B was told of %q, want %q", got, want)
			}
		case <-time.After(30 * time.Second): // generous: a failure, not a measure
			t.Fatalf("B was not told of %q", want)
		}
	}
	expect("") // B listens: "anything may have changed" on connecting
	const routine = "clients/c/agents/a/routines/steps"
	now := time.Unix(1_800_000_000, 0)
	if _, err := rs[0].SetRoutine(t.Context(), routine, "x = 1", now); err != nil {
		t.Fatal(err)
	}
	expect(routine)
	if _, err := rs[0].RecordRoutineRun(t.Context(), routine, 1, "boom", dispatcherv1.RoutineFailureKind_ROUTINE_FAILURE_KIND_TIME, 1); err != nil {
		t.Fatal(err)
	}
	expect(routine) // quarantined on A: B must stop running it
	if _, err := rs[0].SetTool(t.Context(), &dispatcherv1.Tool{Name: "clients/c/agents/a/tools/lookup"}, now); err != nil {
		t.Fatal(err)
	}
	expect("clients/c/agents/a/tools/lookup")
}

// Streams opened through two replicas take increasing epochs, each named
// to the other replica with its agent; StreamEpochs keeps the newest per
// agent, for a replica that missed the notification.
func TestOpenStream_ordersStreamsAcrossReplicas(t *testing.T) {
	rs := replicas(t, 2)
	type opened struct {
		agent string
		epoch uint64
	}
	heard := make(chan opened, 16)
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	wg.Go(func() {
		rs[1].Listen(ctx, slog.New(slog.DiscardHandler), pgstore.Wakeups{Streams: func(agent string, epoch uint64) { heard <- opened{agent, epoch} }})
	})
	expect := func(want opened) {
		t.Helper()
		select {
		case got := <-heard:
			if got != want {
				t.Fatalf("B heard %+v, want %+v", got, want)
			}
		case <-time.After(30 * time.Second): // generous: a failure, not a measure
			t.Fatalf("B did not hear %+v", want)
		}
	}
	expect(opened{}) // B listens: "anything may have changed" on connecting
	const bob = "clients/c/agents/bob"
	onB, err := rs[1].OpenStream(t.Context(), bob) // B's own: not named to B
	if err != nil {
		t.Fatal(err)
	}
	onA, err := rs[0].OpenStream(t.Context(), bob)
	if err != nil || onA <= onB {
		t.Fatalf("OpenStream on A after B = %d, %v; want an epoch after %d", onA, err, onB)
	}
	expect(opened{bob, onA})
	got, err := rs[1].StreamEpochs(t.Context(), []string{bob, "clients/c/agents/carol"})
	if err != nil || len(got) != 1 || got[bob] != onA {
		t.Errorf("StreamEpochs = %v, %v; want bob at %d", got, err, onA)
	}
}

// An ended stream's row goes unless a newer stream replaced it; a row
// stamped by its replica (TouchStreams) outlives SweepStreams, and one
// nobody stamped for longer than the age (a dead replica's) does not.
func TestCloseStream_andSweepKeepOnlyLiveStreams(t *testing.T) {
	rs := replicas(t, 2)
	ctx := t.Context()
	const bob, carol, dave = "clients/c/agents/bob", "clients/c/agents/carol", "clients/c/agents/dave"
	open := func(r *pgstore.Store, agent string) uint64 {
		t.Helper()
		e, err := r.OpenStream(ctx, agent)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	rows := func() map[string]uint64 {
		t.Helper()
		agents := []string{bob, carol, dave}
		got, err := rs[0].StreamEpochs(ctx, agents)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	older := open(rs[0], bob)
	newer := open(rs[1], bob) // replaces A's stream of bob
	if err := rs[0].CloseStream(ctx, bob, older); err != nil {
		t.Fatal(err)
	}
	if got := rows(); got[bob] != newer {
		t.Fatalf("after the older stream closed, mailbox_streams = %v, want bob at %d", got, newer)
	}
	if err := rs[1].CloseStream(ctx, bob, newer); err != nil {
		t.Fatal(err)
	}
	if got := rows(); len(got) != 0 {
		t.Fatalf("after the newest stream closed, mailbox_streams = %v, want none", got)
	}

	carolOnA, daveOnB := open(rs[0], carol), open(rs[1], dave)
	// Both rows were last seen an hour ago; A is alive and stamps its
	// stream (and a stale epoch of dave, which must not count), B died.
	if _, err := rs[0].DB().Pool().Exec(ctx, `UPDATE mailbox_streams SET seen_at = now() - interval '1 hour'`); err != nil {
		t.Fatal(err)
	}
	stamped, err := rs[0].TouchStreams(ctx, map[string]uint64{carol: carolOnA, dave: daveOnB - 1})
	if err != nil {
		t.Fatal(err)
	}
	// What it stamped is what A's replica still holds rightly: its
	// stream of dave is no longer the one mailbox_streams names.
	if want := map[string]uint64{carol: carolOnA}; !maps.Equal(stamped, want) {
		t.Errorf("TouchStreams stamped %v, want %v", stamped, want)
	}
	n, err := rs[0].SweepStreams(ctx, 10*time.Minute)
	if err != nil || n != 1 {
		t.Errorf("SweepStreams(10m) = %d, %v; want 1 (dave's, unseen)", n, err)
	}
	if got := rows(); len(got) != 1 || got[carol] != carolOnA {
		t.Errorf("after the sweep, mailbox_streams = %v, want carol at %d", got, carolOnA)
	}
}

// CloseStreams (a replica stopping) deletes the rows of many streams,
// more than one statement's batch, and keeps the row of an agent whose
// newer stream opened on another replica meanwhile.
func TestCloseStreams_deletesManyRowsGuardedByEpoch(t *testing.T) {
	rs := replicas(t, 2)
	ctx := t.Context()
	const n = 2500 // three statements of up to 1,000
	rows, err := rs[0].DB().Pool().Query(ctx, `INSERT INTO mailbox_streams (agent, epoch, seen_at)
SELECT 'clients/c/agents/a' || g, nextval('mailbox_stream_epochs'), now() FROM generate_series(1, $1::int) AS g
RETURNING agent, epoch`, n)
	if err != nil {
		t.Fatal(err)
	}
	var (
		ended []mailbox.StreamEnd
		e     mailbox.StreamEnd
	)
	if _, err := pgx.ForEachRow(rows, []any{&e.Agent, &e.Epoch}, func() error {
		ended = append(ended, e)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(ended) != n {
		t.Fatalf("streams opened = %d, want %d", len(ended), n)
	}
	replaced := ended[1500].Agent // in the second batch
	newer, err := rs[1].OpenStream(ctx, replaced)
	if err != nil {
		t.Fatal(err)
	}
	if err := rs[0].CloseStreams(ctx, ended); err != nil {
		t.Fatal(err)
	}
	left := map[string]uint64{}
	all, err := rs[0].DB().Pool().Query(ctx, `SELECT agent, epoch FROM mailbox_streams`)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pgx.ForEachRow(all, []any{&e.Agent, &e.Epoch}, func() error {
		left[e.Agent] = e.Epoch
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(left) != 1 || left[replaced] != newer {
		t.Errorf("mailbox_streams after %d streams closed = %d rows (%v), want only %s at %d", n, len(left), left, replaced, newer)
	}
}

// A schema name as long as PostgreSQL allows (63 bytes) still gives
// notification channels that PostgreSQL keeps whole: an append, a timer, a
// routine and a stream through A each reach B's listener.
func TestListen_onASchemaOfTheLongestName(t *testing.T) {
	url, schema := pgdbtest.LongSchema(t)
	rs := replicasOn(t, url, schema, 2)
	heard := make(chan string, 16)
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	wg.Go(func() {
		rs[1].Listen(ctx, slog.New(slog.DiscardHandler), pgstore.Wakeups{
			Mailboxes: func(agents []string) {
				if agents != nil {
					heard <- "mailbox " + agents[0]
				}
			},
			Timers: func() { heard <- "timers" },
			Routines: func(name string) {
				if name != "" {
					heard <- "routine " + name
				}
			},
			Streams: func(agent string, _ uint64) {
				if agent != "" {
					heard <- "stream " + agent
				}
			},
		})
	})
	expect := func(want string) {
		t.Helper()
		for {
			select {
			case got := <-heard:
				if got == "timers" && want != "timers" {
					continue // B listens: "anything may have changed" on connecting
				}
				if got != want {
					t.Fatalf("B heard %q, want %q", got, want)
				}
				return
			case <-time.After(30 * time.Second): // generous: a failure, not a measure
				t.Fatalf("B did not hear %q", want)
			}
		}
	}
	const bob = "clients/c/agents/bob"
	// B hears only after it listens: wait for the timers' "anything may
	// have changed" first.
	expect("timers")
	mb := mailbox.New(rs[0], mailbox.Options{})
	m := mailbox.Message{ID: "m1", DialogueID: "d", Category: mailbox.CategoryMessage, Type: "t", Body: []byte(`1`)}
	if _, err := mb.Append(t.Context(), m, []string{bob}); err != nil {
		t.Fatal(err)
	}
	expect("mailbox " + bob)
	const routine = "clients/c/agents/a/routines/steps"
	if _, err := rs[0].SetRoutine(t.Context(), routine, "x = 1", time.Unix(1_800_000_000, 0)); err != nil {
		t.Fatal(err)
	}
	expect("routine " + routine)
	if _, err := rs[0].OpenStream(t.Context(), bob); err != nil {
		t.Fatal(err)
	}
	expect("stream " + bob)
}

// Dialogues created at once through two replicas, each to its own
// recipient and all to a shared one, all succeed: creates run at READ
// COMMITTED and queue on the shared mailbox's row. Creates of one
// dialogue id, or of one message id in two dialogues, racing through both
// replicas store it once; the others get ErrAlreadyExists.
func TestCreateDialogue_concurrentReplicas(t *testing.T) {
	rs := replicas(t, 2)
	const n = 32
	const shared = "clients/c/agents/shared"
	t0 := time.Unix(1_800_000_000, 0).UTC()
	create := func(r *pgstore.Store, dialogue, message string, to ...string) error {
		d := store.Dialogue{ID: dialogue, Initiator: "clients/c/agents/alice", Category: "message", CreateTime: t0}
		m := store.DialogueMessage{ID: message, Sender: d.Initiator, Type: "new_message", Time: t0}
		w := store.MessageWrite{Message: m, Recipients: to,
			Pairs: []store.PairState{{Pair: store.Pair{A: d.Initiator, B: to[0]}, State: json.RawMessage(`{"s":1}`)}},
			Mail:  mailbox.Message{Sender: d.Initiator, Category: mailbox.CategoryMessage, Type: m.Type, Body: []byte(`"hi"`), Time: t0}}
		_, err := r.CreateDialogue(t.Context(), d, w, mailbox.Bound{})
		return err
	}
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			own := fmt.Sprintf("clients/c/agents/r%02d", i)
			if err := create(rs[i%2], fmt.Sprintf("d%02d", i), fmt.Sprintf("m%02d", i), own, shared); err != nil {
				t.Errorf("CreateDialogue #%d: %v", i, err)
			}
		})
	}
	var mu sync.Mutex
	outcomes := map[string]int{}
	for i := range 8 {
		wg.Go(func() {
			r := rs[i%2]
			errSame := create(r, "same", fmt.Sprintf("same-m%d", i), shared)
			errMsg := create(r, fmt.Sprintf("other%d", i), "same-message", shared)
			mu.Lock()
			defer mu.Unlock()
			for what, err := range map[string]error{"dialogue": errSame, "message": errMsg} {
				switch {
				case err == nil:
					outcomes[what+" created"]++
				case errors.Is(err, store.ErrAlreadyExists):
					outcomes[what+" exists"]++
				default:
					t.Errorf("CreateDialogue racing on one %s id: %v, want nil or ErrAlreadyExists", what, err)
				}
			}
		})
	}
	wg.Wait()
	want := map[string]int{"dialogue created": 1, "dialogue exists": 7, "message created": 1, "message exists": 7}
	if !maps.Equal(outcomes, want) {
		t.Errorf("creates racing on one id: %v, want %v", outcomes, want)
	}
	got, err := rs[0].ReadMailbox(t.Context(), shared, 0, 2*n)
	if err != nil {
		t.Fatal(err)
	}
	for i, d := range got {
		if d.Cursor != uint64(i+1) {
			t.Fatalf("shared mailbox cursors %v…: want 1..%d", d.Cursor, len(got))
		}
	}
	if len(got) != n+2 {
		t.Errorf("shared mailbox holds %d messages, want %d", len(got), n+2)
	}
	for i := range n {
		if _, err := rs[1].GetDialogue(t.Context(), fmt.Sprintf("d%02d", i)); err != nil {
			t.Errorf("GetDialogue(d%02d) = %v", i, err)
		}
	}
}

// Every writer of a dialogue's state, racing through two replicas on the
// same dialogues, moves it from what the previous one left, and none pays
// a retry: replies (AddMessage: the pair's state + 1), timers firing in
// batches across the dialogues in both orders (FireTimers: + 100), and the
// participants' own updates (UpdateAgentDialogues, UpdateParticipant).
// They queue on the dialogue's row lock, taken first (dialogues by id,
// then mailboxes by name), so they neither fail to serialize nor
// deadlock.
func TestDialogueWriters_raceAcrossReplicasWithoutRetries(t *testing.T) {
	rs := replicas(t, 2)
	ctx := t.Context()
	const (
		alice, bob       = "clients/c/agents/alice", "clients/c/agents/bob"
		dialogues        = 4
		replies, timers  = 8, 4
		agentUpdates, pu = 4, 4
	)
	t0 := time.Unix(1_800_000_000, 0).UTC()
	pair := store.Pair{A: alice, B: bob}
	state := func(n int) json.RawMessage { return json.RawMessage(fmt.Sprint(n)) }
	ids := make([]string, dialogues)
	var pending [timers][]store.Timer // by name, a timer in each dialogue
	for i := range ids {
		ids[i] = fmt.Sprintf("d%d", i)
		m := store.DialogueMessage{ID: ids[i] + "-m1", DialogueID: ids[i], Sender: alice, Type: "new_message", Time: t0}
		w := store.MessageWrite{Message: m, Recipients: []string{bob},
			Pairs: []store.PairState{{Pair: pair, State: state(0)}},
			Mail:  mailbox.Message{Sender: alice, Category: mailbox.CategoryMessage, Type: m.Type, Body: []byte(`"hi"`), Time: t0}}
		if _, err := rs[0].CreateDialogue(ctx, store.Dialogue{ID: ids[i], Initiator: alice, Category: "message", CreateTime: t0}, w, mailbox.Bound{}); err != nil {
			t.Fatal(err)
		}
		for j := range timers {
			pending[j] = append(pending[j], store.Timer{Dialogue: ids[i], Initiator: alice, Counterpart: bob, Name: fmt.Sprint("t", j), At: t0})
		}
	}
	for _, ts := range pending {
		if err := rs[0].PutTimers(ctx, ts); err != nil {
			t.Fatal(err)
		}
	}
	before := rs[0].DB().Retries() + rs[1].DB().Retries()
	var wg sync.WaitGroup
	for i, id := range ids {
		for k := range replies {
			wg.Go(func() {
				_, err := rs[(i+k)%2].AddMessage(ctx, id+"-m1", mailbox.Bound{}, func(v store.DialogueView) (store.MessageWrite, error) {
					var n int
					if err := json.Unmarshal(v.PairState(pair), &n); err != nil {
						return store.MessageWrite{}, err
					}
					m := store.DialogueMessage{ID: fmt.Sprintf("%s-r%d", id, k), Sender: bob, Type: "message_response", InReplyTo: id + "-m1", Time: t0}
					return store.MessageWrite{Message: m, Recipients: []string{alice},
						Pairs: []store.PairState{{Pair: pair, State: state(n + 1)}},
						Mail:  mailbox.Message{Sender: bob, Category: mailbox.CategoryMessage, Type: m.Type, Body: []byte(`"r"`), Time: t0}}, nil
				})
				if err != nil {
					t.Errorf("AddMessage(reply %d in %s): %v", k, id, err)
				}
			})
		}
	}
	for j, ts := range pending {
		if j%2 == 1 {
			slices.Reverse(ts) // the dialogues in the other order
		}
		wg.Go(func() {
			fired, err := rs[j%2].FireTimers(ctx, ts, mailbox.Bound{}, func(_ store.Timer, prev json.RawMessage) (store.TimerFiring, error) {
				var n int
				err := json.Unmarshal(prev, &n)
				return store.TimerFiring{State: state(n + 100)}, err
			})
			if err != nil || len(fired) != dialogues {
				t.Errorf("FireTimers(t%d) = %d fired, %v; want %d", j, len(fired), err, dialogues)
			}
		})
	}
	for k := range agentUpdates {
		wg.Go(func() {
			n, err := rs[k%2].UpdateAgentDialogues(ctx, bob, func(_ *store.Dialogue, p *store.Participant) (bool, error) {
				p.ClosedTypes = append(p.ClosedTypes, fmt.Sprint("type", k))
				return true, nil
			})
			if err != nil || n != dialogues {
				t.Errorf("UpdateAgentDialogues(bob) = %d, %v; want %d", n, err, dialogues)
			}
		})
	}
	for i, id := range ids {
		for k := range pu {
			wg.Go(func() {
				if _, _, err := rs[(i+k)%2].UpdateParticipant(ctx, id, alice, func(_ *store.Dialogue, p *store.Participant) error {
					p.ClosedAgents = append(p.ClosedAgents, fmt.Sprint("agent", k))
					return nil
				}); err != nil {
					t.Errorf("UpdateParticipant(%s, alice): %v", id, err)
				}
			})
		}
	}
	wg.Wait()
	if got := rs[0].DB().Retries() + rs[1].DB().Retries() - before; got != 0 {
		t.Errorf("the racing writes ran %d transactions again (serialization failures or deadlocks), want none", got)
	}
	for _, id := range ids {
		_, _ = rs[1].AddMessage(ctx, id+"-m1", mailbox.Bound{}, func(v store.DialogueView) (store.MessageWrite, error) {
			if got, want := string(v.PairState(pair)), fmt.Sprint(replies+100*timers); got != want {
				t.Errorf("%s: pair state %s after %d replies and %d timers, want %s", id, got, replies, timers, want)
			}
			if p, _ := v.Participant(bob); len(p.ClosedTypes) != agentUpdates {
				t.Errorf("%s: bob's record kept %v of %d updates", id, p.ClosedTypes, agentUpdates)
			}
			if p, _ := v.Participant(alice); len(p.ClosedAgents) != pu {
				t.Errorf("%s: alice's record kept %v of %d updates", id, p.ClosedAgents, pu)
			}
			return store.MessageWrite{}, errors.New("read only")
		})
	}
}
