package protocolcontrol

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
)

// A pair's state reads back as Check or Expire encoded it, and a state
// stored as JSON (before the binary form) reads the same; a truncated or
// unknown one is an error, never a panic.
func TestInspect_bothForms(t *testing.T) {
	at := time.Date(2026, 12, 2, 10, 0, 30, 5, time.UTC)
	for _, p := range []Pair{
		{},
		{InitiatorRole: "consumer", CounterpartRole: "supplier", State: "new_task_request", Order: true, Deadlines: []Deadline{
			{Name: "invite_offer_timeout", At: at, Guards: []string{"offer", "decline"}, SetBy: "new_task_request"},
			{Name: "x", At: at.Add(time.Hour), SetBy: "y"},
		}},
		{InitiatorRole: "a", CounterpartRole: "b", State: "s", Outcome: OutcomeFailure, Ended: true, Expired: strings.Repeat("é", 100)},
	} {
		bin := encodePair(p)
		if got, err := Inspect(bin); err != nil || !reflect.DeepEqual(got, p) {
			t.Errorf("Inspect(encodePair(%+v)) = %+v, %v", p, got, err)
		}
		js, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := Inspect(js); err != nil || !reflect.DeepEqual(got, p) {
			t.Errorf("Inspect(JSON of %+v) = %+v, %v", p, got, err)
		}
		for i := 1; i < len(bin); i++ {
			if got, err := Inspect(bin[:i]); err == nil {
				t.Errorf("Inspect(the first %d of %d bytes) = %+v, want an error", i, len(bin), got)
			}
		}
		if got, err := Inspect(append(bin, 0)); err == nil {
			t.Errorf("Inspect(a byte too many) = %+v, want an error", got)
		}
	}
	if got, err := Inspect([]byte{9}); err == nil {
		t.Errorf("Inspect(form 9) = %+v, want an error", got)
	}
}

// The binary form holds every field: one added to Pair or Deadline must be
// added to encodePair and decodePair too (and to this count).
func TestEncodePair_coversEveryField(t *testing.T) {
	if n := reflect.TypeFor[Pair]().NumField(); n != 8 {
		t.Errorf("Pair has %d fields; encodePair writes 8", n)
	}
	if n := reflect.TypeFor[Deadline]().NumField(); n != 4 {
		t.Errorf("Deadline has %d fields; encodePair writes 4", n)
	}
}

// Check and Expire store the binary form, and carry on from a state
// stored as JSON.
func TestCheck_storesTheBinaryFormAndReadsJSON(t *testing.T) {
	m := shopMachine(t)
	res, err := m.Check(nil, Input{Sender: Initiator, Type: "request", Body: []byte(`{"offer_timeout":30}`), Now: t0})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.State) == 0 || res.State[0] != pairFormat1 {
		t.Fatalf("Check stored %q, want the binary form", res.State)
	}
	js, err := json.Marshal(res.Pair) // as a release before stored it
	if err != nil {
		t.Fatal(err)
	}
	for _, state := range [][]byte{res.State, js} {
		exp, fired, err := m.Expire(state, "offer_timeout", t0.Add(time.Hour))
		if err != nil || !fired || !exp.Pair.Ended || exp.State[0] != pairFormat1 {
			t.Errorf("Expire(%.20q) = %+v, %v, %v; want it fired, ended, in the binary form", state, exp.Pair, fired, err)
		}
	}
}
