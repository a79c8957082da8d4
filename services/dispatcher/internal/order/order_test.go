package order

import (
	"fmt"
	"os"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/services/dispatcher/internal/protocolcontrol"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
	"github.com/parleyhq/parley/services/dispatcher/internal/store/boltstore"
)

const (
	consumer = "clients/acme/agents/consumer"
	supplier = "clients/beta/agents/supplier"
)

var t0 = time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)

func allocate(t *testing.T) *protocolcontrol.Machine {
	t.Helper()
	raw, err := os.ReadFile("../serviceprotocol/testdata/allocate.json")
	if err != nil {
		t.Fatal(err)
	}
	sm := &registryv1.StateMachine{}
	if err := protojson.Unmarshal(raw, sm); err != nil {
		t.Fatal(err)
	}
	m, err := protocolcontrol.Compile(sm)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// An allocate round through to confirm_fail: the order forms at
// accept_offer, records every later message, and ends failed.
func TestRecord_allocateRoundToConfirmFail(t *testing.T) {
	st, err := boltstore.Open(t.TempDir(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	r := New(st)
	m := allocate(t)
	steps := []struct {
		from          protocolcontrol.Party
		typ, answers  string
		wantRecorded  bool
		wantState     store.OrderState
		wantTrailSize int
	}{
		{protocolcontrol.Initiator, "new_task_request", "", false, "", 0},
		{protocolcontrol.Counterpart, "offer", "new_task_request", false, "", 0},
		{protocolcontrol.Initiator, "accept_offer", "offer", true, store.OrderActive, 1},
		{protocolcontrol.Counterpart, "request_message", "accept_offer", true, store.OrderActive, 2},
		{protocolcontrol.Counterpart, "order_complete", "accept_offer", true, store.OrderSucceeded, 3},
		{protocolcontrol.Initiator, "confirm_fail", "order_complete", true, store.OrderFailed, 4},
	}
	var state []byte
	for i, s := range steps {
		res, err := m.Check(state, protocolcontrol.Input{Sender: s.from, Type: s.typ, AnswersType: s.answers, Body: []byte(`{"task":{},"offer":{}}`), Now: t0})
		if err != nil {
			t.Fatalf("Check(%s) error = %v", s.typ, err)
		}
		sender := consumer
		if s.from == protocolcontrol.Counterpart {
			sender = supplier
		}
		o, recorded, err := r.Record(t.Context(), Event{
			Dialogue: "d1", Protocol: "p", Consumer: consumer, Supplier: supplier, Prev: state, Next: res.State,
			MessageID: fmt.Sprintf("m%d", i), Type: s.typ, Sender: sender, Time: t0.Add(time.Duration(i) * time.Second),
		})
		if err != nil || recorded != s.wantRecorded || o.State != s.wantState || len(o.Transitions) != s.wantTrailSize {
			t.Fatalf("Record(%s) = %+v, %v, %v; want recorded %v, state %q, %d transitions", s.typ, o, recorded, err, s.wantRecorded, s.wantState, s.wantTrailSize)
		}
		state = res.State
	}
	o, err := st.GetOrder(t.Context(), ID("d1", supplier))
	if err != nil {
		t.Fatal(err)
	}
	// confirm_fail is a failure; the original reported it as a success.
	if o.State != store.OrderFailed || o.Transitions[3].Sender != consumer || o.Transitions[0].MessageID != "m2" || !o.CreateTime.Equal(t0.Add(2*time.Second)) {
		t.Errorf("order = %+v, want failed, formed by m2 at t0+2s, confirm_fail by the consumer", o)
	}
}

// The order id is known before the order forms, so that an owner can sign
// an approval of it: it is fixed by the pair, and differs between pairs.
func TestID(t *testing.T) {
	a, b, c := ID("d1", supplier), ID("d1", consumer), ID("d2", supplier)
	if a != ID("d1", supplier) || a == b || a == c || len(a) != 32 {
		t.Errorf("ID = %q, %q, %q; want 32 hex digits, stable per pair and different across pairs", a, b, c)
	}
	// Pinned: clients compute it too (sdk.OrderID, parley approve).
	if want := "20fd56ddbc4510d72cd75219c035bdd3"; a != want {
		t.Errorf("ID(d1, supplier) = %q, want %q", a, want)
	}
}
