package pgdb_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

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
