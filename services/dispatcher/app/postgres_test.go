package app_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/platform/pgdb/pgdbtest"
	"github.com/parleyhq/parley/services/dispatcher/internal/store/pgstore"
)

// TestPostgreSQL_secondStreamOnAnotherReplicaTakesOver runs two
// dispatchers on one PostgreSQL database: one receive stream per agent
// holds across replicas, so a stream opened on B ends the agent's stream
// on A with the status a takeover on one replica gives, and B's stream
// keeps receiving.
func TestPostgreSQL_secondStreamOnAnotherReplicaTakesOver(t *testing.T) {
	url := pgdbtest.Database(t)
	a := startDispatcherApp(t, "--database-url", url)
	b := startDispatcherApp(t, "--database-url", url)
	send(t, a.app, "m1", echo)
	first, err := a.client.ReceiveMessages(t.Context(), &dispatcherv1.ReceiveMessagesRequest{Agent: echo})
	if err != nil {
		t.Fatal(err)
	}
	recvN(t, first, 1)
	second, err := b.client.ReceiveMessages(t.Context(), &dispatcherv1.ReceiveMessagesRequest{Agent: echo})
	if err != nil {
		t.Fatal(err)
	}
	recvN(t, second, 1)
	endsReplaced(t, first, "stream on A after a stream on B")
	send(t, a.app, "m2", echo)
	if got := recvN(t, second, 1); cursors(got) != "2:m2 " {
		t.Errorf("stream on B = %q, want 2:m2", cursors(got))
	}
}

