package boltstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"slices"
	"time"

	"github.com/parleyhq/parley/platform/boltdb"
	"github.com/parleyhq/parley/platform/resource"
	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

// The dialogue buckets (store.DialogueStore). Keys join names with 0x00,
// which no id or agent name holds, so a prefix scan finds one owner's rows;
// the buckets that keep several kinds of row per owner mark them with a
// kind byte instead (schema 13, rows.go).
var (
	// bucketDialogues: a dialogue's rows (schema 13):
	//   - dialogue id → JSON store.Dialogue;
	//   - dialogue id + 0x01 + agent → JSON store.Participant;
	//   - dialogue id + 0x02 + agent A + 0x00 + agent B (A < B) → the
	//     pair's protocol state, opaque bytes;
	//   - dialogue id + 0x03 + message id → empty, the dialogue's messages
	//     (schema 2), for removing a dialogue whole. The opener of a
	//     dialogue whose record names it (Opener) is left out: the record
	//     finds it;
	// and a message's rows:
	//   - message id + 0x04 → JSON storedMessage, the dialogue message's
	//     record;
	//   - message id + 0x05 → the mailbox body, and message id + 0x06 →
	//     the count of its mailbox references (see mailbox.go). A message
	//     outside any dialogue's records (a service message) has only
	//     these.
	// The ids dialogue.NewID makes are fixed-length and time-ordered, so a
	// new dialogue's rows and its opener's share the rightmost leaf; other
	// ids (a notification's, a deadline expiry's, an older release's)
	// sort elsewhere, and only lose that.
	bucketDialogues = []byte("dialogues")
	// bucketDialogueReceipts: message id + 0x00 + agent → empty: agent
	// received the message. Only for a message to more than
	// maxInlineReceipts agents (schema 12): the record of one to fewer
	// lists them (storedMessage).
	bucketDialogueReceipts = []byte("dialogue_receipts")
	// bucketDialogueRequests: sender + 0x00 + request id → JSON
	// store.Request.
	bucketDialogueRequests = []byte("dialogue_requests")
	// bucketDialoguesClosed: 8-byte big-endian close time (Unix ns) +
	// dialogue id → empty, the dialogues SweepDialogues removes, oldest
	// first (schema 2). Broadcasts are entered at their creation.
	bucketDialoguesClosed = []byte("dialogues_closed")
	// bucketSweepDialogueRequests: 8-byte big-endian start time (Unix ns)
	// + the bucketDialogueRequests key → empty, one per request (schema
	// 9), so that SweepRequests walks only what it removes.
	bucketSweepDialogueRequests = []byte("dialogue_requests_sweep")
)

var dialogueBuckets = [][]byte{
	bucketDialogues, bucketDialogueReceipts, bucketDialogueRequests,
	bucketDialoguesClosed, bucketSweepDialogueRequests,
}

// closedKey is d's key in bucketDialoguesClosed, and whether d belongs
// there: closed for all, or a broadcast (which nobody can answer).
func closedKey(d store.Dialogue) ([]byte, bool) {
	at := d.CloseTime
	switch {
	case d.Category == string(mailbox.CategorySubscription):
		at = d.CreateTime
	case !d.Closed:
		return nil, false
	case at.IsZero():
		at = d.CreateTime // closed before close times were kept
	}
	return append(binary.BigEndian.AppendUint64(nil, uint64(at.UnixNano())), d.ID...), true //nolint:gosec // times after 1970
}

// indexClosed enters d in bucketDialoguesClosed when it belongs there.
func indexClosed(tx *boltdb.Tx, d store.Dialogue) error {
	if k, ok := closedKey(d); ok {
		return tx.Bucket(bucketDialoguesClosed).Put(k, nil)
	}
	return nil
}

// migrateDialogueIndexes builds schema 2's indexes from schema 1's
// dialogues and messages (in schema 13's rows: migrateOlder runs after the rows have moved).
func migrateDialogueIndexes(tx *boltdb.Tx) error {
	var rows []kv
	dialogues := tx.Bucket(bucketDialogues)
	err := dialogues.ForEach(func(k, v []byte) error {
		id, kind, _, record := splitRow(k)
		if record || kind != kindMessage {
			return nil
		}
		var m store.DialogueMessage
		if err := json.Unmarshal(v, &m); err != nil {
			return err
		}
		rows = append(rows, kv{k: messageIndexKey(m.DialogueID, string(id))})
		return nil
	})
	if err != nil {
		return err
	}
	if err := putSorted(dialogues, rows); err != nil {
		return err
	}
	return dialogues.ForEach(func(k, v []byte) error {
		if _, _, _, record := splitRow(k); !record {
			return nil
		}
		var d store.Dialogue
		if err := json.Unmarshal(v, &d); err != nil {
			return err
		}
		return indexClosed(tx, d)
	})
}

