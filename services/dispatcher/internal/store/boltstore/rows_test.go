package boltstore

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/parleyhq/parley/platform/boltdb"
	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

// rowsModel is what a run of TestRows_randomOwnersKeepTheirRows should
// have stored.
type rowsModel struct {
	dialogues map[string]*modelDialogue // live
	swept     []string
	messages  map[string]string // dialogue message id → its dialogue, live or swept
	refs      map[string][]modelRef
	acked     map[string]uint64
	head      map[string]uint64
}

type modelDialogue struct {
	initiator    string
	opener       string
	closed       bool
	participants map[string]bool // agent → closed for it
	pairs        map[string]string
	messages     []string // with the opener
	received     map[string][]string
}

type modelRef struct {
	cursor uint64
	id     string
}

// Owners whose names extend each other's (agents a, a2, a-b, ab; dialogues
// and messages d, d1, d10, d1-m1, ...; notifications whose dialogue id is
// their own id; time-ordered hex ids), under random sends, replies,
// acknowledgements, compactions, closes and sweeps: every row of agents
// and dialogues belongs to a live owner of the model, and every row the
// model needs is there. (The layout is in rows.go; the storetest suite
// checks the same through the Store's methods, for both backends.)
func TestRows_randomOwnersKeepTheirRows(t *testing.T) {
	seeds := uint64(16)
	if testing.Short() {
		seeds = 2
	}
	for seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { runRandomRows(t, seed, t.TempDir()) })
	}
}

