// Package boltstore is the dispatcher's embedded bbolt backend: one file,
// dispatcher.db, in the data directory.
package boltstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	dispatcherv1 "github.com/parleyhq/parley/gen/parley/dispatcher/v1"
	"github.com/parleyhq/parley/platform/boltdb"
	"github.com/parleyhq/parley/platform/resource"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

// FileName is the database file inside the data directory.
const FileName = "dispatcher.db"

// Buckets, created by Open (platform/boltdb adds "meta" for schema_version).
var (
	// bucketRoutines: routine name → Routine (current version, with state).
	bucketRoutines = []byte("routines")
	// bucketRoutineVersions: routine name + "@" + 20-digit version → source.
	bucketRoutineVersions = []byte("routine_versions")
	// bucketTools: tool name → Tool.
	bucketTools = []byte("tools")
	// bucketConversations: conversation id → JSON store.Conversation.
	bucketConversations = []byte("conversations")
	// bucketPeerConversations: peer + 0x00 + id → 8-byte big-endian expiry
	// (Unix nanoseconds), to count a peer's open conversations.
	bucketPeerConversations = []byte("peer_conversations")
	// bucketSendCounts: agent + 0x00 + task + 0x00 + target → JSON counts.
	bucketSendCounts = []byte("send_counts")
	// bucketSweepConversations: 8-byte big-endian expiry (Unix
	// nanoseconds) + conversation id → empty, one per conversation
	// (schema version 9), so that SweepConversations walks only what it
	// removes.
	bucketSweepConversations = []byte("conversations_sweep")
)

var allBuckets = append([][]byte{bucketRoutines, bucketRoutineVersions, bucketTools, bucketConversations, bucketPeerConversations, bucketSendCounts, bucketSweepConversations},
	mailboxBuckets...)

// schemaVersion 2 added the dialogue indexes (dialogue_message_index,
// dialogues_closed), and 3 the mailboxes' compaction work list
// (mailbox_compaction), 4 the index of open payments (payments_open),
// 5 the payments' sweep index (payments_sweep), 6 the request ids'
// (payment_requests_sweep), and 7 the notifications waiting for a retry
// (notification_retries, empty when created: until then they waited in
// the registry's outbox); 8 keyed offer_terms by message; 9 added the
// sweep indexes of conversations (conversations_sweep) and of dialogue
// request ids (dialogue_requests_sweep); 10 the spend records' sweep
// index (spend_sweep); 11 stores timers and mailbox messages in binary
// forms (encodeTimer, encodeMessage), and reads the JSON of those written
// before as they are (rewriting 100,000 pending timers would hold up the
// restart that needs them), so its migration writes nothing (protocolcontrol
// began writing pair states in a binary form of its own with it, JSON
// ones read as they are); 12 keeps a
// few receivers in a dialogue message's record instead of
// dialogue_receipts and leaves a dialogue's opener out of
// dialogue_message_index, and writes no message_refs count for a
// message in one mailbox (an absent count is one). Nothing to migrate
// either: older records keep theirs in the buckets, and are read so; the
// number changes so that an older release, which would look only in the
// buckets, refuses the file; 13 regroups the rows of ten B+trees into
// two, each row keyed by its owner and a kind byte (rows.go): an agent's
// mailbox references, mailbox state and dialogues in agents; a dialogue's
// record, participants, pair states and message index, and a message's
// dialogue record, mailbox body and reference count, in dialogues. A
// direct send's commit then writes less than half the pages. Its
// migration (regroup.go) marks the file in the opening transaction, moves
// schema 12's rows in batches of bounded size, each its own transaction,
// before Open returns (resumed by the next Open after a crash), and then
// deletes their buckets and runs the steps of older schemas, which build
// their indexes in schema 13's rows (migrateOlder).
const schemaVersion = 13

// Store is the bbolt-backed store.
type Store struct {
	db *boltdb.DB
}

var _ store.Store = (*Store)(nil)

// Open opens (creating if needed) the database in dir. If another process
// holds the file, it fails after lockTimeout instead of waiting forever.
// Writes are group-committed by platform/boltdb: each returns once on disk.
func Open(dir string, lockTimeout time.Duration) (*Store, error) {
	return OpenWith(dir, lockTimeout, Options{})
}

// Options are OpenWith's optional settings.
type Options struct {
	// Logger gets the progress of an upgrade that moves rows (at Info,
	// every few seconds: see resumeRegroup); nil logs nothing.
	Logger *slog.Logger
	// Journal, when set, makes commits durable through a write-ahead
	// journal next to the file (platform/boltdb, ADR 0008): one short
	// fdatasync per commit instead of two.
	Journal *boltdb.JournalOptions

	// batchRows and batchBytes replace regroupBatchRows and
	// regroupBatchBytes when positive (tests).
	batchRows, batchBytes int
	// afterBatch runs after each batch of the regroup has committed, with
	// its rows and bytes; its error stops the regroup and Open there, as a
	// crash would (tests).
	afterBatch func(rows, size int) error
}

