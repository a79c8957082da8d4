package main

// sdk.NetworkOptions.Concurrency against a real in-process Parley server.

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/sdk"
)

// A supplier with Concurrency runs the stages of two dialogues at once:
// the first request's stage offers only after the second's has started,
// which a supplier handling one message at a time never reaches (its
// first round would end with no offer when the window lapses).
func TestServiceAgent_concurrencyRunsTwoDialoguesStagesAtOnce(t *testing.T) {
	var (
		mu    sync.Mutex
		first string // the dialogue whose request the supplier took first
	)
	second := make(chan struct{}) // closed by the other dialogue's stage
	n := startServiceNetWith(t, sdk.NetworkOptions{Concurrency: 2}, []string{"s"}, func(id string, sa *sdk.ServiceAgent) {
		sa.Supply("new_task_request", func(ctx context.Context, m sdk.Message, r sdk.Responder) error {
			mu.Lock()
			isFirst := first == ""
			if isFirst {
				first = m.DialogueID
			}
			mu.Unlock()
			if isFirst {
				select {
				case <-second:
				case <-ctx.Done():
					return ctx.Err()
				}
			} else {
				close(second)
			}
			_, err := r.Reply(ctx, "offer", map[string]any{"offer": map[string]string{"by": id}, "offer_timeout": 30, "price": usdPrice(1_000_000)})
			return err
		})
	})
	c := n.agents["consumer"]
	var (
		wg     sync.WaitGroup
		rounds [2]*sdk.Round
		errs   [2]error
	)
	for i := range 2 {
		wg.Go(func() {
			rounds[i], errs[i] = c.Allocate(t.Context(), sdk.Request{To: suppliersOf(n, "s"), Task: map[string]int{"round": i}, Window: 30 * time.Second}, byLowPrice)
		})
	}
	wg.Wait()
	for i := range 2 {
		if errs[i] != nil {
			t.Fatalf("Allocate #%d error = %v", i, errs[i])
		}
		if len(rounds[i].Offers) != 1 {
			t.Errorf("Allocate #%d offers = %d, want 1 (the supplier's, made while the other round's stage waited)", i, len(rounds[i].Offers))
		}
		if err := rounds[i].Close(t.Context()); err != nil {
			t.Errorf("Close #%d error = %v", i, err)
		}
	}
}

// An agent with Concurrency whose handler of the first message has not
// returned, while the later ones are done, leaves the first
// unacknowledged: a new agent of the same name receives it again.
func TestNetworkAgent_concurrencyLeavesAnUnfinishedMessageForTheNextAgent(t *testing.T) {
	n := startServiceNet(t, nil, nil)
	ctx := t.Context()
	reg := registryv1.NewRegistryServiceClient(n.conn)
	if _, err := reg.CreateAgent(ctx, &registryv1.CreateAgentRequest{Parent: "clients/svc", AgentId: "r", Agent: &registryv1.Agent{DisplayName: "r"}}); err != nil {
		t.Fatal(err)
	}
	r := n.name("r")
	if _, err := reg.FollowAgent(ctx, &registryv1.FollowAgentRequest{Name: r, Agent: n.name("consumer")}); err != nil {
		t.Fatal(err)
	}
	disp := dispatcherv1.NewDispatcherServiceClient(n.conn)
	for i := 1; i <= 5; i++ { // five dialogues, one message each
		if _, err := disp.SendMessage(ctx, &dispatcherv1.SendMessageRequest{
			Sender: n.name("consumer"), To: &dispatcherv1.DistributionList{Direct: []string{r}}, MessageType: "note", BodyJson: fmt.Sprintf(`{"n":%d}`, i),
		}); err != nil {
			t.Fatal(err)
		}
	}
	receiver := func(opts sdk.NetworkOptions, h sdk.HandlerFunc) *sdk.NetworkAgent {
		opts.OnError = func(err error) { t.Logf("r: %v", err) }
		a, err := sdk.NewNetworkAgent(n.conn, r, opts)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Handle(sdk.RouteKey{Agent: r, Type: sdk.TypeGeneralError}, "notes", h); err != nil {
			t.Fatal(err)
		}
		return a
	}
	release := make(chan struct{})
	first := receiver(sdk.NetworkOptions{Concurrency: 4, AckDelay: time.Millisecond}, func(_ context.Context, m sdk.Message) (any, error) {
		if string(m.Body) == `{"n":1}` {
			<-release // past Run's end: still unfinished when the next agent comes
		}
		return string(m.Body), nil
	})
	firstCtx, stopFirst := context.WithCancel(ctx)
	firstDone := make(chan error, 1)
	go func() { firstDone <- first.Run(firstCtx) }()
	for range 4 {
		if _, err := first.Expect(ctx, "notes", 30*time.Second); err != nil {
			t.Fatalf("first agent's Expect = %v, want the four later notes", err)
		}
	}
	stopFirst()
	next := receiver(sdk.NetworkOptions{}, func(_ context.Context, m sdk.Message) (any, error) { return string(m.Body), nil })
	nextCtx, stopNext := context.WithCancel(ctx)
	nextDone := make(chan error, 1)
	go func() { nextDone <- next.Run(nextCtx) }()
	if c := first.Cursor(); c != 0 {
		t.Errorf("first agent's Cursor() with note 1 unfinished = %d, want 0", c)
	}
	// A cursor at or before the acknowledged one changes nothing: this
	// reads where the server would resume.
	mb, err := disp.AcknowledgeMessages(ctx, &dispatcherv1.AcknowledgeMessagesRequest{Agent: r})
	if err != nil || mb.GetAcknowledgedCursor() != 0 {
		t.Errorf("acknowledged cursor with note 1 unfinished = %d, %v; want 0", mb.GetAcknowledgedCursor(), err)
	}
	v, err := next.Expect(ctx, "notes", 30*time.Second)
	if err != nil || v != `{"n":1}` {
		t.Errorf("next agent's first note = %v, %v; want {\"n\":1}, left unacknowledged", v, err)
	}
	close(release)
	stopNext()
	for _, done := range []chan error{firstDone, nextDone} {
		if err := <-done; err != nil {
			t.Errorf("Run = %v, want nil", err)
		}
	}
}
