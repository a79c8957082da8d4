// Package boltstore is the registry's embedded bbolt backend: one file,
// registry.db, in the data directory.
//
// Values are proto.Marshal'ed registryv1 messages. A protocol's content is
// kept apart from its description so that listing never reads documents.
package boltstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"strconv"
	"time"

	"google.golang.org/protobuf/proto"

	registryv1 "github.com/parleyhq/parley/gen/parley/registry/v1"
	"github.com/parleyhq/parley/platform/boltdb"
	"github.com/parleyhq/parley/platform/resource"
	"github.com/parleyhq/parley/services/registry/internal/pd"
	"github.com/parleyhq/parley/services/registry/internal/store"
)

// FileName is the database file inside the data directory.
const FileName = "registry.db"

// Buckets, created by Open (platform/boltdb adds "meta" for schema_version).
var (
	// bucketProtocols maps a raw 20-byte SHA-1 to its Protocol, content
	// cleared. Raw keys sort like lowercase hex, so listings resume by Seek.
	bucketProtocols = []byte("protocols")
	// bucketContent maps a raw SHA-1 to the document's exact bytes.
	bucketContent = []byte("protocol_content")
	// bucketBySHA256 maps a raw 32-byte SHA-256 to the raw SHA-1.
	bucketBySHA256 = []byte("protocols_by_sha256")
	// bucketAgents maps an agent's resource name to its Agent.
	bucketAgents = []byte("agents")
	// bucketRequests maps a request id (AIP-155) to when it was recorded,
	// 8 bytes of big-endian Unix nanoseconds, then the Agent it produced.
	bucketRequests = []byte("agent_requests")
	// bucketClients maps a client's resource name to its Client.
	bucketClients = []byte("clients")
	// bucketKeys maps a key id (16 hex digits) to the 32-byte SHA-256 of
	// its secret followed by its Key, secret cleared.
	bucketKeys = []byte("keys")
	// bucketKeyNames maps a key's resource name to its id, so that an
	// owner's keys are listed by Seek on its name.
	bucketKeyNames = []byte("key_names")
	// bucketFollowing maps follower NUL followed (two agent names) to
	// nothing: whom an agent follows is a Seek on its name.
	bucketFollowing = []byte("following")
	// bucketFollowers holds the same edges reversed, followed NUL
	// follower, written in the same transactions.
	bucketFollowers = []byte("followers")
	// bucketClientGroups maps a member agent's name to nothing; a
	// client's group is the keys under clients/{client}/agents/.
	bucketClientGroups = []byte("client_group_members")
	// bucketGroups maps a group's path (client/name/...) to its Group; a
	// group's descendants are the keys under its path plus "/".
	bucketGroups = []byte("groups")
	// bucketGroupMembers maps path NUL agent to the GroupMember: a
	// group's members are a Seek on its path.
	bucketGroupMembers = []byte("group_members")
	// bucketAgentGroups holds the same memberships as agent NUL path,
	// written in the same transactions: an agent's groups are a Seek.
	bucketAgentGroups = []byte("agent_groups")
	// bucketJoinRequests maps path NUL agent to a pending
	// GroupJoinRequest.
	bucketJoinRequests = []byte("group_join_requests")
	// bucketInvites maps agent NUL path to a pending GroupInvite.
	bucketInvites = []byte("group_invites")
	// bucketOutbox maps an 8-byte big-endian sequence (the bucket's
	// NextSequence) to a Notification, written in the transaction of the
	// change it reports.
	bucketOutbox = []byte("notification_outbox")
	// bucketSweepRequests maps 8 bytes of big-endian Unix nanoseconds
	// (when recorded) followed by a request id to nothing, one per
	// bucketRequests entry (schema version 2), so that SweepRequests walks
	// only what it drops.
	bucketSweepRequests = []byte("agent_requests_sweep")
)

var allBuckets = [][]byte{bucketProtocols, bucketContent, bucketBySHA256, bucketAgents, bucketRequests, bucketClients, bucketKeys, bucketKeyNames, bucketFollowing, bucketFollowers, bucketClientGroups,
	bucketGroups, bucketGroupMembers, bucketAgentGroups, bucketJoinRequests, bucketInvites, bucketOutbox, bucketSweepRequests}

// schemaVersion 2 added the request ids' sweep index (agent_requests_sweep),
// which migrate builds from the records.
const schemaVersion = 2

func migrate(tx *boltdb.Tx, from int) error {
	if from < 2 {
		return migrateRequestSweepIndex(tx)
	}
	return nil
}