// OpenWith is Open with opts. An upgrade from schema 12 or older moves
// the file's rows in batches before it returns (resumeRegroup), and goes
// on after a crash at the next open.
func OpenWith(dir string, lockTimeout time.Duration, opts Options) (*Store, error) {
	path := filepath.Join(dir, FileName)
	db, err := boltdb.Open(path, boltdb.Options{
		Buckets:       slices.Concat(allBuckets, dialogueBuckets, timerBuckets, orderBuckets, paymentBuckets, [][]byte{bucketNotificationRetries}),
		SchemaVersion: schemaVersion,
		Migrate:       migrate,
		LockTimeout:   lockTimeout,
		Journal:       opts.Journal,
	})
	if err != nil {
		return nil, err
	}
	if err := resumeRegroup(db, opts); err != nil {
		db.Close()
		return nil, fmt.Errorf("migrate %s to schema %d: %w", path, schemaVersion, err)
	}
	return &Store{db: db}, nil
}

// Ping reports whether the database is open.
func (s *Store) Ping(ctx context.Context) error { return s.db.Ping(ctx) }

// Commits reports the write transactions committed so far (each one
// bbolt commit: two fdatasyncs, the data pages and then the meta page, or
// with Options.Journal one, of its record in the journal) and the
// fdatasyncs made.
func (s *Store) Commits() boltdb.CommitStats { return s.db.Commits() }

// Close finishes queued writes and closes the database.
func (s *Store) Close() error { return s.db.Close() }

// SetRoutine implements store.Store.
func (s *Store) SetRoutine(ctx context.Context, name, source string, now time.Time) (*dispatcherv1.Routine, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var out *dispatcherv1.Routine
	err := s.db.Update(func(tx *boltdb.Tx) error {
		b := tx.Bucket(bucketRoutines)
		version := int64(1)
		if v := b.Get([]byte(name)); v != nil {
			var cur dispatcherv1.Routine
			if err := proto.Unmarshal(v, &cur); err != nil {
				return err
			}
			version = cur.GetVersion() + 1
		}
		out = &dispatcherv1.Routine{
			Name:       name,
			Source:     source,
			Version:    version,
			UpdateTime: timestamppb.New(now),
			State:      dispatcherv1.Routine_STATE_ACTIVE,
		}
		data, err := proto.Marshal(out)
		if err != nil {
			return err
		}
		if err := b.Put([]byte(name), data); err != nil {
			return err
		}
		return tx.Bucket(bucketRoutineVersions).Put([]byte(fmt.Sprintf("%s@%020d", name, version)), []byte(source))
	})
	return out, err
}

// GetRoutine implements store.Store.
func (s *Store) GetRoutine(ctx context.Context, name string) (*dispatcherv1.Routine, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var out dispatcherv1.Routine
	err := s.db.View(func(tx *boltdb.Tx) error {
		v := tx.Bucket(bucketRoutines).Get([]byte(name))
		if v == nil {
			return resource.NotFound("routine", name)
		}
		return proto.Unmarshal(v, &out)
	})
	if err != nil {
		return nil, err
	}
	return &out, nil
}

// ListRoutines implements store.Store.
func (s *Store) ListRoutines(ctx context.Context, parent, after string, limit int) ([]*dispatcherv1.Routine, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	prefix := []byte(parent + "/routines/")
	var out []*dispatcherv1.Routine
	err := s.db.View(func(tx *boltdb.Tx) error {
		c := tx.Bucket(bucketRoutines).Cursor()
		k, v := c.Seek(prefix)
		if after != "" {
			k, v = c.Seek([]byte(after))
			if k != nil && string(k) == after {
				k, v = c.Next()
			}
		}
		for ; k != nil && bytes.HasPrefix(k, prefix) && len(out) < limit; k, v = c.Next() {
			var r dispatcherv1.Routine
			if err := proto.Unmarshal(v, &r); err != nil {
				return err
			}
			out = append(out, &r)
		}
		return nil
	})
	return out, err
}