var _ store.DialogueStore = (*Store)(nil)

// maxInlineReceipts is the most receivers a dialogue message's record
// lists itself. A direct message then touches no receipts bucket in its
// commit (three pages fewer to write before the first fdatasync, on a file
// of some thousands of messages); a large fan-out keeps its receipts in
// bucketDialogueReceipts, where each is one key, not a record rewritten.
const maxInlineReceipts = 16

// storedMessage is a dialogue message's record in bucketDialogues.
// GetDialogueMessage decodes it as a store.DialogueMessage, ignoring
// Receivers.
type storedMessage struct {
	store.DialogueMessage
	// Receivers are the agents that received the message, sorted, when
	// they were at most maxInlineReceipts; nil in a record written before
	// schema 12, a broadcast's, or one whose receipts are in the bucket.
	Receivers []string `json:"receivers,omitempty"`
}

func join(parts ...string) []byte {
	n := len(parts)
	for _, p := range parts {
		n += len(p)
	}
	b := make([]byte, 0, n)
	for i, p := range parts {
		if i > 0 {
			b = append(b, 0)
		}
		b = append(b, p...)
	}
	return b
}

// pairKey is dialogue + 0x00 + A + 0x00 + B, the pair's key in
// bucketPairOrders (and in schema 12's dialogue_pairs).
func pairKey(dialogue string, p store.Pair) []byte {
	p = p.Key()
	return join(dialogue, p.A, p.B)
}

// dialoguePairKey is the pair's state row in bucketDialogues.
func dialoguePairKey(dialogue string, p store.Pair) []byte {
	p = p.Key()
	return rowKey(dialogue, kindPair, string(join(p.A, p.B)))
}

func messageKey(id string) []byte { return rowKey(id, kindMessage, "") }

func participantKey(dialogue, agent string) []byte {
	return rowKey(dialogue, kindParticipant, agent)
}

func messageIndexKey(dialogue, message string) []byte {
	return rowKey(dialogue, kindMessageIndex, message)
}

// agentDialogueKey is dialogue's row under agent in bucketAgents: the
// id's bytes inverted, so that an agent's newest dialogue sorts first.
func agentDialogueKey(agent, dialogue string) []byte {
	k := rowKey(agent, kindAgentDialogue, dialogue)
	invert(k[len(agent)+1:])
	return k
}

// invert flips every bit of b: its own inverse.
func invert(b []byte) {
	for i := range b {
		b[i] = ^b[i]
	}
}

func getJSON(b *boltdb.Bucket, key []byte, v any) (bool, error) {
	data := b.Get(key)
	if data == nil {
		return false, nil
	}
	return true, json.Unmarshal(data, v)
}

func putJSON(b *boltdb.Bucket, key []byte, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return b.Put(key, data)
}

// addParticipant makes agent a participant of dialogue unless it is one.
func addParticipant(tx *boltdb.Tx, dialogue, agent string) error {
	b := tx.Bucket(bucketDialogues)
	k := participantKey(dialogue, agent)
	if b.Get(k) != nil {
		return nil
	}
	if err := putJSON(b, k, store.Participant{Agent: agent}); err != nil {
		return err
	}
	return tx.Bucket(bucketAgents).Put(agentDialogueKey(agent, dialogue), nil)
}

