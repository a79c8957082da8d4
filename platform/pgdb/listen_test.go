package pgdb_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/parleyhq/parley/platform/pgdb"
	"github.com/parleyhq/parley/platform/pgdb/pgdbtest"
)

type note struct{ channel, payload string }

// Listen delivers notifications; when its connection is killed it listens
// again, first telling fn with an empty payload that it may have missed
// some, and then delivers the next ones.
func TestListen_deliversAndResumesAfterItsConnectionDies(t *testing.T) {
	url, schema := pgdbtest.Schema(t)
	db := open(t, url, schema, counterMigrations)
	ch := "chan_" + schema
	got := make(chan note, 16)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		db.Listen(ctx, []string{ch}, slog.New(slog.DiscardHandler), func(c, p string) { got <- note{c, p} })
	}()
	defer func() { cancel(); <-done }()
	next := func(what string) note {
		t.Helper()
		select {
		case n := <-got:
			return n
		case <-time.After(30 * time.Second): // generous: a failure, not a measure
			t.Fatalf("no notification: %s", what)
			return note{}
		}
	}
	if n := next("the first resync"); n != (note{ch, ""}) {
		t.Fatalf("first call = %+v, want the resync of %s", n, ch)
	}
	if _, err := db.Pool().Exec(t.Context(), `SELECT pg_notify($1, 'one')`, ch); err != nil {
		t.Fatal(err)
	}
	if n := next("one"); n != (note{ch, "one"}) {
		t.Fatalf("got %+v, want one", n)
	}
	// Kill the listening connection.
	var killed int
	if err := db.Pool().QueryRow(t.Context(), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE query = $1`,
		`LISTEN "`+ch+`"`).Scan(&killed); err != nil || killed != 1 {
		t.Fatalf("terminated %d listeners, %v; want 1", killed, err)
	}
	if n := next("the resync after reconnecting"); n != (note{ch, ""}) {
		t.Fatalf("after the kill got %+v, want a resync", n)
	}
	if _, err := db.Pool().Exec(t.Context(), `SELECT pg_notify($1, 'two')`, ch); err != nil {
		t.Fatal(err)
	}
	if n := next("two"); n != (note{ch, "two"}) {
		t.Fatalf("got %+v, want two", n)
	}
}

func TestChannel_fitsPostgreSQLsIdentifiers(t *testing.T) {
	long := strings.Repeat("s", 60)
	tests := []struct {
		name, prefix, schema, want string
	}{
		{"short: as is", "parley_mailbox_", "dispatcher", "parley_mailbox_dispatcher"},
		{"63 bytes: as is", "p_", strings.Repeat("s", 61), "p_" + strings.Repeat("s", 61)},
		{"longer: the tail hashed", "parley_routines_", long + "abc", "parley_routines_" + strings.Repeat("s", 30) + "_" + hash16(long+"abc")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := pgdb.Channel(tt.prefix, tt.schema)
			if got != tt.want || len(got) > 63 {
				t.Errorf("Channel(%q, %q) = %q (%d bytes), want %q", tt.prefix, tt.schema, got, len(got), tt.want)
			}
		})
	}
	if a, b := pgdb.Channel("parley_streams_", long+"a"), pgdb.Channel("parley_streams_", long+"b"); a == b {
		t.Errorf("two long schemas differing at the end share the channel %q", a)
	}
}

func hash16(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:8])
}