// RecordRoutineRun implements store.Store.
func (s *Store) RecordRoutineRun(ctx context.Context, name string, version int64, runErr string, kind dispatcherv1.RoutineFailureKind, quarantineAfter int) (*dispatcherv1.Routine, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var out dispatcherv1.Routine
	err := s.db.Update(func(tx *boltdb.Tx) error {
		b := tx.Bucket(bucketRoutines)
		v := b.Get([]byte(name))
		if v == nil {
			return resource.NotFound("routine", name)
		}
		out.Reset()
		if err := proto.Unmarshal(v, &out); err != nil {
			return err
		}
		if out.GetVersion() != version {
			return nil
		}
		if runErr == "" {
			if out.GetConsecutiveFailures() == 0 {
				return nil
			}
			out.ConsecutiveFailures = 0
		} else {
			out.ConsecutiveFailures++
			out.LastError = runErr
			out.LastFailureKind = kind
			if quarantineAfter > 0 && int(out.ConsecutiveFailures) >= quarantineAfter {
				out.State = dispatcherv1.Routine_STATE_QUARANTINED
			}
		}
		data, err := proto.Marshal(&out)
		if err != nil {
			return err
		}
		return b.Put([]byte(name), data)
	})
	if err != nil {
		return nil, err
	}
	return &out, nil
}

// SetTool implements store.Store.
func (s *Store) SetTool(ctx context.Context, t *dispatcherv1.Tool, now time.Time) (*dispatcherv1.Tool, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	out := proto.Clone(t).(*dispatcherv1.Tool)
	out.UpdateTime = timestamppb.New(now)
	data, err := proto.Marshal(out)
	if err != nil {
		return nil, err
	}
	err = s.db.Update(func(tx *boltdb.Tx) error {
		return tx.Bucket(bucketTools).Put([]byte(out.GetName()), data)
	})
	return out, err
}

// ListTools implements store.Store.
func (s *Store) ListTools(ctx context.Context, parent string) ([]*dispatcherv1.Tool, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	prefix := []byte(parent + "/tools/")
	var out []*dispatcherv1.Tool
	err := s.db.View(func(tx *boltdb.Tx) error {
		c := tx.Bucket(bucketTools).Cursor()
		for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
			var t dispatcherv1.Tool
			if err := proto.Unmarshal(v, &t); err != nil {
				return err
			}
			out = append(out, &t)
		}
		return nil
	})
	return out, err
}

func peerKey(peer, id string) []byte { return []byte(peer + "\x00" + id) }

func expiryBytes(t time.Time) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(t.UnixNano()))
	return b[:]
}

// CreateConversation implements store.Store.
func (s *Store) CreateConversation(ctx context.Context, c store.Conversation, maxPerPeer int, now time.Time) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	data, err := json.Marshal(c)
	if err != nil {
		return err
	}
	return s.db.Update(func(tx *boltdb.Tx) error {
		convs := tx.Bucket(bucketConversations)
		if convs.Get([]byte(c.ID)) != nil {
			return resource.AlreadyExists("conversation", c.ID)
		}
		idx := tx.Bucket(bucketPeerConversations)
		if maxPerPeer > 0 {
			prefix := []byte(c.Peer + "\x00")
			open := 0
			cur := idx.Cursor()
			for k, v := cur.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = cur.Next() {
				if len(v) == 8 && int64(binary.BigEndian.Uint64(v)) > now.UnixNano() {
					open++
				}
			}
			if open >= maxPerPeer {
				return fmt.Errorf("peer has %d open conversations: %w", open, store.ErrLimit)
			}
		}
		if err := idx.Put(peerKey(c.Peer, c.ID), expiryBytes(c.ExpireTime)); err != nil {
			return err
		}
		if err := tx.Bucket(bucketSweepConversations).Put(conversationSweepKey(c.ID, c.ExpireTime), nil); err != nil {
			return err
		}
		return convs.Put([]byte(c.ID), data)
	})
}

// conversationSweepKey is the key in bucketSweepConversations of
// conversation id expiring at exp.
func conversationSweepKey(id string, exp time.Time) []byte {
	return append(expiryBytes(exp), id...)
}

// GetConversation implements store.Store.
func (s *Store) GetConversation(ctx context.Context, id string) (store.Conversation, error) {
	var c store.Conversation
	if err := ctx.Err(); err != nil {
		return c, err
	}
	err := s.db.View(func(tx *boltdb.Tx) error {
		v := tx.Bucket(bucketConversations).Get([]byte(id))
		if v == nil {
			return resource.NotFound("conversation", id)
		}
		return json.Unmarshal(v, &c)
	})
	return c, err
}

// UpdateConversation implements store.Store.
func (s *Store) UpdateConversation(ctx context.Context, id string, mutate func(*store.Conversation) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.Update(func(tx *boltdb.Tx) error {
		convs := tx.Bucket(bucketConversations)
		v := convs.Get([]byte(id))
		if v == nil {
			return resource.NotFound("conversation", id)
		}
		var c store.Conversation
		if err := json.Unmarshal(v, &c); err != nil {
			return err
		}
		old := c
		if err := mutate(&c); err != nil {
			return err
		}
		data, err := json.Marshal(c)
		if err != nil {
			return err
		}
		peers, sweep := tx.Bucket(bucketPeerConversations), tx.Bucket(bucketSweepConversations)
		if old.Peer != c.Peer {
			if err := peers.Delete(peerKey(old.Peer, id)); err != nil {
				return err
			}
		}
		if err := sweep.Delete(conversationSweepKey(id, old.ExpireTime)); err != nil {
			return err
		}
		if err := peers.Put(peerKey(c.Peer, id), expiryBytes(c.ExpireTime)); err != nil {
			return err
		}
		if err := sweep.Put(conversationSweepKey(id, c.ExpireTime), nil); err != nil {
			return err
		}
		return convs.Put([]byte(id), data)
	})
}