// writeMessage appends w.Mail to the recipients' mailboxes, then stores
// w.Message with receipts for those that took it (none for a broadcast),
// the participants and the pair states of the pairs not refused. Nothing
// is written when every mailbox refused. The message is entered in the
// dialogue's message index unless it is opener, the id the dialogue's
// record keeps.
func writeMessage(tx *boltdb.Tx, w store.MessageWrite, bound mailbox.Bound, opener string) (store.Delivered, error) {
	m := w.Message
	w.Mail.ID, w.Mail.DialogueID = m.ID, m.DialogueID
	if err := owners(m.ID, m.DialogueID, m.Sender); err != nil {
		return store.Delivered{}, err
	}
	if tx.Bucket(bucketDialogues).Get(messageKey(m.ID)) != nil {
		return store.Delivered{}, resource.AlreadyExists("message", m.ID)
	}
	a := newAppend(w.Mail, w.Recipients)
	if err := a.run(tx, bound); err != nil {
		return store.Delivered{}, err
	}
	out := store.Delivered{Deliveries: a.delivered, Refused: a.refused}
	if len(a.delivered) == 0 {
		return out, nil
	}
	refused := make(map[string]bool, len(a.refused))
	for _, r := range a.refused {
		refused[r.Agent] = true
	}
	rec := storedMessage{DialogueMessage: m}
	if !w.NoReceipts {
		for _, r := range w.Recipients {
			if !refused[r] {
				rec.Receivers = append(rec.Receivers, r)
			}
		}
		slices.Sort(rec.Receivers)
	}
	inline := len(rec.Receivers) <= maxInlineReceipts
	if !inline {
		rec.Receivers = nil
	}
	if err := putJSON(tx.Bucket(bucketDialogues), messageKey(m.ID), rec); err != nil {
		return store.Delivered{}, err
	}
	if m.ID != opener {
		if err := tx.Bucket(bucketDialogues).Put(messageIndexKey(m.DialogueID, m.ID), nil); err != nil {
			return store.Delivered{}, err
		}
	}
	if !w.NoReceipts {
		if err := addParticipant(tx, m.DialogueID, m.Sender); err != nil {
			return store.Delivered{}, err
		}
		for _, r := range w.Recipients {
			if refused[r] {
				continue
			}
			if !inline {
				if err := tx.Bucket(bucketDialogueReceipts).Put(join(m.ID, r), nil); err != nil {
					return store.Delivered{}, err
				}
			}
			if err := addParticipant(tx, m.DialogueID, r); err != nil {
				return store.Delivered{}, err
			}
		}
	}
	for _, p := range w.Pairs {
		if refused[p.Pair.A] || refused[p.Pair.B] {
			continue
		}
		if err := tx.Bucket(bucketDialogues).Put(dialoguePairKey(m.DialogueID, p.Pair), p.State); err != nil {
			return store.Delivered{}, err
		}
		if err := putTimers(tx, p.Timers); err != nil {
			return store.Delivered{}, err
		}
		if o := p.Order; o != nil {
			if _, err := recordOrder(tx, o.Order, o.Transition, o.Open); err != nil {
				return store.Delivered{}, err
			}
		}
	}
	return out, nil
}

// CreateDialogue implements store.DialogueStore.
func (s *Store) CreateDialogue(ctx context.Context, d store.Dialogue, w store.MessageWrite, bound mailbox.Bound) (store.Delivered, error) {
	if err := ctx.Err(); err != nil {
		return store.Delivered{}, err
	}
	w.Message.DialogueID = d.ID
	var out store.Delivered
	err := s.db.Update(func(tx *boltdb.Tx) error {
		if tx.Bucket(bucketDialogues).Get([]byte(d.ID)) != nil {
			return resource.AlreadyExists("dialogue", d.ID)
		}
		var err error
		if out, err = writeMessage(tx, w, bound, d.Opener); err != nil || len(out.Deliveries) == 0 {
			return err
		}
		if err := indexClosed(tx, d); err != nil {
			return err
		}
		return putJSON(tx.Bucket(bucketDialogues), []byte(d.ID), d)
	})
	if err != nil {
		return store.Delivered{}, err
	}
	return out, nil
}

// view is store.DialogueView over one bbolt transaction.
type view struct {
	tx       *boltdb.Tx
	dialogue store.Dialogue
	answered storedMessage
}

func (v *view) Dialogue() store.Dialogue        { return v.dialogue }
func (v *view) Answered() store.DialogueMessage { return v.answered.DialogueMessage }
func (v *view) PairState(p store.Pair) json.RawMessage {
	return bytes.Clone(v.tx.Bucket(bucketDialogues).Get(dialoguePairKey(v.dialogue.ID, p)))
}

func (v *view) Received(agent string) bool {
	if v.answered.Receivers != nil {
		_, ok := slices.BinarySearch(v.answered.Receivers, agent)
		return ok
	}
	return v.tx.Bucket(bucketDialogueReceipts).Get(join(v.answered.ID, agent)) != nil
}

func (v *view) Receivers() []string {
	if v.answered.Receivers != nil {
		return slices.Clone(v.answered.Receivers)
	}
	prefix := join(v.answered.ID, "")
	var out []string
	c := v.tx.Bucket(bucketDialogueReceipts).Cursor()
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
		out = append(out, string(k[len(prefix):]))
	}
	return out
}

