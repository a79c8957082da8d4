package boltstore

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

// A timer reads back as it was stored, in the binary form and in the JSON
// form of schema 10 and before; a truncated or unknown value is an error.
func TestDecodeTimer_bothForms(t *testing.T) {
	at := time.Date(2026, 12, 2, 10, 0, 0, 123456789, time.UTC)
	for _, tm := range []store.Timer{
		{Dialogue: "d", Initiator: "clients/a/agents/c", Counterpart: "clients/b/agents/s", Protocol: strings.Repeat("f", 40), Name: "offer_timeout", At: at},
		{Dialogue: strings.Repeat("é", 200), Name: "x", At: at, Retry: at.Add(time.Hour), Failures: 300},
		{At: at},
	} {
		bin := encodeTimer(tm)
		if got, err := decodeTimer(bin); err != nil || got != tm {
			t.Errorf("decodeTimer(encodeTimer(%+v)) = %+v, %v", tm, got, err)
		}
		js, err := json.Marshal(tm)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := decodeTimer(js); err != nil || got != tm {
			t.Errorf("decodeTimer(JSON of %+v) = %+v, %v", tm, got, err)
		}
		for i := range len(bin) {
			if got, err := decodeTimer(bin[:i]); err == nil {
				t.Errorf("decodeTimer(the first %d of %d bytes) = %+v, want an error", i, len(bin), got)
			}
		}
		if got, err := decodeTimer(append(bin, 0)); err == nil {
			t.Errorf("decodeTimer(a byte too many) = %+v, want an error", got)
		}
	}
	if got, err := decodeTimer([]byte{2, 0}); err == nil {
		t.Errorf("decodeTimer(format 2) = %+v, want an error", got)
	}
}

// A stored message reads back as it was appended, in the binary form and
// in the JSON form of schema 10 and before; a truncated value is an error.
func TestDecodeMessage_bothForms(t *testing.T) {
	at := time.Date(2026, 12, 2, 10, 0, 0, 123456789, time.UTC)
	for _, m := range []mailbox.Message{
		{ID: "m1", DialogueID: "d", Sender: "clients/a/agents/c", Category: mailbox.CategoryService, Type: "offer", Protocol: strings.Repeat("f", 40),
			RecipientType: "supplier", InReplyTo: "m0", Body: []byte(`{"price":{"amount":"12.50"},"note":"<é>"}`), Time: at},
		{ID: "m2", Category: mailbox.CategoryNotifications, Type: "x", Body: []byte(strings.Repeat("x", 70_000)), Time: at.Add(-100 * 365 * 24 * time.Hour)},
		{ID: "m3", Body: []byte(`1`)},
	} {
		bin := encodeMessage(m)
		if got, err := decodeMessage(bin); err != nil || !reflect.DeepEqual(got, m) {
			t.Errorf("decodeMessage(encodeMessage(%.80v)) = %.80v, %v", m, got, err)
		}
		js, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := decodeMessage(js); err != nil || !reflect.DeepEqual(got, m) {
			t.Errorf("decodeMessage(JSON of %.80v) = %.80v, %v", m, got, err)
		}
		for _, i := range []int{0, 1, 5, len(bin) / 2, len(bin) - 1} {
			if got, err := decodeMessage(bin[:i]); err == nil {
				t.Errorf("decodeMessage(the first %d of %d bytes) = %.80v, want an error", i, len(bin), got)
			}
		}
		if got, err := decodeMessage(append(bin, 0)); err == nil {
			t.Errorf("decodeMessage(a byte too many) = %.80v, want an error", got)
		}
	}
}