// DeleteConversation implements store.Store.
func (s *Store) DeleteConversation(ctx context.Context, id string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.Update(func(tx *boltdb.Tx) error {
		convs := tx.Bucket(bucketConversations)
		v := convs.Get([]byte(id))
		if v == nil {
			return resource.NotFound("conversation", id)
		}
		var c store.Conversation
		if err := json.Unmarshal(v, &c); err != nil {
			return err
		}
		return deleteConversation(tx, id, c)
	})
}

// deleteConversation removes conversation id, c, and its index entries.
func deleteConversation(tx *boltdb.Tx, id string, c store.Conversation) error {
	if err := tx.Bucket(bucketPeerConversations).Delete(peerKey(c.Peer, id)); err != nil {
		return err
	}
	if err := tx.Bucket(bucketSweepConversations).Delete(conversationSweepKey(id, c.ExpireTime)); err != nil {
		return err
	}
	return tx.Bucket(bucketConversations).Delete([]byte(id))
}

// SweepConversations implements store.Store: it walks
// bucketSweepConversations from the earliest expiry and checks each entry
// against its conversation (see sweepChecked).
func (s *Store) SweepConversations(ctx context.Context, before time.Time, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	n := 0
	err := s.db.Update(func(tx *boltdb.Tx) error {
		n = 0
		sweep := tx.Bucket(bucketSweepConversations)
		dead := dueKeys(sweep, before, limit)
		convs := tx.Bucket(bucketConversations)
		var conv store.Conversation // the one look read, for remove
		look := func(k []byte) ([]byte, bool, error) {
			conv = store.Conversation{}
			found, err := getJSON(convs, k[8:], &conv)
			if err != nil || !found {
				return nil, false, err
			}
			return conversationSweepKey(string(k[8:]), conv.ExpireTime), conv.ExpireTime.Before(before), nil
		}
		n = len(dead)
		return sweepIndexed(sweep, dead, look, func(k []byte) error { return deleteConversation(tx, string(k[8:]), conv) })
	})
	return n, err
}

// migrateConversationSweepIndex builds bucketSweepConversations (schema
// version 9) from bucketConversations.
func migrateConversationSweepIndex(tx *boltdb.Tx) error {
	sweep := tx.Bucket(bucketSweepConversations)
	return tx.Bucket(bucketConversations).ForEach(func(k, v []byte) error {
		var c store.Conversation
		if err := json.Unmarshal(v, &c); err != nil {
			return err
		}
		return sweep.Put(conversationSweepKey(string(k), c.ExpireTime), nil)
	})
}

type sendCount struct {
	Conversations int64 `json:"conversations"`
	WithProtocol  int64 `json:"withProtocol"`
}

// CountSend implements store.Store.
func (s *Store) CountSend(ctx context.Context, agent, task, target string, withProtocol bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	key := []byte(agent + "\x00" + task + "\x00" + target)
	return s.db.Update(func(tx *boltdb.Tx) error {
		b := tx.Bucket(bucketSendCounts)
		var c sendCount
		if v := b.Get(key); v != nil {
			if err := json.Unmarshal(v, &c); err != nil {
				return err
			}
		}
		c.Conversations++
		if withProtocol {
			c.WithProtocol++
		}
		data, err := json.Marshal(c)
		if err != nil {
			return err
		}
		return b.Put(key, data)
	})
}

// ListSendCounts implements store.Store.
func (s *Store) ListSendCounts(ctx context.Context, agent string) ([]store.SendCount, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	prefix := []byte(agent + "\x00")
	var out []store.SendCount
	err := s.db.View(func(tx *boltdb.Tx) error {
		c := tx.Bucket(bucketSendCounts).Cursor()
		for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
			parts := strings.SplitN(string(k[len(prefix):]), "\x00", 2)
			if len(parts) != 2 {
				continue
			}
			var sc sendCount
			if err := json.Unmarshal(v, &sc); err != nil {
				return err
			}
			out = append(out, store.SendCount{Task: parts[0], TargetURL: parts[1], Conversations: sc.Conversations, WithProtocol: sc.WithProtocol})
		}
		return nil
	})
	return out, err
}