// runRandomRows runs random operations on a store in dir, checking its
// rows after each, and returns it open.
func runRandomRows(t *testing.T, seed uint64, dir string) *Store {
	ctx := t.Context()
	r := rand.New(rand.NewPCG(seed, 13))
	s, err := Open(dir, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	t0 := time.Unix(1_800_000_000, 0).UTC()
	agents := []string{"clients/c/agents/a", "clients/c/agents/a2", "clients/c/agents/a-b", "clients/c/agents/ab", "clients/c/agents/b"}
	m := rowsModel{
		dialogues: map[string]*modelDialogue{}, messages: map[string]string{},
		refs: map[string][]modelRef{}, acked: map[string]uint64{}, head: map[string]uint64{},
	}
	bodies := map[string]bool{} // message ids appended
	ids := 0
	newID := func(prefix string) string {
		ids++
		switch r.IntN(3) {
		case 0: // a time-ordered id, as dialogue.NewID makes
			return fmt.Sprintf("%012x%020x", 1_800_000_000_000+ids, r.Uint64())
		case 1: // extends a live dialogue's id
			for d := range m.dialogues {
				return d + fmt.Sprint(r.IntN(3))
			}
		}
		return prefix + fmt.Sprint(ids%12)
	}
	deliver := func(id string, to []string) {
		for _, a := range to {
			m.head[a]++
			m.refs[a] = append(m.refs[a], modelRef{cursor: m.head[a], id: id})
		}
		bodies[id] = true
	}
	for range 120 {
		switch op := r.IntN(9); op {
		case 0, 1: // a new dialogue
			id := newID("d")
			if _, ok := m.dialogues[id]; ok || slices.Contains(m.swept, id) {
				continue
			}
			msg := id + "-m1"
			if r.IntN(2) == 0 {
				msg = newID("m")
			}
			if _, taken := m.messages[msg]; taken || bodies[msg] {
				continue
			}
			from := agents[r.IntN(len(agents))]
			var to []string
			for _, a := range agents {
				if a != from && r.IntN(2) == 0 {
					to = append(to, a)
				}
			}
			if len(to) == 0 {
				continue
			}
			md := &modelDialogue{initiator: from, opener: msg, participants: map[string]bool{from: false}, pairs: map[string]string{}, messages: []string{msg}, received: map[string][]string{msg: to}}
			var pairs []store.PairState
			for _, a := range to {
				p := store.Pair{A: from, B: a}
				st := fmt.Sprintf(`{"d":%q,"n":1}`, id)
				pairs = append(pairs, store.PairState{Pair: p, State: json.RawMessage(st)})
				md.pairs[string(pairKey(id, p))] = st
				md.participants[a] = false
			}
			d := store.Dialogue{ID: id, Initiator: from, Category: "message", CreateTime: t0, Opener: msg}
			w := store.MessageWrite{
				Message: store.DialogueMessage{ID: msg, Sender: from, Type: "new_message", Time: t0}, Recipients: to, Pairs: pairs,
				Mail: mailbox.Message{Sender: from, Category: mailbox.CategoryMessage, Type: "new_message", Body: []byte(`"hi"`), Time: t0},
			}
			if _, err := s.CreateDialogue(ctx, d, w, mailbox.Bound{}); err != nil {
				t.Fatalf("CreateDialogue(%s, %s) = %v", id, msg, err)
			}
			m.dialogues[id], m.messages[msg] = md, id
			deliver(msg, to)
		case 2: // a reply to a live message
			var live []string
			for msg, d := range m.messages {
				if _, ok := m.dialogues[d]; ok {
					live = append(live, msg)
				}
			}
			if len(live) == 0 {
				continue
			}
			slices.Sort(live)
			answered := live[r.IntN(len(live))]
			md := m.dialogues[m.messages[answered]]
			rec := md.received[answered]
			if len(rec) == 0 {
				continue
			}
			from := rec[r.IntN(len(rec))]
			to := md.initiator
			if from == to {
				continue
			}
			msg := newID(m.messages[answered] + "-m")
			if _, taken := m.messages[msg]; taken || bodies[msg] {
				continue
			}
			p := store.Pair{A: to, B: from}
			st := fmt.Sprintf(`{"d":%q,"n":%d}`, m.messages[answered], len(md.messages)+1)
			_, err := s.AddMessage(ctx, answered, mailbox.Bound{}, func(store.DialogueView) (store.MessageWrite, error) {
				return store.MessageWrite{
					Message: store.DialogueMessage{ID: msg, Sender: from, Type: "reply", InReplyTo: answered, Time: t0}, Recipients: []string{to},
					Pairs: []store.PairState{{Pair: p, State: json.RawMessage(st)}},
					Mail:  mailbox.Message{Sender: from, Category: mailbox.CategoryMessage, Type: "reply", Body: []byte(`"re"`), Time: t0},
				}, nil
			})
			if err != nil {
				t.Fatalf("AddMessage(%s answering %s) = %v", msg, answered, err)
			}
			md.messages = append(md.messages, msg)
			md.received[msg] = []string{to}
			md.pairs[string(pairKey(m.messages[answered], p))] = st
			m.messages[msg] = m.messages[answered]
			deliver(msg, []string{to})
		case 3: // a notification: its own dialogue id, no dialogue
			id := newID("ntf-")
			for d := range m.dialogues {
				if r.IntN(4) == 0 {
					id = d // a message under a dialogue's id (never made so, but kept apart)
				}
				break
			}
			if _, taken := m.messages[id]; taken || bodies[id] {
				continue
			}
			to := agents[r.IntN(len(agents))]
			if _, _, err := s.AppendMessage(ctx, mailbox.Message{ID: id, DialogueID: id, Category: mailbox.CategoryNotifications, Type: "n", Body: []byte(`{}`), Time: t0}, []string{to}, mailbox.Bound{}); err != nil {
				t.Fatalf("AppendMessage(%s) = %v", id, err)
			}
			deliver(id, []string{to})
		case 4: // acknowledge
			a := agents[r.IntN(len(agents))]
			if m.head[a] == 0 {
				continue
			}
			to := uint64(r.IntN(int(m.head[a]) + 1))
			if _, err := s.AcknowledgeMailbox(ctx, a, to); err != nil {
				t.Fatal(err)
			}
			m.acked[a] = max(m.acked[a], to)
		case 5: // compact everything due
			for {
				n, err := s.CompactMailboxes(ctx, t0.Add(time.Hour), 1+r.IntN(3))
				if err != nil {
					t.Fatal(err)
				}
				if n == 0 {
					break
				}
			}
			for a, rs := range m.refs {
				m.refs[a] = slices.DeleteFunc(rs, func(x modelRef) bool { return x.cursor <= m.acked[a] })
			}
		case 6: // close a dialogue for all
			for id, md := range m.dialogues {
				if _, _, err := s.UpdateParticipant(ctx, id, md.initiator, func(d *store.Dialogue, _ *store.Participant) error {
					d.Closed, d.CloseTime = true, t0
					return nil
				}); err != nil {
					t.Fatal(err)
				}
				md.closed = true
				break
			}
		case 7: // sweep the closed ones
			for {
				n, err := s.SweepDialogues(ctx, t0.Add(time.Hour), 1+r.IntN(2))
				if err != nil {
					t.Fatal(err)
				}
				if n == 0 {
					break
				}
			}
			for id, md := range m.dialogues {
				if md.closed {
					delete(m.dialogues, id)
					m.swept = append(m.swept, id)
				}
			}
		case 8: // close all of an agent's dialogues for it
			a := agents[r.IntN(len(agents))]
			want := 0
			for _, md := range m.dialogues {
				if closed, ok := md.participants[a]; ok && !closed && !md.closed {
					want++
					md.participants[a] = true
				}
			}
			n, err := s.UpdateAgentDialogues(ctx, a, func(_ *store.Dialogue, p *store.Participant) (bool, error) {
				p.Closed = true
				return true, nil
			})
			if err != nil || n != want {
				t.Fatalf("UpdateAgentDialogues(%s) = %d, %v; want %d", a, n, err, want)
			}
		}
		checkRows(t, s, &m)
	}
	return s
}

// checkRows compares every row of agents and dialogues with m.
func checkRows(t *testing.T, s *Store, m *rowsModel) {
	t.Helper()
	kept := map[string]int{} // message id → references kept
	for _, rs := range m.refs {
		for _, r := range rs {
			kept[r.id]++
		}
	}
	want := map[string]string{} // bucket + key → a description
	for a, rs := range m.refs {
		for _, r := range rs {
			want[string(bucketAgents)+"|"+string(refKey(a, r.cursor))] = "ref"
		}
		want[string(bucketAgents)+"|"+string(stateKey(a))] = "state"
	}
	for id, md := range m.dialogues {
		want[string(bucketDialogues)+"|"+id] = "record"
		for a := range md.participants {
			want[string(bucketDialogues)+"|"+string(participantKey(id, a))] = "participant"
			want[string(bucketAgents)+"|"+string(agentDialogueKey(a, id))] = "agent dialogue"
		}
		for k := range md.pairs {
			owner, rest, _ := bytes.Cut([]byte(k), []byte{0})
			want[string(bucketDialogues)+"|"+string(rowKey(string(owner), kindPair, string(rest)))] = "pair"
		}
		for _, msg := range md.messages {
			want[string(bucketDialogues)+"|"+string(messageKey(msg))] = "message"
			if msg != md.opener {
				want[string(bucketDialogues)+"|"+string(messageIndexKey(id, msg))] = "index"
			}
		}
	}
	for id, n := range kept {
		want[string(bucketDialogues)+"|"+string(bodyKey(id))] = "body"
		if n > 1 {
			want[string(bucketDialogues)+"|"+string(refCountKey(id))] = "count"
		}
	}
	err := s.db.View(func(tx *boltdb.Tx) error {
		for _, b := range [][]byte{bucketAgents, bucketDialogues} {
			err := tx.Bucket(b).ForEach(func(k, v []byte) error {
				key := string(b) + "|" + string(k)
				if _, ok := want[key]; ok {
					delete(want, key)
					return nil
				}
				owner, kind, _, _ := splitRow(k)
				if bytes.Equal(b, bucketDialogues) && kind == kindRefCount && len(v) == 8 && binary.BigEndian.Uint64(v) == uint64(kept[string(owner)]) {
					return nil // a count come down to one
				}
				t.Errorf("%s holds row %q (owner %q, kind %d) that the model does not", b, k, owner, kind)
				return nil
			})
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for k, what := range want {
		t.Errorf("%s row %q is missing", what, k)
	}
	for a, rs := range m.refs {
		ds, err := s.ReadMailbox(t.Context(), a, 0, 1000)
		if err != nil || len(ds) != len(rs) {
			t.Fatalf("ReadMailbox(%s) = %d deliveries, %v; want %d", a, len(ds), err, len(rs))
		}
	}
	for _, id := range m.swept {
		if _, err := s.GetDialogue(t.Context(), id); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("GetDialogue(%s) after its sweep = %v, want ErrNotFound", id, err)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
}

// A file of schema 12 (or 2, or 1) holding what the random runs store
// (owners whose names extend each other's, messages under a dialogue's
// id, notifications) is migrated on open into exactly the rows schema 13
// writes: the file is the random run's, with its rows of agents and
// dialogues put back into schema 12's buckets as that schema keyed them,
// and the indexes a schema-2 (compaction work list) or schema-1 (closed
// dialogues, message index) file lacked emptied. A schema-1 file's
// rebuilt message index holds the openers too (schema 1 kept no Opener).
// The regroup runs in batches of a few rows and is resumed after a stop.
func TestOpen_regroupsRandomRowsExactly(t *testing.T) {
	seeds := uint64(3)
	if testing.Short() {
		seeds = 1
	}
	for _, version := range []int{12, 2, 1} {
		for seed := range seeds {
			t.Run(fmt.Sprintf("schema %d seed %d", version, seed), func(t *testing.T) { regroupRandomRows(t, version, seed) })
		}
	}
}

func regroupRandomRows(t *testing.T, version int, seed uint64) {
	dir := t.TempDir()
	s := runRandomRows(t, seed, dir)
	want := dumpBuckets(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if version < 2 {
		for k, v := range want {
			if id, ok := strings.CutPrefix(k, string(bucketDialogues)+"|"); ok && !strings.ContainsFunc(id, func(r rune) bool { return r < 0x20 }) {
				var d store.Dialogue
				if err := json.Unmarshal([]byte(v), &d); err != nil {
					t.Fatal(err)
				}
				want[string(bucketDialogues)+"|"+string(messageIndexKey(id, d.Opener))] = ""
			}
		}
	}
	db, err := boltdb.Open(filepath.Join(dir, FileName), boltdb.Options{SchemaVersion: schemaVersion, LockTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *boltdb.Tx) error { return ungroup(tx, version) }); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	// In small batches, stopped after the first as a crash would, then
	// resumed: batch edges fall between an owner's rows.
	errCrash := errors.New("crash")
	if _, err := OpenWith(dir, time.Second, Options{batchRows: 5, afterBatch: func(int, int) error { return errCrash }}); !errors.Is(err, errCrash) {
		t.Fatalf("OpenWith(stopping after a batch) = %v, want the crash", err)
	}
	s, err = OpenWith(dir, time.Second, Options{batchRows: 7})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got := dumpBuckets(t, s)
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("after the migration, row %q = %q (found %v), want %q", k, g, ok, v)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("after the migration, row %q is new", k)
		}
	}
}

// ungroup puts the rows of agents and dialogues back into schema 12's
// buckets and marks the file version: before 3 without a compaction work
// list, before 2 without the indexes of closed dialogues and of messages.
func ungroup(tx *boltdb.Tx, version int) error {
	for _, b := range legacyBuckets {
		if _, err := tx.CreateBucket(b); err != nil {
			return err
		}
	}
	type move struct{ bucket, k, v []byte }
	var moves []move
	for _, b := range [][]byte{bucketAgents, bucketDialogues} {
		err := tx.Bucket(b).ForEach(func(k, v []byte) error {
			owner, kind, rest, record := splitRow(k)
			old := func(bucket []byte, key ...[]byte) {
				moves = append(moves, move{bucket, bytes.Join(key, []byte{0}), bytes.Clone(v)})
			}
			switch {
			case record:
				return nil
			case bytes.Equal(b, bucketAgents) && kind == kindRef:
				old(legacyMailboxRefs, k)
			case bytes.Equal(b, bucketAgents) && kind == kindState:
				old(legacyMailboxes, owner)
			case bytes.Equal(b, bucketAgents) && kind == kindAgentDialogue:
				d := bytes.Clone(rest)
				invert(d)
				old(legacyAgentDialogues, owner, d)
			case kind == kindParticipant:
				old(legacyDialogueParticipants, owner, rest)
			case kind == kindPair:
				old(legacyDialoguePairs, owner, rest)
			case kind == kindMessageIndex:
				if version >= 2 {
					old(legacyDialogueMessageIndex, owner, rest)
				}
			case kind == kindMessage:
				old(legacyDialogueMessages, owner)
			case kind == kindBody:
				old(legacyMessages, owner)
			case kind == kindRefCount:
				old(legacyMessageRefs, owner)
			default:
				return fmt.Errorf("row %q of %s has no schema-12 form", k, b)
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	for _, m := range moves {
		if err := tx.Bucket(m.bucket).Put(m.k, m.v); err != nil {
			return err
		}
	}
	var kept []kv // the dialogues' records: dialogues stays, the rest goes
	err := tx.Bucket(bucketDialogues).ForEach(func(k, v []byte) error {
		if _, _, _, record := splitRow(k); record {
			kept = append(kept, kv{bytes.Clone(k), bytes.Clone(v)})
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, b := range [][]byte{bucketAgents, bucketDialogues} {
		if err := tx.DeleteBucket(b); err != nil {
			return err
		}
	}
	dialogues, err := tx.CreateBucket(bucketDialogues)
	if err != nil {
		return err
	}
	if err := putSorted(dialogues, kept); err != nil {
		return err
	}
	var emptied [][]byte
	if version < 3 {
		emptied = append(emptied, bucketMailboxCompaction)
	}
	if version < 2 {
		emptied = append(emptied, bucketDialoguesClosed, legacyDialogueMessageIndex)
	}
	for _, b := range emptied {
		if err := tx.DeleteBucket(b); err != nil {
			return err
		}
		if _, err := tx.CreateBucket(b); err != nil {
			return err
		}
	}
	return tx.Bucket([]byte("meta")).Put([]byte("schema_version"), []byte(strconv.Itoa(version)))
}

// dumpBuckets returns every row of s but meta's, by bucket + "|" + key.
func dumpBuckets(t *testing.T, s *Store) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := s.db.View(func(tx *boltdb.Tx) error {
		return tx.ForEach(func(name []byte, b *boltdb.Bucket) error {
			if string(name) == "meta" {
				return nil
			}
			return b.ForEach(func(k, v []byte) error {
				out[string(name)+"|"+string(k)] = string(v)
				return nil
			})
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestOwners_controlBytesNameNoRow: a kind byte inside a name would reach
// another owner's rows (a dialogue id + 0x04 is its opener's record's
// key). The network never makes such a name, and the store does not trust
// it to: a read finds nothing, a write is refused, nothing changes.
func TestOwners_controlBytesNameNoRow(t *testing.T) {
	s, err := Open(t.TempDir(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx := t.Context()
	const alice, bob = "clients/c/agents/alice", "clients/c/agents/bob"
	now := time.Unix(1_800_000_000, 0).UTC()
	d := store.Dialogue{ID: "d1", Initiator: alice, Category: "message", CreateTime: now, Opener: "m1"}
	m := store.DialogueMessage{ID: "m1", Sender: alice, Type: "new_message", Time: now}
	send := func(d store.Dialogue, m store.DialogueMessage, to ...string) error {
		w := store.MessageWrite{Message: m, Recipients: to, Mail: mailbox.Message{Sender: m.Sender, Category: mailbox.CategoryMessage, Type: m.Type, Body: []byte(`"hi"`), Time: now}}
		_, err := s.CreateDialogue(ctx, d, w, mailbox.Bound{})
		return err
	}
	if err := send(d, m, bob); err != nil {
		t.Fatal(err)
	}
	before := dumpRows(t, s.db)

	if got, err := s.GetDialogue(ctx, "m1\x04"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetDialogue(m1 + 0x04) = %+v, %v; want not found (it is message m1's record's key)", got, err)
	}
	if got, err := s.GetDialogueMessage(ctx, "d1\x01"+bob); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetDialogueMessage(d1 + 0x01 + bob) = %+v, %v; want not found", got, err)
	}
	if _, err := s.AddMessage(ctx, "m1\x04", mailbox.Bound{}, func(store.DialogueView) (store.MessageWrite, error) {
		return store.MessageWrite{}, errors.New("planned an answer to a message that is not there")
	}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("AddMessage(answering m1 + 0x04) = %v, want not found", err)
	}
	if _, _, err := s.UpdateParticipant(ctx, "d1", bob+"\x00", func(*store.Dialogue, *store.Participant) error { return nil }); err == nil {
		t.Error("UpdateParticipant(bob + 0x00) succeeded")
	}
	if st, err := s.GetMailbox(ctx, bob+"\x01"); err == nil {
		t.Errorf("GetMailbox(bob + 0x01) = %+v, nil; want a refusal", st)
	}
	if _, err := s.ReadMailbox(ctx, bob[:len(bob)-1], 0, 10); err != nil {
		t.Errorf("ReadMailbox of a name that prefixes bob's: %v", err) // a plain name is fine
	}
	if _, err := s.AcknowledgeMailbox(ctx, bob+"\x00", 1); err == nil {
		t.Error("AcknowledgeMailbox(bob + 0x00) succeeded")
	}
	for _, bad := range []struct {
		name string
		d    store.Dialogue
		m    store.DialogueMessage
		to   string
	}{
		{"dialogue id", store.Dialogue{ID: "d2\x01x", Initiator: alice, Category: "message", CreateTime: now}, store.DialogueMessage{ID: "m2", Sender: alice, Type: "new_message", Time: now}, bob},
		{"message id", store.Dialogue{ID: "d3", Initiator: alice, Category: "message", CreateTime: now}, store.DialogueMessage{ID: "m1\x05", Sender: alice, Type: "new_message", Time: now}, bob},
		{"recipient", store.Dialogue{ID: "d4", Initiator: alice, Category: "message", CreateTime: now}, store.DialogueMessage{ID: "m4", Sender: alice, Type: "new_message", Time: now}, bob + "\x01"},
	} {
		if err := send(bad.d, bad.m, bad.to); err == nil || !strings.Contains(err.Error(), "control byte") {
			t.Errorf("CreateDialogue with a control byte in the %s = %v, want a refusal naming it", bad.name, err)
		}
	}
	if _, _, err := s.AppendMessage(ctx, mailbox.Message{ID: "n1", Sender: alice, Category: mailbox.CategoryNotifications, Type: "followed", Time: now}, []string{bob + "\x02"}, mailbox.Bound{}); err == nil {
		t.Error("AppendMessage to bob + 0x02 succeeded")
	}
	if after := dumpRows(t, s.db); !maps.Equal(before, after) {
		t.Errorf("refused calls changed rows: %d before, %d after", len(before), len(after))
	}
}
