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
// on open: the pair's terms are then kept under message id "" (read when
// an acceptance's chain of messages recorded none), beside an offer's own.
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
	// The dialogue, which SetOfferTerms needs.
	if _, err := old.Pool().Exec(ctx, `INSERT INTO dialogues (id, data) VALUES ('d1', '{"id":"d1"}')`); err != nil {
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
	if got, err := s.OfferTerms(ctx, "d1", bob, ""); err != nil || string(got) != `{"a":1}` {
		t.Errorf("OfferTerms(d1, bob, \"\") after the migration = %s, %v; want {\"a\":1}", got, err)
	}
	if err := s.SetOfferTerms(ctx, "d1", bob, "offer2", json.RawMessage(`{"a":2}`)); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]string{"": `{"a":1}`, "offer1": "", "offer2": `{"a":2}`} {
		if got, err := s.OfferTerms(ctx, "d1", bob, id); err != nil || string(got) != want {
			t.Errorf("OfferTerms(d1, bob, %s) after a new offer = %s, %v; want %s", id, got, err, want)
		}
	}
}

// A database migrated to version 11 (the sweep read the dialogues' JSON)
// gets 0012 on open, which fills dialogues.sweep_at and
// dialogue_messages.dialogue: the sweep then removes the closed dialogue
// and the broadcast with their messages and keeps the open one. Rows
// written afterwards without those columns, as a replica still running the
// previous binary writes them, get them from the trigger. 0012 fills them
// in batches of 1000 rows per transaction: the 2500 more dialogues and
// messages, closed later, are all filled too.
func TestOpen_migration12FillsTheDialogueSweepColumns(t *testing.T) {
	url, schema := pgdbtest.Schema(t)
	upTo11 := fstest.MapFS{}
	err := fs.WalkDir(migrationFiles, "migrations", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() >= "0012" {
			return err
		}
		data, err := fs.ReadFile(migrationFiles, path)
		upTo11[path] = &fstest.MapFile{Data: data}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	old, err := pgdb.Open(ctx, url, pgdb.Options{Schema: schema, Migrations: upTo11})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 12, 2, 10, 0, 0, 123456789, time.UTC)
	const bob = "clients/b/agents/bob"
	// oldWrite writes as the previous binary did: the JSON alone.
	oldWrite := func(db *pgdb.DB, sql string, args ...any) {
		t.Helper()
		if _, err := db.Pool().Exec(ctx, sql, args...); err != nil {
			t.Fatal(err)
		}
	}
	dialogues := []store.Dialogue{
		{ID: "closed", Category: "message", CreateTime: t0.Add(-time.Hour), Closed: true, CloseTime: t0},
		{ID: "closed-long-ago", Category: "message", CreateTime: t0, Closed: true}, // before close times were kept
		{ID: "broadcast", Category: "subscription", CreateTime: t0},
		{ID: "open", Category: "message", CreateTime: t0},
		{ID: "recent", Category: "message", CreateTime: t0, Closed: true, CloseTime: t0.Add(2 * time.Hour)},
	}
	for _, d := range dialogues {
		oldWrite(old, `INSERT INTO dialogues (id, data) VALUES ($1, $2)`, d.ID, marshal(d))
		m := store.DialogueMessage{ID: "m-" + d.ID, DialogueID: d.ID, Sender: bob, Type: "x", Time: t0}
		oldWrite(old, `INSERT INTO dialogue_messages (id, data) VALUES ($1, $2)`, m.ID, marshal(m))
		oldWrite(old, `INSERT INTO dialogue_receipts (message, agent) VALUES ($1, $2)`, m.ID, bob)
	}
	const bulk = 2500
	bulkClose := t0.Truncate(time.Second).Add(5 * time.Hour) // whole microseconds, as timestamptz keeps
	oldWrite(old, `INSERT INTO dialogues (id, data) SELECT 'bulk-' || g, convert_to(json_build_object(
  'id', 'bulk-' || g, 'category', 'message', 'createTime', $1::text, 'closed', true, 'closeTime', $2::text)::text, 'UTF8')
FROM generate_series(1, $3::int) AS g`, t0.Format(time.RFC3339Nano), bulkClose.Format(time.RFC3339Nano), bulk)
	oldWrite(old, `INSERT INTO dialogue_messages (id, data) SELECT 'm-bulk-' || g, convert_to(json_build_object(
  'id', 'm-bulk-' || g, 'dialogueId', 'bulk-' || g, 'sender', $1::text, 'type', 'x', 'time', $2::text)::text, 'UTF8')
FROM generate_series(1, $3::int) AS g`, bob, t0.Format(time.RFC3339Nano), bulk)
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	s, err := Open(ctx, url, schema, nil)
	if err != nil {
		t.Fatalf("Open(version 11): %v", err)
	}
	defer s.Close()
	var filled, linked int
	if err := s.db.Pool().QueryRow(ctx, `SELECT (SELECT count(*) FROM dialogues WHERE starts_with(id, 'bulk-') AND sweep_at = $1),
  (SELECT count(*) FROM dialogue_messages WHERE dialogue = 'bulk-' || substr(id, 8))`, bulkClose).Scan(&filled, &linked); err != nil {
		t.Fatal(err)
	}
	if filled != bulk || linked != bulk {
		t.Errorf("after 0012: %d dialogues with sweep_at, %d messages with their dialogue; want %d of each", filled, linked, bulk)
	}
	left := func() string {
		t.Helper()
		var out []string
		for _, d := range dialogues {
			_, errD := s.GetDialogue(ctx, d.ID)
			_, errM := s.GetDialogueMessage(ctx, "m-"+d.ID)
			if (errD == nil) != (errM == nil) {
				t.Errorf("dialogue %s: GetDialogue = %v but GetDialogueMessage = %v; want both or neither", d.ID, errD, errM)
			}
			if errD == nil {
				out = append(out, d.ID)
			}
		}
		return strings.Join(out, " ")
	}
	if n, err := s.SweepDialogues(ctx, t0.Add(time.Hour), 10); err != nil || n != 3 {
		t.Errorf("SweepDialogues(t0+1h) after the migration = %d, %v; want 3", n, err)
	}
	if got := left(); got != "open recent" {
		t.Errorf("dialogues left after the sweep = %q, want %q", got, "open recent")
	}
	// The previous binary, still running on another replica, closes
	// "open" and adds a message to "recent".
	closed := dialogues[3]
	closed.Closed, closed.CloseTime = true, t0
	oldWrite(s.db, `UPDATE dialogues SET data = $2 WHERE id = $1`, closed.ID, marshal(closed))
	m := store.DialogueMessage{ID: "m-late", DialogueID: "recent", Sender: bob, Type: "x", Time: t0}
	oldWrite(s.db, `INSERT INTO dialogue_messages (id, data) VALUES ($1, $2)`, m.ID, marshal(m))
	if n, err := s.SweepDialogues(ctx, t0.Add(time.Hour), 10); err != nil || n != 1 {
		t.Errorf("SweepDialogues(t0+1h) after an old replica closed one = %d, %v; want 1", n, err)
	}
	if n, err := s.SweepDialogues(ctx, t0.Add(3*time.Hour), 10); err != nil || n != 1 {
		t.Errorf("SweepDialogues(t0+3h) = %d, %v; want 1", n, err)
	}
	if got := left(); got != "" {
		t.Errorf("dialogues left after the last sweep = %q, want none", got)
	}
	if _, err := s.GetDialogueMessage(ctx, "m-late"); err == nil {
		t.Errorf("GetDialogueMessage(m-late) after its dialogue was swept = found, want not found")
	}
}

// Pair states are stored in protocolcontrol's binary form, which a release
// before it cannot read (it decoded JSON): that release must refuse the
// schema, as it refuses any migrated past what it knows, rather than start
// and fail every reply and deadline of the pairs written since. The
// migrations up to 0013 are what that release had.
func TestOpen_aReleaseBeforeBinaryPairStatesIsRefused(t *testing.T) {
	url, schema := pgdbtest.Schema(t)
	ctx := t.Context()
	s, err := Open(ctx, url, schema, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	upTo13 := fstest.MapFS{}
	err = fs.WalkDir(migrationFiles, "migrations", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() >= "0014" {
			return err
		}
		data, err := fs.ReadFile(migrationFiles, path)
		upTo13[path] = &fstest.MapFile{Data: data}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	old, err := pgdb.Open(ctx, url, pgdb.Options{Schema: schema, Migrations: upTo13})
	if err == nil {
		old.Close()
		t.Fatal("Open with the migrations up to 0013 succeeded; want the schema refused as newer")
	}
	if !strings.Contains(err.Error(), "newer") {
		t.Errorf("Open with the migrations up to 0013 = %v; want the refusal of a newer schema", err)
	}
}