// Store is the bbolt-backed store.
type Store struct {
	db        *boltdb.DB
	maxOutbox int // notifications kept; 0 means store.MaxOutbox
}

var _ store.Store = (*Store)(nil)

// Open opens (creating if needed) the database in dir. If another process
// holds the file, it fails after lockTimeout instead of waiting forever.
// Writes are group-committed by platform/boltdb: each returns once on disk.
func Open(dir string, lockTimeout time.Duration) (*Store, error) {
	db, err := boltdb.Open(filepath.Join(dir, FileName), boltdb.Options{
		Buckets:       allBuckets,
		SchemaVersion: schemaVersion,
		Migrate:       migrate,
		LockTimeout:   lockTimeout,
	})
	if err != nil {
		return nil, err
	}
	return &Store{db: db}, nil
}

// Ping reports whether the database is open.
func (s *Store) Ping(ctx context.Context) error { return s.db.Ping(ctx) }

// Close finishes queued writes and closes the database.
func (s *Store) Close() error { return s.db.Close() }

// CreateProtocol implements store.Store.
func (s *Store) CreateProtocol(ctx context.Context, p *registryv1.Protocol) (*registryv1.Protocol, bool, error) {
	if err := ctx.Err(); err != nil {
		return nil, false, err
	}
	key, err := hex.DecodeString(p.GetSha1Hex())
	if err != nil || len(key) != len(pd.Hash{}) {
		return nil, false, fmt.Errorf("protocol sha1_hex %q is not a SHA-1", p.GetSha1Hex())
	}
	sum256, err := hex.DecodeString(p.GetSha256Hex())
	if err != nil || len(sum256) != 32 {
		return nil, false, fmt.Errorf("protocol sha256_hex %q is not a SHA-256", p.GetSha256Hex())
	}
	meta := proto.Clone(p).(*registryv1.Protocol)
	meta.Content = nil
	val, err := proto.Marshal(meta)
	if err != nil {
		return nil, false, err
	}
	var (
		stored  *registryv1.Protocol
		created bool
	)
	// Batch may run the function more than once; it sets both results on
	// every run.
	err = s.db.Update(func(tx *boltdb.Tx) error {
		stored, created = nil, false
		b := tx.Bucket(bucketProtocols)
		if old := b.Get(key); old != nil {
			existing, err := decodeProtocol(old, tx.Bucket(bucketContent).Get(key))
			if err != nil {
				return err
			}
			if existing.GetSha256Hex() != p.GetSha256Hex() {
				return fmt.Errorf("protocol %s (sha256 %s, stored sha256 %s): %w", p.GetSha1Hex(), p.GetSha256Hex(), existing.GetSha256Hex(), store.ErrConflict)
			}
			stored = existing
			return nil
		}
		if err := b.Put(key, val); err != nil {
			return err
		}
		if err := tx.Bucket(bucketContent).Put(key, p.GetContent()); err != nil {
			return err
		}
		if err := tx.Bucket(bucketBySHA256).Put(sum256, key); err != nil {
			return err
		}
		stored, created = proto.Clone(p).(*registryv1.Protocol), true
		return nil
	})
	if err != nil {
		return nil, false, err
	}
	return stored, created, nil
}

func decodeProtocol(val, content []byte) (*registryv1.Protocol, error) {
	p := &registryv1.Protocol{}
	if err := proto.Unmarshal(val, p); err != nil {
		return nil, fmt.Errorf("decode protocol: %w", err)
	}
	if content != nil {
		p.Content = bytes.Clone(content)
	}
	return p, nil
}

// GetProtocol implements store.Store.
func (s *Store) GetProtocol(ctx context.Context, sha1 pd.Hash) (*registryv1.Protocol, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var p *registryv1.Protocol
	err := s.db.View(func(tx *boltdb.Tx) error {
		val := tx.Bucket(bucketProtocols).Get(sha1[:])
		if val == nil {
			return resource.NotFound("protocol", sha1.Hex())
		}
		content := tx.Bucket(bucketContent).Get(sha1[:])
		if content == nil {
			content = []byte{} // empty documents are stored as empty values
		}
		var err error
		p, err = decodeProtocol(val, content)
		return err
	})
	return p, err
}

