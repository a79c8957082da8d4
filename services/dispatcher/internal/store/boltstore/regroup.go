package boltstore

import (
	"bytes"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/parleyhq/parley/platform/boltdb"
)

// Schema 12's buckets, which schema 13 regrouped into rows of
// bucketAgents and bucketDialogues. Only the regroup reads them (and
// deletes them).
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

// bucketRegroup marks a file whose schema-12 rows are still being moved
// into schema 13's buckets of rows: key keyRegroupFrom → the schema
// version the file had before (decimal), whose older steps are still to
// run. The upgrade's opening transaction makes it (migrate) and the
// transaction that ends the regroup deletes it (finishRegroup); a file
// that holds it is served by no one (Open resumes the regroup before it
// returns). A later schema's step that reads bucketAgents or
// bucketDialogues must run in finishRegroup, after the rows have moved.
var (
	bucketRegroup  = []byte("regroup_pending")
	keyRegroupFrom = []byte("from")
)

// The regroup's batches: each is one write transaction that moves at most
// regroupBatchRows rows, and stops before its keys and values read would
// pass regroupBatchBytes (a row is moved alone if it passes them by
// itself). bbolt keeps every node a transaction changes in memory until
// it commits, so these bound the memory of an upgrade, whatever the file's
// size: the rows read, their leaves in the old bucket (a run from its
// start) and in the new one (rows of one old bucket, in key order, land
// on a run of leaves too, their owner's keys leading both). On a file of
// 100,000 direct sends (701,000 rows) the peak live heap was about 50 MB
// against 450 MB in one transaction, and the migration about 1.3 s
// longer (docs/benchmarks.md).
const (
	regroupBatchRows  = 10_000
	regroupBatchBytes = 16 << 20
	// regroupLogEvery is how often a long regroup logs its progress.
	regroupLogEvery = 5 * time.Second
)

// regroupMoves maps each old bucket's keys to their rows, in the order the
// regroup empties the old buckets.
var regroupMoves = []struct {
	from, to []byte
	key      func(k []byte) []byte
}{
	{legacyMailboxRefs, bucketAgents, bytes.Clone}, // the same key
	{legacyMailboxes, bucketAgents, func(k []byte) []byte { return stateKey(string(k)) }},
	{legacyAgentDialogues, bucketAgents, func(k []byte) []byte {
		agent, dialogue, _ := bytes.Cut(k, []byte{0})
		return agentDialogueKey(string(agent), string(dialogue))
	}},
	{legacyDialogueParticipants, bucketDialogues, ownedRow(kindParticipant)},
	{legacyDialoguePairs, bucketDialogues, ownedRow(kindPair)},
	{legacyDialogueMessageIndex, bucketDialogues, ownedRow(kindMessageIndex)},
	{legacyDialogueMessages, bucketDialogues, func(k []byte) []byte { return messageKey(string(k)) }},
	{legacyMessages, bucketDialogues, func(k []byte) []byte { return bodyKey(string(k)) }},
	{legacyMessageRefs, bucketDialogues, func(k []byte) []byte { return refCountKey(string(k)) }},
}

// ownedRow maps a key of an old bucket, owner + 0x00 + rest, to the row of
// kind under the same owner.
func ownedRow(kind byte) func(k []byte) []byte {
	return func(k []byte) []byte {
		owner, rest, _ := bytes.Cut(k, []byte{0})
		return rowKey(string(owner), kind, string(rest))
	}
}

// migrate is Options.Migrate: inside the opening transaction it only marks
// the file (bucketRegroup), which Open records as schema 13 so that an
// older release refuses it; Open then moves the rows in batches
// (resumeRegroup) before it returns, and the older schemas' steps run at
// the end (finishRegroup). Moving every row in this one transaction would
// hold the whole file's rows and dirty pages in memory until it commits.
func migrate(tx *boltdb.Tx, from int) error {
	if from < 13 {
		b, err := tx.CreateBucket(bucketRegroup)
		if err != nil {
			return fmt.Errorf("bucket %s: %w", bucketRegroup, err)
		}
		return b.Put(keyRegroupFrom, []byte(strconv.Itoa(from)))
	}
	return nil
}

// migrateOlder runs the steps of the schemas before 13 (from < 13) in tx,
// once schema 12's rows have moved: those that read dialogues or
// mailboxes read schema 13's rows. Each walks whole buckets in this one
// transaction, as before; only files of schemas before 10 (development
// files of 2026) need any of them, and the largest, from schema 1 or 2,
// hold an index entry per dialogue message or a work-list entry per
// mailbox.
func migrateOlder(tx *boltdb.Tx, from int) error {
	if from < 2 {
		if err := migrateDialogueIndexes(tx); err != nil {
			return err
		}
	}
	if from < 3 {
		if err := migrateCompactionQueue(tx); err != nil {
			return err
		}
	}
	if from < 5 {
		if err := migratePaymentIndexes(tx); err != nil { // rebuilds both payment indexes
			return err
		}
	}
	if from < 6 {
		if err := migratePaymentRequestIndex(tx); err != nil {
			return err
		}
	}
	if from < 8 {
		if err := migrateOfferTerms(tx); err != nil {
			return err
		}
	}
	if from < 9 {
		if err := migrateConversationSweepIndex(tx); err != nil {
			return err
		}
		if err := migrateRequestSweepIndex(tx); err != nil {
			return err
		}
	}
	if from < 10 {
		return migrateSpendSweepIndex(tx)
	}
	return nil
}

