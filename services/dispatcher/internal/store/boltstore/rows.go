package boltstore

import (
	"bytes"
	"fmt"
	"slices"

	bolt "go.etcd.io/bbolt"
)

// Row kinds (schema 13). The buckets agents and dialogues each keep
// several kinds of row per owner (an agent; a dialogue id or a message
// id): the owner, then a kind byte, then what the row needs. Owners hold
// no byte below 0x20, so the first such byte in a key is its kind, and an
// owner's rows sort together, ahead of any owner whose name extends its
// own; a key with none is a dialogue's own record. The callers keep that
// true, for the names they store and look up alike (GetDialogue of
// "id\x04" would read a message's record): agent names are
// resource.ValidAgentName's, ids hex (dialogue.NewID, deadline.ID, the
// registry's "ntf-" ids), and an id a client names is letters, digits, -
// and _ (the server's validMessageID). One owner's rows written by one
// commit then share a leaf, and dialogue and message ids, made together
// and ordered by time, put a new dialogue's rows next to its opener's: a
// direct send touches two B+trees (and the root), not ten.
const (
	// kindRef, kindState and kindAgentDialogue are bucketAgents' rows.
	kindRef           = 0x00
	kindState         = 0x01
	kindAgentDialogue = 0x02

	// kindParticipant, kindPair and kindMessageIndex are bucketDialogues'
	// rows under a dialogue id, after the dialogue's record.
	kindParticipant  = 0x01
	kindPair         = 0x02
	kindMessageIndex = 0x03

	// kindMessage, kindBody and kindRefCount are bucketDialogues' rows
	// under a message id.
	kindMessage  = 0x04
	kindBody     = 0x05
	kindRefCount = 0x06
)

// rowKey is owner, kind and rest.
func rowKey(owner string, kind byte, rest string) []byte {
	k := make([]byte, 0, len(owner)+1+len(rest))
	return append(append(append(k, owner...), kind), rest...)
}

// splitRow splits a key of a bucket of rows into its owner, its kind and
// the rest; record is true for an owner's own record (no kind byte).
func splitRow(k []byte) (owner []byte, kind byte, rest []byte, record bool) {
	for i, c := range k {
		if c < 0x20 {
			return k[:i], c, k[i+1:], false
		}
	}
	return k, 0, nil, true
}

// ownRows returns copies of the keys in b of owner's record and rows:
// the range from owner up to the first key that is neither.
func ownRows(b *bolt.Bucket, owner string) [][]byte {
	var keys [][]byte
	c := b.Cursor()
	for k, _ := c.Seek([]byte(owner)); k != nil && bytes.HasPrefix(k, []byte(owner)) && (len(k) == len(owner) || k[len(owner)] < 0x20); k, _ = c.Next() {
		keys = append(keys, bytes.Clone(k))
	}
	return keys
}

// rowsOf returns copies of the keys of the rows of kind in b under
// owner, in key order.
func rowsOf(b *bolt.Bucket, owner string, kind byte) [][]byte {
	prefix := rowKey(owner, kind, "")
	var keys [][]byte
	c := b.Cursor()
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
		keys = append(keys, bytes.Clone(k))
	}
	return keys
}

// kv is a row to put.
type kv struct{ k, v []byte }

// putSorted puts rows into b in key order. A write transaction splits
// bbolt's nodes only at its commit, so rows put out of order into one node
// shift its entries each time, quadratic in a large migration; in order,
// each lands after the one before.
func putSorted(b *bolt.Bucket, rows []kv) error {
	slices.SortFunc(rows, func(x, y kv) int { return bytes.Compare(x.k, y.k) })
	for _, r := range rows {
		if err := b.Put(r.k, r.v); err != nil {
			return err
		}
	}
	return nil
}

