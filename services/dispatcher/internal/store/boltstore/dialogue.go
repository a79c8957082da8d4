package boltstore

import (
	"bytes"
	"context"
	"encoding/json"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/parleyhq/parley/platform/boltdb"
	"github.com/parleyhq/parley/platform/resource"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

// The dialogue buckets (store.DialogueStore). Keys join names with 0x00,
// which no id or agent name holds, so a prefix scan finds one owner's rows.
var (
	// bucketDialogues: dialogue id → JSON store.Dialogue.
	bucketDialogues = []byte("dialogues")
	// bucketDialogueMessages: message id → JSON store.DialogueMessage.
	bucketDialogueMessages = []byte("dialogue_messages")
	// bucketDialogueReceipts: message id + 0x00 + agent → empty: agent
	// received the message.
	bucketDialogueReceipts = []byte("dialogue_receipts")
	// bucketDialogueParticipants: dialogue id + 0x00 + agent → JSON
	// store.Participant.
	bucketDialogueParticipants = []byte("dialogue_participants")
	// bucketAgentDialogues: agent + 0x00 + dialogue id → empty, the
	// participants index by agent (for closing all of an agent's dialogues).
	bucketAgentDialogues = []byte("agent_dialogues")
	// bucketDialoguePairs: dialogue id + 0x00 + agent A + 0x00 + agent B
	// (A < B) → the pair's protocol state, opaque JSON.
	bucketDialoguePairs = []byte("dialogue_pairs")
	// bucketDialogueRequests: sender + 0x00 + request id → JSON
	// store.Request.
	bucketDialogueRequests = []byte("dialogue_requests")
)

var dialogueBuckets = [][]byte{
	bucketDialogues, bucketDialogueMessages, bucketDialogueReceipts,
	bucketDialogueParticipants, bucketAgentDialogues, bucketDialoguePairs, bucketDialogueRequests,
}

var _ store.DialogueStore = (*Store)(nil)

func join(parts ...string) []byte {
	var b []byte
	for i, p := range parts {
		if i > 0 {
			b = append(b, 0)
		}
		b = append(b, p...)
	}
	return b
}

func pairKey(dialogue string, p store.Pair) []byte {
	p = p.Key()
	return join(dialogue, p.A, p.B)
}

func getJSON(b *bolt.Bucket, key []byte, v any) (bool, error) {
	data := b.Get(key)
	if data == nil {
		return false, nil
	}
	return true, json.Unmarshal(data, v)
}

func putJSON(b *bolt.Bucket, key []byte, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return b.Put(key, data)
}

// addParticipant makes agent a participant of dialogue unless it is one.
func addParticipant(tx *bolt.Tx, dialogue, agent string) error {
	b := tx.Bucket(bucketDialogueParticipants)
	k := join(dialogue, agent)
	if b.Get(k) != nil {
		return nil
	}
	if err := putJSON(b, k, store.Participant{Agent: agent}); err != nil {
		return err
	}
	return tx.Bucket(bucketAgentDialogues).Put(join(agent, dialogue), nil)
}

// writeMessage stores m with receipts for recipients (nil: none, a
// broadcast), the participants and the pair states.
func writeMessage(tx *bolt.Tx, m store.DialogueMessage, recipients []string, pairs []store.PairState) error {
	if err := putJSON(tx.Bucket(bucketDialogueMessages), []byte(m.ID), m); err != nil {
		return err
	}
	if recipients != nil {
		if err := addParticipant(tx, m.DialogueID, m.Sender); err != nil {
			return err
		}
	}
	for _, r := range recipients {
		if err := tx.Bucket(bucketDialogueReceipts).Put(join(m.ID, r), nil); err != nil {
			return err
		}
		if err := addParticipant(tx, m.DialogueID, r); err != nil {
			return err
		}
	}
	for _, p := range pairs {
		if err := tx.Bucket(bucketDialoguePairs).Put(pairKey(m.DialogueID, p.Pair), p.State); err != nil {
			return err
		}
	}
	return nil
}

// CreateDialogue implements store.DialogueStore.
func (s *Store) CreateDialogue(ctx context.Context, d store.Dialogue, m store.DialogueMessage, recipients []string, pairs []store.PairState) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		if tx.Bucket(bucketDialogues).Get([]byte(d.ID)) != nil {
			return resource.AlreadyExists("dialogue", d.ID)
		}
		if tx.Bucket(bucketDialogueMessages).Get([]byte(m.ID)) != nil {
			return resource.AlreadyExists("message", m.ID)
		}
		if err := putJSON(tx.Bucket(bucketDialogues), []byte(d.ID), d); err != nil {
			return err
		}
		return writeMessage(tx, m, recipients, pairs)
	})
}