// TestPostgreSQL_anEndedStreamLeavesNoRecord: a receive stream's record
// in mailbox_streams, which orders streams across replicas, is deleted
// when the stream ends, so the table holds the live streams only.
func TestPostgreSQL_anEndedStreamLeavesNoRecord(t *testing.T) {
	url := pgdbtest.Database(t)
	a := startDispatcherApp(t, "--database-url", url)
	st, err := pgstore.Open(t.Context(), url, pgstore.Schema, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	records := func() map[string]uint64 {
		t.Helper()
		got, err := st.StreamEpochs(t.Context(), []string{echo})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	send(t, a.app, "m1", echo)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	stream, err := a.client.ReceiveMessages(ctx, &dispatcherv1.ReceiveMessagesRequest{Agent: echo})
	if err != nil {
		t.Fatal(err)
	}
	recvN(t, stream, 1)
	if got := records(); len(got) != 1 {
		t.Fatalf("mailbox_streams while %s receives = %v, want its stream", echo, got)
	}
	cancel()
	deadline := time.Now().Add(30 * time.Second) // generous: a failure, not a measure
	for len(records()) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("mailbox_streams after the stream ended = %v, want none", records())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestPostgreSQL_aStoppingReplicaLeavesNoStreamRecords: replica A stops
// while many agents receive on it. Their streams end SHUTTING_DOWN and
// their records in mailbox_streams are deleted (in batches, as the
// shutdown starts), while the record of an agent receiving on replica B
// stays.
func TestPostgreSQL_aStoppingReplicaLeavesNoStreamRecords(t *testing.T) {
	url := pgdbtest.Database(t)
	a := startDispatcherApp(t, "--database-url", url)
	b := startDispatcherApp(t, "--database-url", url)
	st, err := pgstore.Open(t.Context(), url, pgstore.Schema, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	const n, other = 40, "clients/acme/agents/other"
	agents := []string{other}
	for i := range n {
		agents = append(agents, fmt.Sprintf("clients/acme/agents/a%02d", i))
	}
	records := func() map[string]uint64 {
		t.Helper()
		got, err := st.StreamEpochs(t.Context(), agents)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	// A failure ends the streams instead of hanging the test.
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	open := func(d dispatcherEnv, agent string) grpc.ServerStreamingClient[dispatcherv1.ReceiveMessagesResponse] {
		t.Helper()
		s, err := d.client.ReceiveMessages(ctx, &dispatcherv1.ReceiveMessagesRequest{Agent: agent})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Recv(); err != nil { // the first, empty batch: the stream is open
			t.Fatal(err)
		}
		return s
	}
	open(b, other)
	var onA []grpc.ServerStreamingClient[dispatcherv1.ReceiveMessagesResponse]
	for _, agent := range agents[1:] {
		onA = append(onA, open(a, agent))
	}
	if got := records(); len(got) != n+1 {
		t.Fatalf("mailbox_streams while %d agents receive = %d records, want %d", n+1, len(got), n+1)
	}
	kept := records()[other]
	a.stop()
	for i, s := range onA {
		for {
			_, err := s.Recv()
			if err == nil {
				continue // a keepalive
			}
			if status.Code(err) != codes.Unavailable || reason(err) != "SHUTTING_DOWN" {
				t.Errorf("stream %d on A after A stopped: %v (reason %q), want UNAVAILABLE SHUTTING_DOWN", i, err, reason(err))
			}
			break
		}
	}
	deadline := time.Now().Add(30 * time.Second) // generous: a failure, not a measure
	for got := records(); len(got) != 1 || got[other] != kept; got = records() {
		if time.Now().After(deadline) {
			t.Fatalf("mailbox_streams after A stopped = %d records (%v), want only %s's on B at %d", len(got), got, other, kept)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestPostgreSQL_aListenerThatReconnectsCatchesUp: replica A's listening
// connection is terminated (pg_terminate_backend) and kept from
// reconnecting while B appends to the mailbox of an agent receiving on A
// and opens a newer stream of another agent receiving on A. A hears none
// of it; once it listens again it reads the mailboxes of its streams and
// compares its streams with mailbox_streams, so its stream delivers the
// message and its older stream ends STREAM_REPLACED. So does the stream on
// A of a third agent whose newer stream on B opened and already ended
// while A was deaf: its row is gone, which names no stream of A's.
// (Each stream's keepalive is 10 minutes, so only a wake-up delivers in
// time.)
func TestPostgreSQL_aListenerThatReconnectsCatchesUp(t *testing.T) {
	url := pgdbtest.Database(t)
	role, urlA := pgdbtest.Role(t, url)
	b := startDispatcherApp(t, "--database-url", url, "--mailbox-stream-keepalive", "10m") // makes the schema, so that the role owns nothing
	a := startDispatcherApp(t, "--database-url", urlA, "--mailbox-stream-keepalive", "10m")
	const other = "clients/acme/agents/other"
	listenersOfA := `SELECT count(*) FROM pg_stat_activity WHERE usename = '` + role + `' AND query LIKE 'LISTEN %'`
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second) // generous: a failure, not a measure
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("still waiting for %s", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitFor("A's listening connection", func() bool { return pgdbtest.Int(t, listenersOfA) == 1 })

	// A failure ends the streams instead of hanging the test.
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	send(t, b.app, "m1", echo)
	echoOnA, err := a.client.ReceiveMessages(ctx, &dispatcherv1.ReceiveMessagesRequest{Agent: echo})
	if err != nil {
		t.Fatal(err)
	}
	recvN(t, echoOnA, 1)
	otherOnA, err := a.client.ReceiveMessages(ctx, &dispatcherv1.ReceiveMessagesRequest{Agent: other})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := otherOnA.Recv(); err != nil { // the first, empty batch: connected
		t.Fatal(err)
	}
	const third = "clients/acme/agents/third"
	thirdOnA, err := a.client.ReceiveMessages(ctx, &dispatcherv1.ReceiveMessagesRequest{Agent: third})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := thirdOnA.Recv(); err != nil {
		t.Fatal(err)
	}

	pgdbtest.Exec(t, `ALTER ROLE `+role+` NOLOGIN`)
	t.Cleanup(func() { pgdbtest.Exec(t, `ALTER ROLE `+role+` LOGIN`) }) // if the test stops early
	pgdbtest.Exec(t, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '`+role+`' AND query LIKE 'LISTEN %'`)
	waitFor("A's listener to be gone", func() bool { return pgdbtest.Int(t, listenersOfA) == 0 })

	send(t, b.app, "m2", echo)
	otherOnB, err := b.client.ReceiveMessages(ctx, &dispatcherv1.ReceiveMessagesRequest{Agent: other})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := otherOnB.Recv(); err != nil {
		t.Fatal(err)
	}
	thirdCtx, endThird := context.WithCancel(ctx)
	thirdOnB, err := b.client.ReceiveMessages(thirdCtx, &dispatcherv1.ReceiveMessagesRequest{Agent: third})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := thirdOnB.Recv(); err != nil {
		t.Fatal(err)
	}
	endThird()
	st, err := pgstore.Open(t.Context(), url, pgstore.Schema, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	waitFor("the row of third's ended stream on B to go", func() bool {
		got, err := st.StreamEpochs(t.Context(), []string{third})
		return err == nil && len(got) == 0
	})

	pgdbtest.Exec(t, `ALTER ROLE `+role+` LOGIN`)
	if got := recvN(t, echoOnA, 1); cursors(got) != "2:m2 " {
		t.Errorf("echo's stream on A after its listener reconnected = %q, want 2:m2", cursors(got))
	}
	endsReplaced(t, otherOnA, "other's stream on A after its listener reconnected")
	endsReplaced(t, thirdOnA, "third's stream on A, whose newer stream on B ended, after A's listener reconnected")
}
