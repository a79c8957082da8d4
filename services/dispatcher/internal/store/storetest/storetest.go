// Package storetest is the conformance suite every store.Store backend must
// pass.
package storetest

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

// Run runs the suite; open returns a new empty store.
func Run(t *testing.T, open func(t *testing.T) store.Store) {
	t.Run("routines", func(t *testing.T) { testRoutines(t, open(t)) })
	t.Run("conversations", func(t *testing.T) { testConversations(t, open(t)) })
	t.Run("conversation sweep batches", func(t *testing.T) { testSweepConversationBatches(t, open(t)) })
	t.Run("tools and send counts", func(t *testing.T) { testToolsAndCounts(t, open(t)) })
}

const agent = "clients/c/agents/a"

func testRoutines(t *testing.T, s store.Store) {
	ctx := t.Context()
	now := time.Unix(1_800_000_000, 0)
	name := agent + "/routines/steps"
	if _, err := s.GetRoutine(ctx, name); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetRoutine(missing) = %v, want ErrNotFound", err)
	}
	for v := int64(1); v <= 2; v++ {
		r, err := s.SetRoutine(ctx, name, "x = 1", now)
		if err != nil || r.GetVersion() != v || r.GetState() != dispatcherv1.Routine_STATE_ACTIVE {
			t.Fatalf("SetRoutine #%d = %v, %v; want version %d, active", v, r, err, v)
		}
	}
	for i := 1; i <= 3; i++ {
		r, err := s.RecordRoutineRun(ctx, name, 2, "boom", dispatcherv1.RoutineFailureKind_ROUTINE_FAILURE_KIND_TIME, 3)
		if err != nil || r.GetConsecutiveFailures() != int32(i) {
			t.Fatalf("RecordRoutineRun failure #%d = %v, %v", i, r, err)
		}
	}
	r, _ := s.GetRoutine(ctx, name)
	if r.GetState() != dispatcherv1.Routine_STATE_QUARANTINED || r.GetLastError() != "boom" || r.GetLastFailureKind() != dispatcherv1.RoutineFailureKind_ROUTINE_FAILURE_KIND_TIME {
		t.Errorf("after 3 failures = %v, want quarantined with last error and its kind", r)
	}
	if r, _ := s.RecordRoutineRun(ctx, name, 1, "", dispatcherv1.RoutineFailureKind_ROUTINE_FAILURE_KIND_UNSPECIFIED, 3); r.GetConsecutiveFailures() != 3 {
		t.Errorf("RecordRoutineRun of an old version changed the routine: %v", r)
	}
	r, _ = s.SetRoutine(ctx, name, "x = 2", now)
	if r.GetState() != dispatcherv1.Routine_STATE_ACTIVE || r.GetConsecutiveFailures() != 0 {
		t.Errorf("SetRoutine after quarantine = %v, want active with no failures", r)
	}
	if _, err := s.SetRoutine(ctx, agent+"/routines/"+"aa", "y", now); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SetRoutine(ctx, "clients/c/agents/b/routines/zz", "y", now); err != nil {
		t.Fatal(err)
	}
	list, err := s.ListRoutines(ctx, agent, "", 10)
	if err != nil || len(list) != 2 || list[0].GetName() != agent+"/routines/aa" {
		t.Errorf("ListRoutines = %v, %v; want aa, steps", list, err)
	}
	list, _ = s.ListRoutines(ctx, agent, agent+"/routines/aa", 10)
	if len(list) != 1 || list[0].GetName() != name {
		t.Errorf("ListRoutines after aa = %v, want steps", list)
	}
}