// view is store.DialogueView over one bbolt transaction.
type view struct {
	tx       *bolt.Tx
	dialogue store.Dialogue
	answered store.DialogueMessage
}

func (v *view) Dialogue() store.Dialogue        { return v.dialogue }
func (v *view) Answered() store.DialogueMessage { return v.answered }
func (v *view) PairState(p store.Pair) json.RawMessage {
	return bytes.Clone(v.tx.Bucket(bucketDialoguePairs).Get(pairKey(v.dialogue.ID, p)))
}

func (v *view) Received(agent string) bool {
	return v.tx.Bucket(bucketDialogueReceipts).Get(join(v.answered.ID, agent)) != nil
}

func (v *view) Receivers() []string {
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
	ok, err := getJSON(v.tx.Bucket(bucketDialogueParticipants), join(v.dialogue.ID, agent), &p)
	return p, ok && err == nil
}

// AddMessage implements store.DialogueStore.
func (s *Store) AddMessage(ctx context.Context, answered string, plan func(store.DialogueView) (store.MessageWrite, error)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		v := &view{tx: tx}
		if ok, err := getJSON(tx.Bucket(bucketDialogueMessages), []byte(answered), &v.answered); err != nil {
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
		if tx.Bucket(bucketDialogueMessages).Get([]byte(w.Message.ID)) != nil {
			return resource.AlreadyExists("message", w.Message.ID)
		}
		w.Message.DialogueID = v.dialogue.ID
		if w.Recipients == nil {
			w.Recipients = []string{}
		}
		return writeMessage(tx, w.Message, w.Recipients, w.Pairs)
	})
}

// RetractMessage implements store.DialogueStore.
func (s *Store) RetractMessage(ctx context.Context, id string, agents []string, pairs []store.PairRestore) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		var m store.DialogueMessage
		if ok, err := getJSON(tx.Bucket(bucketDialogueMessages), []byte(id), &m); err != nil || !ok {
			return err
		}
		receipts := tx.Bucket(bucketDialogueReceipts)
		for _, a := range agents {
			if err := receipts.Delete(join(id, a)); err != nil {
				return err
			}
		}
		pb := tx.Bucket(bucketDialoguePairs)
		for _, p := range pairs {
			k := pairKey(m.DialogueID, p.Pair)
			if !bytes.Equal(pb.Get(k), p.Written) {
				continue
			}
			var err error
			if p.Previous == nil {
				err = pb.Delete(k)
			} else {
				err = pb.Put(k, p.Previous)
			}
			if err != nil {
				return err
			}
		}
		prefix := join(id, "")
		if k, _ := receipts.Cursor().Seek(prefix); k != nil && bytes.HasPrefix(k, prefix) {
			return nil // some recipient still holds it
		}
		if err := tx.Bucket(bucketDialogueMessages).Delete([]byte(id)); err != nil {
			return err
		}
		if m.InReplyTo != "" {
			return nil
		}
		return deleteDialogue(tx, m.DialogueID)
	})
}

