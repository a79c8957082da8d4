package pgstore

import (
	"encoding/json"
	"io/fs"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/parleyhq/parley/platform/pgdb"
	"github.com/parleyhq/parley/platform/pgdb/pgdbtest"
	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

// A database migrated to version 3 (no compact_ns) gets 0004 on open,
// which fills compact_ns from the mailboxes' references: the
// acknowledged, old one is then compacted and the unacknowledged one kept.
func TestOpen_migration4FillsCompactNs(t *testing.T) {
	url, schema := pgdbtest.Schema(t)
	upTo3 := fstest.MapFS{}
	err := fs.WalkDir(migrationFiles, "migrations", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.HasPrefix(d.Name(), "0004") || d.Name() > "0004" {
			return err
		}
		data, err := fs.ReadFile(migrationFiles, path)
		upTo3[path] = &fstest.MapFile{Data: data}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	old, err := pgdb.Open(ctx, url, pgdb.Options{Schema: schema, Migrations: upTo3})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1_800_000_000, 0).UTC()
	const bob = "clients/b/agents/bob"
	for i, id := range []string{"m1", "m2"} {
		data, _ := json.Marshal(mailbox.Message{ID: id, DialogueID: "d", Category: mailbox.CategoryMessage, Type: "x", Time: t0})
		if _, err := old.Pool().Exec(ctx, `INSERT INTO mail_messages (id, refs, data) VALUES ($1, 1, $2)`, id, data); err != nil {
			t.Fatal(err)
		}
		if _, err := old.Pool().Exec(ctx, `INSERT INTO mailbox_refs (agent, cursor, message, sent_ns, size) VALUES ($1, $2, $3, $4, 1)`, bob, i+1, id, t0.UnixNano()); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := old.Pool().Exec(ctx, `INSERT INTO mailboxes (agent, head, acked, pending, pending_bytes) VALUES ($1, 2, 1, 1, 1)`, bob); err != nil {
		t.Fatal(err)
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	s, err := Open(ctx, url, schema, nil)
	if err != nil {
		t.Fatalf("Open(version 3): %v", err)
	}
	defer s.Close()
	if n, err := s.CompactMailboxes(ctx, t0.Add(time.Hour), 10); err != nil || n != 1 {
		t.Fatalf("CompactMailboxes after the migration = %d, %v; want 1", n, err)
	}
	if left, err := s.ReadMailbox(ctx, bob, 0, 10); err != nil || len(left) != 1 || left[0].Message.ID != "m2" {
		t.Errorf("ReadMailbox(bob) = %+v, %v; want only m2, unacknowledged", left, err)
	}
}

// A database migrated to version 4 gets 0005 and 0007 on open, which fill
// payments.payer, payments.open and payments.sweep_ns from the JSON: a
// create then counts the payer's payments not captured, and the sweep
// finds the payments not reserved.
func TestOpen_migration5FillsOpenPayments(t *testing.T) {
	url, schema := pgdbtest.Schema(t)
	upTo4 := fstest.MapFS{}
	err := fs.WalkDir(migrationFiles, "migrations", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() >= "0005" {
			return err
		}
		data, err := fs.ReadFile(migrationFiles, path)
		upTo4[path] = &fstest.MapFile{Data: data}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	old, err := pgdb.Open(ctx, url, pgdb.Options{Schema: schema, Migrations: upTo4})
	if err != nil {
		t.Fatal(err)
	}
	const alice, bob = "clients/a/agents/alice", "clients/b/agents/bob"
	paid := time.Date(2026, 12, 2, 10, 0, 0, 123456000, time.UTC)
	for id, st := range map[string]store.PaymentState{"p1": store.PaymentAuthorized, "p2": store.PaymentReserved, "p3": store.PaymentCaptured} {
		data, _ := json.Marshal(store.Payment{ID: id, Payer: alice, Payee: bob, AmountMicros: 1, Currency: "USD", State: st, UpdateTime: paid})
		if _, err := old.Pool().Exec(ctx, `INSERT INTO payments (id, data) VALUES ($1, $2)`, id, data); err != nil {
			t.Fatal(err)
		}
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	s, err := Open(ctx, url, schema, nil)
	if err != nil {
		t.Fatalf("Open(version 4): %v", err)
	}
	defer s.Close()
	open := -1
	p := store.Payment{ID: "p4", Payer: alice, Payee: bob, AmountMicros: 1, Currency: "USD", State: store.PaymentAuthorized, UpdateTime: paid.Add(2 * time.Hour)}
	if _, _, err := s.CreatePayment(ctx, p, "", func(n int) error { open = n; return nil }); err != nil || open != 2 {
		t.Errorf("CreatePayment after the migration saw %d open payments (%v), want 2", open, err)
	}
	// The sweep removes the payments not reserved, by their update time.
	if n, err := s.SweepPayments(t.Context(), paid.Add(time.Hour), 10); err != nil || n != 2 {
		t.Errorf("SweepPayments after the migration = %d, %v; want 2", n, err)
	}
}

// A database migrated to version 10 (one offer's terms per pair) gets 0011
// on open: the pair's terms are then found for any message of the pair,
// until an offer records its own.
func TestOpen_migration11KeysOfferTermsByMessage(t *testing.T) {
	url, schema := pgdbtest.Schema(t)
	upTo10 := fstest.MapFS{}
	err := fs.WalkDir(migrationFiles, "migrations", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() >= "0011" {
			return err
		}
		data, err := fs.ReadFile(migrationFiles, path)
		upTo10[path] = &fstest.MapFile{Data: data}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	old, err := pgdb.Open(ctx, url, pgdb.Options{Schema: schema, Migrations: upTo10})
	if err != nil {
		t.Fatal(err)
	}
	const bob = "clients/b/agents/bob"
	if _, err := old.Pool().Exec(ctx, `INSERT INTO offer_terms (dialogue, supplier, terms) VALUES ('d1', $1, $2)`, bob, []byte(`{"a":1}`)); err != nil {
		t.Fatal(err)
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	s, err := Open(ctx, url, schema, nil)
	if err != nil {
		t.Fatalf("Open(version 10): %v", err)
	}
	defer s.Close()
	if got, err := s.OfferTerms(ctx, "d1", bob, "offer1"); err != nil || string(got) != `{"a":1}` {
		t.Errorf("OfferTerms(d1, bob) after the migration = %s, %v; want {\"a\":1}", got, err)
	}
	if err := s.SetOfferTerms(ctx, "d1", bob, "offer2", json.RawMessage(`{"a":2}`)); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]string{"offer1": `{"a":2}`, "offer2": `{"a":2}`} {
		if got, err := s.OfferTerms(ctx, "d1", bob, id); err != nil || string(got) != want {
			t.Errorf("OfferTerms(d1, bob, %s) after a new offer = %s, %v; want %s", id, got, err, want)
		}
	}
}