func (v *view) Participant(agent string) (store.Participant, bool) {
	var p store.Participant
	ok, err := getJSON(v.tx.Bucket(bucketDialogues), participantKey(v.dialogue.ID, agent), &p)
	return p, ok && err == nil
}

// AddMessage implements store.DialogueStore.
func (s *Store) AddMessage(ctx context.Context, answered string, bound mailbox.Bound, plan func(store.DialogueView) (store.MessageWrite, error)) (store.Delivered, error) {
	if err := ctx.Err(); err != nil {
		return store.Delivered{}, err
	}
	if owners(answered) != nil {
		return store.Delivered{}, resource.NotFound("message", answered)
	}
	var out store.Delivered
	err := s.db.Update(func(tx *boltdb.Tx) error {
		v := &view{tx: tx}
		if ok, err := getJSON(tx.Bucket(bucketDialogues), messageKey(answered), &v.answered); err != nil {
			return err
		} else if !ok {
			return resource.NotFound("message", answered)
		}
		if ok, err := getJSON(tx.Bucket(bucketDialogues), []byte(v.answered.DialogueID), &v.dialogue); err != nil {
			return err
		} else if !ok {
			return resource.NotFound("dialogue", v.answered.DialogueID)
		}
		w, err := plan(v)
		if err != nil {
			return err
		}
		w.Message.DialogueID = v.dialogue.ID
		w.NoReceipts = false
		out, err = writeMessage(tx, w, bound, "")
		return err
	})
	if err != nil {
		return store.Delivered{}, err
	}
	return out, nil
}

// GetDialogueMessage implements store.DialogueStore.
func (s *Store) GetDialogueMessage(ctx context.Context, id string) (store.DialogueMessage, error) {
	var m store.DialogueMessage
	return m, s.get(ctx, messageKey(id), "message", id, &m)
}

// GetDialogue implements store.DialogueStore.
func (s *Store) GetDialogue(ctx context.Context, id string) (store.Dialogue, error) {
	var d store.Dialogue
	return d, s.get(ctx, []byte(id), "dialogue", id, &d)
}

// get reads the JSON record at key in bucketDialogues into v.
func (s *Store) get(ctx context.Context, key []byte, kind, id string, v any) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if owners(id) != nil {
		return resource.NotFound(kind, id)
	}
	return s.db.View(func(tx *boltdb.Tx) error {
		ok, err := getJSON(tx.Bucket(bucketDialogues), key, v)
		if err == nil && !ok {
			err = resource.NotFound(kind, id)
		}
		return err
	})
}

// putDialogue writes d, read as old before a mutation, moving its entry
// in bucketDialoguesClosed to what d needs now: a dialogue closed again
// later keeps no entry at its first close time, nor a reopened one any.
func putDialogue(tx *boltdb.Tx, old, d store.Dialogue) error {
	was, wasIn := closedKey(old)
	now, in := closedKey(d)
	if wasIn && (!in || !bytes.Equal(was, now)) {
		if err := tx.Bucket(bucketDialoguesClosed).Delete(was); err != nil {
			return err
		}
	}
	if in {
		if err := tx.Bucket(bucketDialoguesClosed).Put(now, nil); err != nil {
			return err
		}
	}
	return putJSON(tx.Bucket(bucketDialogues), []byte(d.ID), d)
}

// SweepDialogues implements store.DialogueStore. It walks
// bucketDialoguesClosed from the earliest and checks each entry against
// its dialogue: a dialogue whose own time (closedKey) is not due stays and
// its entry is repaired (one left by a version that did not move entries
// on update), and an entry naming no dialogue goes. Such entries are
// counted too, so that sweep.InBatches moves past them.
func (s *Store) SweepDialogues(ctx context.Context, before time.Time, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	n := 0
	err := s.db.Update(func(tx *boltdb.Tx) error {
		n = 0
		closed := tx.Bucket(bucketDialoguesClosed)
		cut := before.UnixNano()
		var doomed [][]byte // collected first: never delete while walking a cursor
		c := closed.Cursor()
		for k, _ := c.First(); len(k) > 8 && readInt(k[:8]) < cut && len(doomed) < limit; k, _ = c.Next() {
			doomed = append(doomed, bytes.Clone(k))
		}
		look := func(k []byte) ([]byte, bool, error) {
			var d store.Dialogue
			found, err := getJSON(tx.Bucket(bucketDialogues), k[8:], &d)
			if err != nil {
				return nil, false, err
			}
			own, in := closedKey(d)
			if !found || !in {
				return nil, false, nil // no dialogue, or reopened: out of the sweep
			}
			return own, readInt(own[:8]) < cut, nil
		}
		n = len(doomed)
		return sweepIndexed(closed, doomed, look, func(k []byte) error { return removeDialogue(tx, string(k[8:])) })
	})
	return n, err
}