// ListProtocols implements store.Store.
func (s *Store) ListProtocols(ctx context.Context, opts store.ListOptions) ([]*registryv1.Protocol, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var after []byte
	if opts.After != "" {
		var err error
		if after, err = hex.DecodeString(opts.After); err != nil {
			return nil, fmt.Errorf("list start %q is not a SHA-1 hex", opts.After)
		}
	}
	var out []*registryv1.Protocol
	err := s.db.View(func(tx *boltdb.Tx) error {
		c := tx.Bucket(bucketProtocols).Cursor()
		k, v := c.Seek(after)
		if k != nil && after != nil && bytes.Equal(k, after) {
			k, v = c.Next()
		}
		for ; k != nil && len(out) < opts.Limit; k, v = c.Next() {
			if err := ctx.Err(); err != nil {
				return err
			}
			p, err := decodeProtocol(v, nil)
			if err != nil {
				return err
			}
			if opts.Query != "" && !store.Matches(p, opts.Query) {
				continue
			}
			out = append(out, p)
		}
		return nil
	})
	return out, err
}

// CreateAgent implements store.Store.
func (s *Store) CreateAgent(ctx context.Context, a *registryv1.Agent, key *store.StoredKey, requestID string) (*registryv1.Agent, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	a = proto.Clone(a).(*registryv1.Agent)
	err := s.db.Update(func(tx *boltdb.Tx) error {
		if done, err := recorded(tx, requestID); done != nil || err != nil {
			a = done
			return err
		}
		b := tx.Bucket(bucketAgents)
		if b.Get([]byte(a.GetName())) != nil {
			return resource.AlreadyExists("agent", a.GetName())
		}
		if err := putAgent(b, a); err != nil {
			return err
		}
		if key != nil {
			if err := putKey(tx, *key); err != nil {
				return err
			}
		}
		return record(tx, requestID, a)
	})
	if err != nil {
		return nil, err
	}
	return a, nil
}

// recorded returns the agent recorded for requestID, or nil.
func recorded(tx *boltdb.Tx, requestID string) (*registryv1.Agent, error) {
	if requestID == "" {
		return nil, nil
	}
	val := tx.Bucket(bucketRequests).Get([]byte(requestID))
	if len(val) < 8 {
		return nil, nil
	}
	return decodeAgent(val[8:])
}

// record stores a as requestID's result.
func record(tx *boltdb.Tx, requestID string, a *registryv1.Agent) error {
	if requestID == "" {
		return nil
	}
	val, err := proto.Marshal(a)
	if err != nil {
		return err
	}
	requests, sweep := tx.Bucket(bucketRequests), tx.Bucket(bucketSweepRequests)
	if old := requests.Get([]byte(requestID)); old != nil { // one too short to read: a readable one is returned, not recorded again
		if err := sweep.Delete(requestSweepKey(requestID, old)); err != nil {
			return err
		}
	}
	val = append(binary.BigEndian.AppendUint64(nil, uint64(time.Now().UnixNano())), val...)
	if err := sweep.Put(requestSweepKey(requestID, val), nil); err != nil {
		return err
	}
	return requests.Put([]byte(requestID), val)
}

// requestSweepKey is requestID's key in bucketSweepRequests, given its
// bucketRequests value v; a value too short to hold a time reads as time
// 0, due at once.
func requestSweepKey(requestID string, v []byte) []byte {
	at := make([]byte, 8)
	if len(v) >= 8 {
		copy(at, v[:8])
	}
	return append(at, requestID...)
}

// migrateRequestSweepIndex builds bucketSweepRequests (schema version 2)
// from bucketRequests.
func migrateRequestSweepIndex(tx *boltdb.Tx) error {
	sweep := tx.Bucket(bucketSweepRequests)
	return tx.Bucket(bucketRequests).ForEach(func(k, v []byte) error {
		return sweep.Put(requestSweepKey(string(k), v), nil)
	})
}

