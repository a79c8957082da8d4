package deadline

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/parleyhq/parley/services/dispatcher/internal/protocolcontrol"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

// An expiry message's id is fixed by its timer: the order hook records it
// and a second firing is refused by it, so it must not change between
// releases.
func TestID_isStable(t *testing.T) {
	tm := store.Timer{Dialogue: "0f1e2d3c4b5a69788796a5b4c3d2e1f0", Initiator: consumer, Counterpart: supplier, Protocol: hash,
		Name: "invite_offer_timeout", At: time.Date(2026, 12, 2, 10, 0, 30, 5, time.UTC)}
	if got, want := ID(tm), "18ed6780f7b4ec05b33518d7edd164a6"; got != want {
		t.Errorf("ID() = %s, want %s", got, want)
	}
	tm.Retry, tm.Failures = tm.At.Add(time.Minute), 2 // a retry is the same expiry
	if got, want := ID(tm), "18ed6780f7b4ec05b33518d7edd164a6"; got != want {
		t.Errorf("ID(after a retry) = %s, want %s", got, want)
	}
}

// The expiry body is the JSON encoding/json writes of expiryBody, whatever
// the strings hold.
func TestMessage_bodyAsEncodingJSON(t *testing.T) {
	at := time.Date(2026, 12, 2, 10, 0, 30, 0, time.UTC)
	for _, c := range []struct {
		counterpart, name, state string
		outcome                  protocolcontrol.Outcome
	}{
		{supplier, "invite_offer_timeout", "new_task_request", protocolcontrol.OutcomeFailure},
		{supplier, "x", "", ""},
		{`clients/"q"/agents/<a>&b`, "n\u2028\\\x01\t", "é\xff", "ok"},
	} {
		tm := store.Timer{Dialogue: "d", Initiator: consumer, Counterpart: c.counterpart, Protocol: hash, Name: c.name, At: at}
		want, err := json.Marshal(expiryBody{Counterpart: c.counterpart, Deadline: c.name, DeadlineTime: "2026-12-02T10:00:30Z",
			Initiator: consumer, Outcome: string(c.outcome), State: c.state})
		if err != nil {
			t.Fatal(err)
		}
		if got := Message(tm, protocolcontrol.Pair{Outcome: c.outcome, State: c.state}).Body; string(got) != string(want) {
			t.Errorf("Message(%q).Body = %s\nwant %s", c.counterpart, got, want)
		}
	}
}
