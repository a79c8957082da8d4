package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/parleyhq/parley/e2e/parleytest"
	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
)

// TestServe_kill9LosesNoAcknowledgedMessage: bob receives some messages
// and acknowledges them, then disconnects; alice's senders keep sending
// (each send acknowledged only once bob's mailbox holds it durably); the
// shipped `parley serve` is SIGKILLed mid-send and restarted on the same
// data. Bob reconnects and gets every message acknowledged to a sender,
// once each after de-duplication by id, in each sender's order, and
// nothing he had acknowledged comes back.
func TestServe_kill9LosesNoAcknowledgedMessage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds parley and runs it twice under load")
	}
	bin := parleytest.Binary(t)
	dataDir := t.TempDir()
	const alice, bob = "clients/acme/agents/alice", "clients/acme/agents/bob"

	first := startGroup(t, bin, dataDir)
	srv := first.server
	createAgent(t, srv, "acme", "alice", "")
	createAgent(t, srv, "acme", "bob", "")
	// Members of their client's group may message each other.
	mustAPI(t, "POST", srv.URL("/v1/"+alice+":joinClientGroup"), `{}`)
	mustAPI(t, "POST", srv.URL("/v1/"+bob+":joinClientGroup"), `{}`)

	var (
		mu    sync.Mutex
		acked = map[int][]string{} // sender → message ids acknowledged to it, in order
	)
	client := &http.Client{Timeout: 30 * time.Second}
	token := parleytest.OperatorToken(t)
	sendOne := func(w, i int) (string, bool) {
		body, _ := json.Marshal(map[string]any{
			"to": map[string]any{"direct": []string{bob}}, "messageType": "new_message",
			"bodyJson": fmt.Sprintf(`{"w":%d,"i":%d}`, w, i),
		})
		req, err := http.NewRequest("POST", srv.URL("/v1/"+alice+"/messages:send"), bytes.NewReader(body))
		if err != nil {
			return "", false
		}
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := client.Do(req)
		if err != nil {
			return "", false
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		var out struct{ MessageID string }
		if resp.StatusCode != http.StatusOK || json.Unmarshal(raw, &out) != nil || out.MessageID == "" {
			return "", false
		}
		return out.MessageID, true
	}
	total := func() int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, ids := range acked {
			n += len(ids)
		}
		return n
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	const senders = 4
	for w := range senders {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				id, ok := sendOne(w, i)
				if !ok {
					continue // refused or cut off by the kill: not acknowledged
				}
				mu.Lock()
				acked[w] = append(acked[w], id)
				mu.Unlock()
			}
		})
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(2 * time.Minute) // bounds a broken run only
		for !cond() {
			if time.Now().After(deadline) {
				close(stop)
				wg.Wait()
				t.Fatalf("after 2 minutes, still waiting for %s (%d sends acknowledged)\n%s", what, total(), srv.Log)
			}
			time.Sleep(20 * time.Millisecond) // polling the senders' progress
		}
	}

	// Bob receives a first batch and acknowledges part of it.
	waitFor("20 acknowledged sends", func() bool { return total() >= 20 })
	rx := receiver(t, srv.GRPCAddr)
	stream, err := rx.ReceiveMessages(t.Context(), &dispatcherv1.ReceiveMessagesRequest{Agent: bob})
	if err != nil {
		t.Fatal(err)
	}
	var before []*dispatcherv1.NetworkMessage
	for len(before) < 10 {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("Recv: %v", err)
		}
		before = append(before, resp.GetMessages()...)
	}
	ackedCursor := before[9].GetCursor()
	if _, err := rx.AcknowledgeMessages(t.Context(), &dispatcherv1.AcknowledgeMessagesRequest{Agent: bob, Cursor: ackedCursor}); err != nil {
		t.Fatal(err)
	}
	seenBefore := map[string]bool{}
	for _, m := range before[:10] {
		seenBefore[m.GetMessageId()] = true
	}

	// He disconnects; the senders go on; the server is killed mid-send.
	n := total()
	waitFor("40 more acknowledged sends", func() bool { return total() >= n+40 })
	first.kill(t)
	close(stop)
	wg.Wait()
	t.Logf("acknowledged to senders before SIGKILL: %d; bob acknowledged cursor %d", total(), ackedCursor)

	second := startGroup(t, bin, dataDir)
	srv = second.server
	rx = receiver(t, srv.GRPCAddr)
	stream, err = rx.ReceiveMessages(t.Context(), &dispatcherv1.ReceiveMessagesRequest{Agent: bob})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for _, ids := range acked {
		for _, id := range ids {
			if !seenBefore[id] {
				want[id] = true
			}
		}
	}
	got := map[string]int{} // id → deliveries
	lastI := map[int]int{}  // sender → last i delivered
	missing := len(want)
	deadline := time.Now().Add(2 * time.Minute)
	for missing > 0 && time.Now().Before(deadline) {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("Recv after restart: %v", err)
		}
		for _, m := range resp.GetMessages() {
			if m.GetCursor() <= ackedCursor {
				t.Errorf("after restart, cursor %d came again; %d was acknowledged", m.GetCursor(), ackedCursor)
			}
			if got[m.GetMessageId()]++; got[m.GetMessageId()] > 1 {
				continue // a redelivery: dropped by id
			}
			if want[m.GetMessageId()] {
				missing--
			}
			var b struct{ W, I int }
			if err := json.Unmarshal(m.GetBodyJson(), &b); err != nil {
				t.Fatalf("body %q: %v", m.GetBodyJson(), err)
			}
			if last, ok := lastI[b.W]; ok && b.I <= last {
				t.Errorf("sender %d: message %d arrived after %d", b.W, b.I, last)
			}
			lastI[b.W] = b.I
		}
	}
	for id := range want {
		if got[id] == 0 {
			t.Errorf("message %s was acknowledged to its sender but never delivered after the restart", id)
		}
	}
}

// receiver is a dispatcher client with the operator's token.
func receiver(t *testing.T, addr string) dispatcherv1.DispatcherServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(parleytest.Bearer(t)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return dispatcherv1.NewDispatcherServiceClient(conn)
}