// SweepRequests implements store.Store: it walks bucketSweepRequests from
// the oldest and checks each entry against its record's time: a request
// id recorded later stays (its entry put back at that time), and an entry
// naming no record goes; both count, so that sweep.InBatches moves
// past them.
func (s *Store) SweepRequests(ctx context.Context, before time.Time, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	cutoff := before.UnixNano()
	var dropped int
	err := s.db.Update(func(tx *boltdb.Tx) error {
		sweep := tx.Bucket(bucketSweepRequests)
		var old [][]byte // collected first: never delete while walking a cursor
		c := sweep.Cursor()
		for k, _ := c.First(); len(k) > 8 && int64(binary.BigEndian.Uint64(k[:8])) < cutoff && len(old) < limit; k, _ = c.Next() { //nolint:gosec // written from Unix nanoseconds
			old = append(old, bytes.Clone(k))
		}
		requests := tx.Bucket(bucketRequests)
		for _, k := range old {
			if err := sweep.Delete(k); err != nil {
				return err
			}
			v := requests.Get(k[8:])
			if v == nil {
				continue // a stale entry
			}
			own := requestSweepKey(string(k[8:]), v)
			if int64(binary.BigEndian.Uint64(own[:8])) >= cutoff { //nolint:gosec // as above
				if err := sweep.Put(own, nil); err != nil { // recorded later: it stays
					return err
				}
				continue
			}
			if err := sweep.Delete(own); err != nil {
				return err
			}
			if err := requests.Delete(k[8:]); err != nil {
				return err
			}
		}
		dropped = len(old)
		return nil
	})
	return dropped, err
}

func putAgent(b *boltdb.Bucket, a *registryv1.Agent) error {
	seq, err := b.NextSequence()
	if err != nil {
		return err
	}
	a.Etag = strconv.FormatUint(seq, 10)
	val, err := proto.Marshal(a)
	if err != nil {
		return err
	}
	return b.Put([]byte(a.GetName()), val)
}

func decodeAgent(val []byte) (*registryv1.Agent, error) {
	a := &registryv1.Agent{}
	if err := proto.Unmarshal(val, a); err != nil {
		return nil, fmt.Errorf("decode agent: %w", err)
	}
	return a, nil
}

// GetAgent implements store.Store.
func (s *Store) GetAgent(ctx context.Context, name string) (*registryv1.Agent, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var a *registryv1.Agent
	err := s.db.View(func(tx *boltdb.Tx) error {
		val := tx.Bucket(bucketAgents).Get([]byte(name))
		if val == nil {
			return resource.NotFound("agent", name)
		}
		var err error
		a, err = decodeAgent(val)
		return err
	})
	return a, err
}

// ListAgents implements store.Store.
func (s *Store) ListAgents(ctx context.Context, opts store.ListOptions) ([]*registryv1.Agent, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	prefix := []byte("clients/")
	if opts.Client != "" {
		prefix = []byte(store.AgentPrefix(opts.Client))
	}
	start := prefix
	if opts.After != "" {
		start = []byte(opts.After)
	}
	var out []*registryv1.Agent
	err := s.db.View(func(tx *boltdb.Tx) error {
		c := tx.Bucket(bucketAgents).Cursor()
		k, v := c.Seek(start)
		if k != nil && opts.After != "" && string(k) == opts.After {
			k, v = c.Next()
		}
		for ; k != nil && bytes.HasPrefix(k, prefix) && len(out) < opts.Limit; k, v = c.Next() {
			a, err := decodeAgent(v)
			if err != nil {
				return err
			}
			out = append(out, a)
		}
		return nil
	})
	return out, err
}

// DeleteAgent implements store.Store.
func (s *Store) DeleteAgent(ctx context.Context, name string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.Update(func(tx *boltdb.Tx) error {
		b := tx.Bucket(bucketAgents)
		if b.Get([]byte(name)) == nil {
			return resource.NotFound("agent", name)
		}
		if err := deleteKeys(tx, name); err != nil {
			return err
		}
		if err := deleteConnections(tx, name); err != nil {
			return err
		}
		if err := deleteGroupRecords(tx, name); err != nil {
			return err
		}
		return b.Delete([]byte(name))
	})
}

// UpdateAgent implements store.Store.
func (s *Store) UpdateAgent(ctx context.Context, name, requestID string, mutate func(*registryv1.Agent) error) (*registryv1.Agent, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var a *registryv1.Agent
	err := s.db.Update(func(tx *boltdb.Tx) error {
		var err error
		if a, err = recorded(tx, requestID); a != nil || err != nil {
			return err
		}
		b := tx.Bucket(bucketAgents)
		val := b.Get([]byte(name))
		if val == nil {
			return resource.NotFound("agent", name)
		}
		if a, err = decodeAgent(val); err != nil {
			return err
		}
		if err := mutate(a); err != nil {
			return err
		}
		if a.GetName() != name {
			return fmt.Errorf("agent %s: update must not rename it to %q", name, a.GetName())
		}
		if err := putAgent(b, a); err != nil {
			return err
		}
		return record(tx, requestID, a)
	})
	if err != nil {
		return nil, err
	}
	return a, nil
}