func testConversations(t *testing.T, s store.Store) {
	ctx := t.Context()
	now := time.Unix(1_800_000_000, 0)
	mk := func(id, peer string, exp time.Duration) store.Conversation {
		return store.Conversation{ID: id, Agent: agent, Peer: peer, CreateTime: now, ExpireTime: now.Add(exp)}
	}
	for _, id := range []string{"a", "b"} {
		if err := s.CreateConversation(ctx, mk(id, "p", time.Minute), 2, now); err != nil {
			t.Fatalf("CreateConversation(%s) = %v", id, err)
		}
	}
	if err := s.CreateConversation(ctx, mk("c", "p", time.Minute), 2, now); !errors.Is(err, store.ErrLimit) {
		t.Errorf("CreateConversation over the cap = %v, want ErrLimit", err)
	}
	if err := s.CreateConversation(ctx, mk("c", "q", time.Minute), 2, now); err != nil {
		t.Errorf("CreateConversation for another peer = %v", err)
	}
	if err := s.CreateConversation(ctx, mk("a", "q", time.Minute), 2, now); !errors.Is(err, store.ErrAlreadyExists) {
		t.Errorf("CreateConversation(duplicate id) = %v, want ErrAlreadyExists", err)
	}
	// Expired conversations do not count against the cap.
	if err := s.CreateConversation(ctx, mk("d", "p", 5*time.Minute), 2, now.Add(2*time.Minute)); err != nil {
		t.Errorf("CreateConversation after expiry = %v", err)
	}
	err := s.UpdateConversation(ctx, "a", func(c *store.Conversation) error {
		c.Memory = json.RawMessage(`{"n":1}`)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	if err := s.UpdateConversation(ctx, "a", func(c *store.Conversation) error { c.Memory = nil; return boom }); !errors.Is(err, boom) {
		t.Errorf("UpdateConversation(failing mutate) = %v, want its error", err)
	}
	c, err := s.GetConversation(ctx, "a")
	if err != nil || string(c.Memory) != `{"n":1}` || c.Peer != "p" {
		t.Errorf("GetConversation = %+v, %v; want memory {\"n\":1}", c, err)
	}
	if err := s.DeleteConversation(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetConversation(ctx, "a"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetConversation after delete = %v, want ErrNotFound", err)
	}
	if err := s.DeleteConversation(ctx, "a"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("DeleteConversation twice = %v, want ErrNotFound", err)
	}
	n, err := s.SweepConversations(ctx, now.Add(90*time.Second), 10)
	if err != nil || n != 2 { // b and c expired at now+1m; d lives
		t.Errorf("SweepConversations = %d, %v; want 2", n, err)
	}
}

// testSweepConversationBatches sweeps more expired conversations than one
// call may remove: each call removes at most its limit, the earliest
// expired first, and the calls together remove exactly those expired.
func testSweepConversationBatches(t *testing.T, s store.Store) {
	ctx := t.Context()
	t0 := time.Unix(1_800_000_000, 0)
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Second) }
	conv := func(id, peer string, exp time.Time) store.Conversation {
		return store.Conversation{ID: id, Agent: agent, Peer: peer, CreateTime: t0, ExpireTime: exp}
	}
	// Created latest first, so that neither id nor insertion order is the
	// expiry order.
	const due = 7
	id := func(i int) string { return fmt.Sprintf("c%d", due-i) }
	for i := due - 1; i >= 0; i-- {
		if err := s.CreateConversation(ctx, conv(id(i), fmt.Sprint("p", i%2), at(i)), 0, t0); err != nil {
			t.Fatal(err)
		}
	}
	// Extended past the cut: it must not be swept under its first expiry,
	// nor use up a batch.
	if err := s.CreateConversation(ctx, conv("extended", "p0", t0), 0, t0); err != nil {
		t.Fatal(err)
	}
	if err := s.UpdateConversation(ctx, "extended", func(c *store.Conversation) error { c.ExpireTime = at(due + 1); return nil }); err != nil {
		t.Fatal(err)
	}
	cut := at(due)
	sweepOldestFirst(t, "SweepConversations", due, func(limit int) (int, error) { return s.SweepConversations(ctx, cut, limit) }, func(i int) bool {
		_, err := s.GetConversation(ctx, id(i))
		return errors.Is(err, store.ErrNotFound)
	}, func(i int) string { return fmt.Sprintf("the conversation expiring at +%ds", i) })
	if _, err := s.GetConversation(ctx, "extended"); err != nil {
		t.Errorf("GetConversation(extended) after the sweeps = %v, want it kept", err)
	}
	// The swept ones no longer count against their peer's cap: at t0, p0
	// holds only the extended one.
	if err := s.CreateConversation(ctx, conv("new", "p0", at(due+1)), 2, t0); err != nil {
		t.Errorf("CreateConversation(p0, cap 2) after the sweeps = %v, want it created", err)
	}
	if n, err := s.SweepConversations(ctx, at(due+2), 10); err != nil || n != 2 {
		t.Errorf("SweepConversations(all) = %d, %v; want 2 (extended, new)", n, err)
	}
}

func testToolsAndCounts(t *testing.T, s store.Store) {
	ctx := t.Context()
	now := time.Unix(1_800_000_000, 0)
	tool := &dispatcherv1.Tool{Name: agent + "/tools/w", Kind: &dispatcherv1.Tool_Table{Table: &dispatcherv1.TableTool{EntriesJson: `{}`}}}
	if _, err := s.SetTool(ctx, tool, now); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SetTool(ctx, tool, now); err != nil {
		t.Fatal(err)
	}
	list, err := s.ListTools(ctx, agent)
	if err != nil || len(list) != 1 || list[0].GetUpdateTime() == nil {
		t.Errorf("ListTools = %v, %v; want one tool with update_time", list, err)
	}
	for _, wp := range []bool{true, false, true} {
		if err := s.CountSend(ctx, agent, "weather", "https://x", wp); err != nil {
			t.Fatal(err)
		}
	}
	counts, err := s.ListSendCounts(ctx, agent)
	if err != nil || len(counts) != 1 || counts[0].Conversations != 3 || counts[0].WithProtocol != 2 || counts[0].TargetURL != "https://x" {
		t.Errorf("ListSendCounts = %+v, %v; want weather/https://x 3 (2 with protocol)", counts, err)
	}
}

// sweepOldestFirst calls sweep with a limit of 3 until a call removes
// nothing, over due items that are all due (item 0 the oldest), and checks
// the batches: after k removed in all, item i is gone exactly when i < k,
// and seven due go in calls removing 3, 3, 1 and 0. what names the sweep,
// name an item, in the errors.
func sweepOldestFirst(t *testing.T, what string, due int, sweep func(limit int) (int, error), gone func(i int) bool, name func(i int) string) {
	t.Helper()
	var got []int
	removed := 0
	for range due {
		n, err := sweep(3)
		if err != nil {
			t.Fatalf("%s(limit 3) = %v", what, err)
		}
		got = append(got, n)
		if n == 0 {
			break
		}
		removed += n
		for i := range due {
			if g := gone(i); g != (i < removed) {
				t.Errorf("after %s removed %d: %s gone = %t, want %t", what, removed, name(i), g, i < removed)
			}
		}
	}
	if want := []int{3, 3, 1, 0}; !slices.Equal(got, want) {
		t.Errorf("%s(limit 3) removed %v per call, want %v", what, got, want)
	}
}
