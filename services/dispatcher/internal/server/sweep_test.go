package server

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/parleyhq/parley/platform/sweep"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

// Sweep removes more expired conversations, and more day-old request ids
// of network sends, than one sweep transaction may (sweep.Batch): it
// sweeps in batches until none is left.
func TestSweep_removesMoreThanOneBatch(t *testing.T) {
	e := startService(t)
	ctx := t.Context()
	start := e.clock.Now()
	const due = 2*sweep.Batch + 1
	for i := range due {
		c := store.Conversation{ID: fmt.Sprint("c", i), Agent: netAlice, Peer: "peer", CreateTime: start, ExpireTime: start.Add(time.Minute)}
		if err := e.st.CreateConversation(ctx, c, 0, start); err != nil {
			t.Fatal(err)
		}
		id := fmt.Sprint("r", i)
		if _, _, err := e.st.BeginRequest(ctx, netAlice, id, start, start); err != nil {
			t.Fatal(err)
		}
		if err := e.st.FinishRequest(ctx, netAlice, id, json.RawMessage(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	e.clock.Advance(25 * time.Hour)
	if n, err := e.srv.Sweep(ctx); err != nil || n != due {
		t.Errorf("Sweep = %d, %v; want %d conversations removed", n, err, due)
	}
	now := e.clock.Now()
	if n, err := e.st.SweepConversations(ctx, now, due); err != nil || n != 0 {
		t.Errorf("SweepConversations after Sweep = %d, %v; want none left", n, err)
	}
	if n, err := e.st.SweepRequests(ctx, now, due); err != nil || n != 0 {
		t.Errorf("SweepRequests after Sweep = %d, %v; want none left", n, err)
	}
}