// removeDialogue deletes a dialogue and all that is kept of it.
func removeDialogue(tx *boltdb.Tx, id string) error {
	dialogues, receipts := tx.Bucket(bucketDialogues), tx.Bucket(bucketDialogueReceipts)
	var d store.Dialogue
	if _, err := getJSON(dialogues, []byte(id), &d); err != nil {
		return err
	}
	rows := ownRows(dialogues, id) // the record, participants, pairs, index
	var messages []string
	if d.Opener != "" {
		// The opener is in the index only when the record does not name
		// it; deleting it twice (an index entry written by an older
		// release) is harmless.
		messages = append(messages, d.Opener)
	}
	for _, k := range rows {
		_, kind, rest, record := splitRow(k)
		switch {
		case record:
		case kind >= kindMessage:
			continue // a message's under the same id (never made so): not the dialogue's
		case kind == kindMessageIndex:
			messages = append(messages, string(rest))
		case kind == kindParticipant:
			if err := tx.Bucket(bucketAgents).Delete(agentDialogueKey(string(rest), id)); err != nil {
				return err
			}
		}
		if err := dialogues.Delete(k); err != nil {
			return err
		}
	}
	for _, msg := range messages {
		rs := rowsOf(receipts, msg, 0)
		for _, r := range rs {
			if err := receipts.Delete(r); err != nil {
				return err
			}
		}
		// The record only: the body is the mailboxes', released by
		// compaction.
		if err := dialogues.Delete(messageKey(msg)); err != nil {
			return err
		}
	}
	prefix := join(id, "")
	for _, b := range [][]byte{bucketOfferTerms, bucketTimerIDs} {
		var keys [][]byte
		c := tx.Bucket(b).Cursor()
		for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
			keys = append(keys, bytes.Clone(k))
		}
		for _, k := range keys {
			if err := tx.Bucket(b).Delete(k); err != nil {
				return err
			}
		}
	}
	return nil
}

// UpdateParticipant implements store.DialogueStore.
func (s *Store) UpdateParticipant(ctx context.Context, dialogue, agent string, mutate func(*store.Dialogue, *store.Participant) error) (store.Dialogue, store.Participant, error) {
	if err := ctx.Err(); err != nil {
		return store.Dialogue{}, store.Participant{}, err
	}
	if owners(dialogue) != nil {
		return store.Dialogue{}, store.Participant{}, resource.NotFound("dialogue", dialogue)
	}
	if err := owners(agent); err != nil {
		return store.Dialogue{}, store.Participant{}, err
	}
	var (
		d store.Dialogue
		p store.Participant
	)
	err := s.db.Update(func(tx *boltdb.Tx) error {
		d, p = store.Dialogue{}, store.Participant{}
		ok, err := getJSON(tx.Bucket(bucketDialogues), []byte(dialogue), &d)
		if err != nil {
			return err
		}
		if ok {
			ok, err = getJSON(tx.Bucket(bucketDialogues), participantKey(dialogue, agent), &p)
		}
		if err != nil {
			return err
		}
		if !ok {
			return resource.NotFound("dialogue", dialogue)
		}
		old := d
		if err := mutate(&d, &p); err != nil {
			return err
		}
		if err := putDialogue(tx, old, d); err != nil {
			return err
		}
		return putJSON(tx.Bucket(bucketDialogues), participantKey(dialogue, agent), p)
	})
	if err != nil {
		return store.Dialogue{}, store.Participant{}, err
	}
	return d, p, nil
}