// resumeRegroup moves the rows of a file that migrate marked, a batch per
// write transaction, then ends the regroup (finishRegroup). A crash
// between two batches leaves every row in exactly one place (a batch puts
// and deletes its rows in one transaction) and the mark, so the next Open
// goes on from there. Open calls it before it returns the Store: until it
// has finished no one reads or writes the file (the sweeps, compaction and
// deadlines all go through the Store), so no reader sees a row half moved.
func resumeRegroup(db *boltdb.DB, r Options) error {
	from := -1
	err := db.View(func(tx *boltdb.Tx) error {
		if b := tx.Bucket(bucketRegroup); b != nil {
			n, err := strconv.Atoi(string(b.Get(keyRegroupFrom)))
			if err != nil {
				return fmt.Errorf("bucket %s: schema %q is not a version", bucketRegroup, b.Get(keyRegroupFrom))
			}
			from = n
		}
		return nil
	})
	if err != nil || from < 0 {
		return err
	}
	maxRows, maxBytes := r.batchRows, r.batchBytes
	if maxRows <= 0 {
		maxRows = regroupBatchRows
	}
	if maxBytes <= 0 {
		maxBytes = regroupBatchBytes
	}
	logger := r.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	start := time.Now()
	logger.Info("moving schema 12 rows into schema 13 buckets; the dispatcher serves once they have moved",
		slog.Int("from_schema", from), slog.Int("batch_rows", maxRows), slog.Int("batch_bytes", maxBytes))
	moved, batches, logged := 0, 0, start
	for {
		var rows, size, left int
		err := db.Update(func(tx *boltdb.Tx) error {
			var err error
			rows, size, left, err = regroupBatch(tx, maxRows, maxBytes)
			return err
		})
		if err != nil {
			return fmt.Errorf("regroup after %d rows moved: %w", moved, err)
		}
		moved += rows
		batches++
		if r.afterBatch != nil && rows > 0 {
			if err := r.afterBatch(rows, size); err != nil {
				return err
			}
		}
		if left == 0 {
			break
		}
		if time.Since(logged) >= regroupLogEvery {
			logged = time.Now()
			logger.Info("moving schema 12 rows", slog.Int("rows_moved", moved), slog.Int("buckets_left", left),
				slog.String("elapsed", time.Since(start).Round(time.Millisecond).String()))
		}
	}
	if err := db.Update(func(tx *boltdb.Tx) error { return finishRegroup(tx, from) }); err != nil {
		return fmt.Errorf("end the regroup: %w", err)
	}
	logger.Info("schema 12 rows moved; schema 13 migration done", slog.Int("rows_moved", moved), slog.Int("batches", batches),
		slog.String("elapsed", time.Since(start).Round(time.Millisecond).String()))
	return nil
}

// regroupBatch moves the first rows of the old buckets, in regroupMoves'
// order and each bucket's key order, up to maxRows rows or maxBytes of
// keys and values read, into their rows (put in key order: putSorted), and
// deletes them from the old buckets. left is how many old buckets still
// hold rows.
func regroupBatch(tx *boltdb.Tx, maxRows, maxBytes int) (rows, size, left int, err error) {
	put := map[string][]kv{} // by the bucket they go to
	for _, m := range regroupMoves {
		from := tx.Bucket(m.from)
		if from == nil {
			continue
		}
		var keys [][]byte // deleted after the walk, never during it
		full := false
		c := from.Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			if rows == maxRows || rows > 0 && size+len(k)+len(v) > maxBytes {
				full = true
				break
			}
			keys = append(keys, bytes.Clone(k))
			put[string(m.to)] = append(put[string(m.to)], kv{k: m.key(k), v: bytes.Clone(v)})
			rows++
			size += len(k) + len(v)
		}
		for _, k := range keys {
			if err := from.Delete(k); err != nil {
				return 0, 0, 0, err
			}
		}
		if full {
			break
		}
	}
	for _, to := range [][]byte{bucketAgents, bucketDialogues} {
		if err := putSorted(tx.Bucket(to), put[string(to)]); err != nil {
			return 0, 0, 0, err
		}
	}
	for _, b := range legacyBuckets {
		if old := tx.Bucket(b); old != nil {
			if k, _ := old.Cursor().First(); k != nil {
				left++
			}
		}
	}
	return rows, size, left, nil
}

// finishRegroup ends the regroup of a file that was at schema from: it
// deletes the old buckets, which must be empty, runs the older schemas'
// steps and deletes the mark, in one transaction.
func finishRegroup(tx *boltdb.Tx, from int) error {
	for _, b := range legacyBuckets {
		old := tx.Bucket(b)
		if old == nil {
			continue
		}
		if k, _ := old.Cursor().First(); k != nil {
			return fmt.Errorf("bucket %s still holds rows (%q)", b, k)
		}
		if err := tx.DeleteBucket(b); err != nil {
			return fmt.Errorf("bucket %s: %w", b, err)
		}
	}
	if err := migrateOlder(tx, from); err != nil {
		return err
	}
	return tx.DeleteBucket(bucketRegroup)
}