// deleteDialogue removes a dialogue whose only message, the opener, went
// to no one: the dialogue, its participants and their index, its pairs.
func deleteDialogue(tx *bolt.Tx, id string) error {
	if err := tx.Bucket(bucketDialogues).Delete([]byte(id)); err != nil {
		return err
	}
	prefix := join(id, "")
	for _, b := range [][]byte{bucketDialogueParticipants, bucketDialoguePairs} {
		var keys [][]byte // collected first: never delete while walking a cursor
		c := tx.Bucket(b).Cursor()
		for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
			keys = append(keys, bytes.Clone(k))
		}
		for _, k := range keys {
			if err := tx.Bucket(b).Delete(k); err != nil {
				return err
			}
			if bytes.Equal(b, bucketDialogueParticipants) {
				if err := tx.Bucket(bucketAgentDialogues).Delete(join(string(k[len(prefix):]), id)); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// GetDialogueMessage implements store.DialogueStore.
func (s *Store) GetDialogueMessage(ctx context.Context, id string) (store.DialogueMessage, error) {
	var m store.DialogueMessage
	return m, s.get(ctx, bucketDialogueMessages, "message", id, &m)
}

// GetDialogue implements store.DialogueStore.
func (s *Store) GetDialogue(ctx context.Context, id string) (store.Dialogue, error) {
	var d store.Dialogue
	return d, s.get(ctx, bucketDialogues, "dialogue", id, &d)
}

func (s *Store) get(ctx context.Context, bucket []byte, kind, id string, v any) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.View(func(tx *bolt.Tx) error {
		ok, err := getJSON(tx.Bucket(bucket), []byte(id), v)
		if err == nil && !ok {
			err = resource.NotFound(kind, id)
		}
		return err
	})
}

// UpdateParticipant implements store.DialogueStore.
func (s *Store) UpdateParticipant(ctx context.Context, dialogue, agent string, mutate func(*store.Dialogue, *store.Participant) error) (store.Dialogue, store.Participant, error) {
	if err := ctx.Err(); err != nil {
		return store.Dialogue{}, store.Participant{}, err
	}
	var (
		d store.Dialogue
		p store.Participant
	)
	err := s.db.Update(func(tx *bolt.Tx) error {
		d, p = store.Dialogue{}, store.Participant{}
		ok, err := getJSON(tx.Bucket(bucketDialogues), []byte(dialogue), &d)
		if err != nil {
			return err
		}
		if ok {
			ok, err = getJSON(tx.Bucket(bucketDialogueParticipants), join(dialogue, agent), &p)
		}
		if err != nil {
			return err
		}
		if !ok {
			return resource.NotFound("dialogue", dialogue)
		}
		if err := mutate(&d, &p); err != nil {
			return err
		}
		if err := putJSON(tx.Bucket(bucketDialogues), []byte(dialogue), d); err != nil {
			return err
		}
		return putJSON(tx.Bucket(bucketDialogueParticipants), join(dialogue, agent), p)
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
	var n int
	err := s.db.Update(func(tx *bolt.Tx) error {
		n = 0
		prefix := join(agent, "")
		var ids []string
		c := tx.Bucket(bucketAgentDialogues).Cursor()
		for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
			ids = append(ids, string(k[len(prefix):]))
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
			okP, err := getJSON(tx.Bucket(bucketDialogueParticipants), join(id, agent), &p)
			if err != nil {
				return err
			}
			if !okD || !okP || d.Closed || p.Closed {
				continue
			}
			changed, err := mutate(&d, &p)
			if err != nil {
				return err
			}
			if !changed {
				continue
			}
			n++
			if err := putJSON(tx.Bucket(bucketDialogues), []byte(id), d); err != nil {
				return err
			}
			if err := putJSON(tx.Bucket(bucketDialogueParticipants), join(id, agent), p); err != nil {
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
	err := s.db.Update(func(tx *bolt.Tx) error {
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
		rec = store.Request{Sender: sender, ID: id, Time: now}
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
	return s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketDialogueRequests)
		k := join(sender, id)
		if result == nil {
			return b.Delete(k)
		}
		var rec store.Request
		if ok, err := getJSON(b, k, &rec); err != nil || !ok {
			return err
		}
		rec.Done, rec.Result = true, result
		return putJSON(b, k, rec)
	})
}

// SweepRequests implements store.DialogueStore.
func (s *Store) SweepRequests(ctx context.Context, before time.Time) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	var n int
	err := s.db.Update(func(tx *bolt.Tx) (err error) {
		n, err = boltdb.DeleteWhere(tx.Bucket(bucketDialogueRequests), func(_, v []byte) (bool, error) {
			var rec store.Request
			if err := json.Unmarshal(v, &rec); err != nil {
				return false, err
			}
			return rec.Time.Before(before), nil
		})
		return err
	})
	return n, err
}