// Schema 12's buckets, which schema 13 regrouped into rows of
// bucketAgents and bucketDialogues. Only
// migrateRegroup reads them (and deletes them).
var (
	// legacyDialogueMessages: message id → JSON storedMessage.
	legacyDialogueMessages = []byte("dialogue_messages")
	// legacyMessages: message id → mailbox body.
	legacyMessages = []byte("messages")
	// legacyMessageRefs: message id → 8-byte reference count.
	legacyMessageRefs = []byte("message_refs")
	// legacyMailboxes: agent → 32-byte mailbox state.
	legacyMailboxes = []byte("mailboxes")
	// legacyMailboxRefs: agent + 0x00 + 8-byte cursor → ref.
	legacyMailboxRefs = []byte("mailbox_refs")
	// legacyDialogueParticipants: dialogue + 0x00 + agent → participant.
	legacyDialogueParticipants = []byte("dialogue_participants")
	// legacyAgentDialogues: agent + 0x00 + dialogue → empty.
	legacyAgentDialogues = []byte("agent_dialogues")
	// legacyDialoguePairs: dialogue + 0x00 + A + 0x00 + B → pair state.
	legacyDialoguePairs = []byte("dialogue_pairs")
	// legacyDialogueMessageIndex: dialogue + 0x00 + message → empty.
	legacyDialogueMessageIndex = []byte("dialogue_message_index")
)

var legacyBuckets = [][]byte{
	legacyDialogueMessages, legacyMessages, legacyMessageRefs, legacyMailboxes, legacyMailboxRefs,
	legacyDialogueParticipants, legacyAgentDialogues, legacyDialoguePairs, legacyDialogueMessageIndex,
}

// migrateRegroup moves schema 12's rows into schema 13's buckets of rows
// and deletes the old buckets. A bucket the file lacks (an older schema
// that had not made it yet) has nothing to move.
func migrateRegroup(tx *bolt.Tx) error {
	// owned maps a key of an old bucket, owner + 0x00 + rest, to the row of
	// kind under the same owner.
	owned := func(kind byte) func(k []byte) []byte {
		return func(k []byte) []byte {
			owner, rest, _ := bytes.Cut(k, []byte{0})
			return rowKey(string(owner), kind, string(rest))
		}
	}
	moves := []struct {
		from, to []byte
		key      func(k []byte) []byte
	}{
		{legacyMailboxRefs, bucketAgents, bytes.Clone}, // the same key
		{legacyMailboxes, bucketAgents, func(k []byte) []byte { return stateKey(string(k)) }},
		{legacyAgentDialogues, bucketAgents, func(k []byte) []byte {
			agent, dialogue, _ := bytes.Cut(k, []byte{0})
			return agentDialogueKey(string(agent), string(dialogue))
		}},
		{legacyDialogueParticipants, bucketDialogues, owned(kindParticipant)},
		{legacyDialoguePairs, bucketDialogues, owned(kindPair)},
		{legacyDialogueMessageIndex, bucketDialogues, owned(kindMessageIndex)},
		{legacyDialogueMessages, bucketDialogues, func(k []byte) []byte { return messageKey(string(k)) }},
		{legacyMessages, bucketDialogues, func(k []byte) []byte { return bodyKey(string(k)) }},
		{legacyMessageRefs, bucketDialogues, func(k []byte) []byte { return refCountKey(string(k)) }},
	}
	rows := map[string][]kv{} // by the bucket they go to, to be put in key order
	for _, m := range moves {
		from := tx.Bucket(m.from)
		if from == nil {
			continue
		}
		err := from.ForEach(func(k, v []byte) error {
			rows[string(m.to)] = append(rows[string(m.to)], kv{k: m.key(k), v: bytes.Clone(v)})
			return nil
		})
		if err != nil {
			return err
		}
	}
	for _, to := range [][]byte{bucketAgents, bucketDialogues} {
		if err := putSorted(tx.Bucket(to), rows[string(to)]); err != nil {
			return err
		}
	}
	for _, b := range legacyBuckets {
		if tx.Bucket(b) == nil {
			continue
		}
		if err := tx.DeleteBucket(b); err != nil {
			return fmt.Errorf("bucket %s: %w", b, err)
		}
	}
	return nil
}
