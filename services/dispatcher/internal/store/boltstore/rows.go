package boltstore

import (
	"bytes"
	"fmt"
	"slices"

	"github.com/parleyhq/parley/platform/boltdb"
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

// owners reports whether every name can own rows: none holds a byte below
// 0x20, which would be read as a kind. The names the network makes and
// checks never hold one (resource.ValidAgentName, hex ids); a name that
// did would read or write rows of another owner (GetDialogue(id+"\x04")
// would return a message's record), so the store refuses it rather than
// trust every caller.
func owners(names ...string) error {
	for _, n := range names {
		for i := 0; i < len(n); i++ {
			if n[i] < 0x20 {
				return fmt.Errorf("%q cannot name a dialogue, message or agent: it holds the control byte %#x", n, n[i])
			}
		}
	}
	return nil
}

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
func ownRows(b *boltdb.Bucket, owner string) [][]byte {
	var keys [][]byte
	c := b.Cursor()
	for k, _ := c.Seek([]byte(owner)); k != nil && bytes.HasPrefix(k, []byte(owner)) && (len(k) == len(owner) || k[len(owner)] < 0x20); k, _ = c.Next() {
		keys = append(keys, bytes.Clone(k))
	}
	return keys
}

// rowsOf returns copies of the keys of the rows of kind in b under
// owner, in key order.
func rowsOf(b *boltdb.Bucket, owner string, kind byte) [][]byte {
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
func putSorted(b *boltdb.Bucket, rows []kv) error {
	slices.SortFunc(rows, func(x, y kv) int { return bytes.Compare(x.k, y.k) })
	for _, r := range rows {
		if err := b.Put(r.k, r.v); err != nil {
			return err
		}
	}
	return nil
}