// UpdateAgentDialogues implements store.DialogueStore.
func (s *Store) UpdateAgentDialogues(ctx context.Context, agent string, mutate func(*store.Dialogue, *store.Participant) (bool, error)) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if err := owners(agent); err != nil {
		return 0, err
	}
	var n int
	err := s.db.Update(func(tx *boltdb.Tx) error {
		n = 0
		var ids []string // newest first
		keys := rowsOf(tx.Bucket(bucketAgents), agent, kindAgentDialogue)
		for _, k := range keys {
			id := k[len(agent)+1:]
			invert(id)
			ids = append(ids, string(id))
		}
		for _, id := range ids {
			var (
				d store.Dialogue
				p store.Participant
			)
			okD, err := getJSON(tx.Bucket(bucketDialogues), []byte(id), &d)
			if err != nil {
				return err
			}
			okP, err := getJSON(tx.Bucket(bucketDialogues), participantKey(id, agent), &p)
			if err != nil {
				return err
			}
			if !okD || !okP || d.Closed || p.Closed {
				continue
			}
			old := d
			changed, err := mutate(&d, &p)
			if err != nil {
				return err
			}
			if !changed {
				continue
			}
			n++
			if err := putDialogue(tx, old, d); err != nil {
				return err
			}
			if err := putJSON(tx.Bucket(bucketDialogues), participantKey(id, agent), p); err != nil {
				return err
			}
		}
		return nil
	})
	return n, err
}

// BeginRequest implements store.DialogueStore.
func (s *Store) BeginRequest(ctx context.Context, sender, id string, now, stale time.Time) (store.Request, bool, error) {
	if err := ctx.Err(); err != nil {
		return store.Request{}, false, err
	}
	var (
		rec   store.Request
		found bool
	)
	err := s.db.Update(func(tx *boltdb.Tx) error {
		rec, found = store.Request{}, false
		b := tx.Bucket(bucketDialogueRequests)
		k := join(sender, id)
		ok, err := getJSON(b, k, &rec)
		if err != nil {
			return err
		}
		if ok && (rec.Done || !rec.Time.Before(stale)) {
			found = true
			return nil
		}
		sweep := tx.Bucket(bucketSweepDialogueRequests)
		if ok { // taken over: it moves to its new time
			if err := sweep.Delete(requestSweepKey(k, rec.Time)); err != nil {
				return err
			}
		}
		rec = store.Request{Sender: sender, ID: id, Time: now}
		if err := sweep.Put(requestSweepKey(k, now), nil); err != nil {
			return err
		}
		return putJSON(b, k, rec)
	})
	if err != nil || !found {
		return store.Request{}, false, err
	}
	return rec, true, nil
}

// FinishRequest implements store.DialogueStore.
func (s *Store) FinishRequest(ctx context.Context, sender, id string, result json.RawMessage) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.Update(func(tx *boltdb.Tx) error {
		b := tx.Bucket(bucketDialogueRequests)
		k := join(sender, id)
		var rec store.Request
		if ok, err := getJSON(b, k, &rec); err != nil || !ok {
			return err
		}
		if result == nil {
			if err := tx.Bucket(bucketSweepDialogueRequests).Delete(requestSweepKey(k, rec.Time)); err != nil {
				return err
			}
			return b.Delete(k)
		}
		rec.Done, rec.Result = true, result
		return putJSON(b, k, rec)
	})
}

// requestSweepKey is the key in bucketSweepDialogueRequests of the
// request keyed k, started at t.
func requestSweepKey(k []byte, t time.Time) []byte {
	return append(putInt(t.UnixNano()), k...)
}

// SweepRequests implements store.DialogueStore: it walks
// bucketSweepDialogueRequests from the oldest and checks each entry
// against its record's start time: a record started later stays (its
// entry put back at that time), an entry naming none goes; both count.
func (s *Store) SweepRequests(ctx context.Context, before time.Time, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	n := 0
	err := s.db.Update(func(tx *boltdb.Tx) error {
		n = 0
		sweep := tx.Bucket(bucketSweepDialogueRequests)
		old := dueKeys(sweep, before, limit)
		requests := tx.Bucket(bucketDialogueRequests)
		look := func(k []byte) ([]byte, bool, error) {
			var rec store.Request
			found, err := getJSON(requests, k[8:], &rec)
			if err != nil || !found {
				return nil, false, err
			}
			return requestSweepKey(k[8:], rec.Time), rec.Time.Before(before), nil
		}
		n = len(old)
		return sweepIndexed(sweep, old, look, func(k []byte) error { return requests.Delete(k[8:]) })
	})
	return n, err
}

// migrateRequestSweepIndex builds bucketSweepDialogueRequests (schema
// version 9) from bucketDialogueRequests.
func migrateRequestSweepIndex(tx *boltdb.Tx) error {
	sweep := tx.Bucket(bucketSweepDialogueRequests)
	return tx.Bucket(bucketDialogueRequests).ForEach(func(k, v []byte) error {
		var rec store.Request
		if err := json.Unmarshal(v, &rec); err != nil {
			return err
		}
		return sweep.Put(requestSweepKey(k, rec.Time), nil)
	})
}
