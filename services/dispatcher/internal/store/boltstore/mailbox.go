package boltstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/parleyhq/parley/platform/boltdb"
	"github.com/parleyhq/parley/platform/resource"
	"github.com/parleyhq/parley/services/dispatcher/internal/binrec"
	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
)

// The mailboxes' buckets (see internal/mailbox). A message's body and the
// count of its references are rows of bucketDialogues (schema 13):
// message id + 0x05 → the mailbox.Message, encoded by encodeMessage
// (schema 11; JSON before, still read: decodeMessage), stored once however
// many mailboxes hold it; message id + 0x06 → 8-byte big-endian count of
// the mailbox references to it, the body going when it reaches zero. A
// message in one mailbox has no count: an absent count is one.
var (
	// bucketAgents: an agent's rows (schema 13; see rows.go), its mailbox
	// and its dialogues:
	//   - agent + 0x00 + 8-byte big-endian cursor → ref (8-byte send time
	//     in Unix ns, 8-byte body size, message id), so a mailbox reads in
	//     cursor order with one Seek;
	//   - agent + 0x01 → mailboxState (32 bytes: head, acked, pending,
	//     pending bytes; big-endian uint64 each);
	//   - agent + 0x02 + dialogue id with every byte inverted (^b) →
	//     empty, the participants index by agent (for closing all of an
	//     agent's dialogues); inverted so that the newest dialogue sorts
	//     first, next to the state and the newest reference: a send to an
	//     agent then writes one leaf of it.
	bucketAgents = []byte("agents")
	// bucketMailboxCompaction: 8-byte big-endian send time (Unix ns) of a
	// mailbox's oldest kept reference + agent → empty, for each mailbox
	// whose oldest kept reference is acknowledged (schema 3). It is the
	// compaction's work list, oldest first: a pass reads only the
	// mailboxes that have something due, never every mailbox. An
	// acknowledgement enters the mailbox; compaction moves it to its next
	// oldest reference, or removes it when that one is not acknowledged.
	bucketMailboxCompaction = []byte("mailbox_compaction")
)

var mailboxBuckets = [][]byte{bucketAgents, bucketMailboxCompaction}

func stateKey(agent string) []byte { return rowKey(agent, kindState, "") }

func bodyKey(id string) []byte { return rowKey(id, kindBody, "") }

func refCountKey(id string) []byte { return rowKey(id, kindRefCount, "") }

var _ mailbox.Store = (*Store)(nil)

func getState(b *boltdb.Bucket, agent string) mailbox.State {
	v := b.Get(stateKey(agent))
	if len(v) != 32 {
		return mailbox.State{}
	}
	return mailbox.State{
		Head:         binary.BigEndian.Uint64(v[0:]),
		Acked:        binary.BigEndian.Uint64(v[8:]),
		Pending:      int64(binary.BigEndian.Uint64(v[16:])),
		PendingBytes: int64(binary.BigEndian.Uint64(v[24:])),
	}
}

func putState(b *boltdb.Bucket, agent string, s mailbox.State) error {
	v := make([]byte, 32)
	binary.BigEndian.PutUint64(v[0:], s.Head)
	binary.BigEndian.PutUint64(v[8:], s.Acked)
	binary.BigEndian.PutUint64(v[16:], uint64(s.Pending))
	binary.BigEndian.PutUint64(v[24:], uint64(s.PendingBytes))
	return b.Put(stateKey(agent), v)
}

func refKey(agent string, cursor uint64) []byte {
	return binary.BigEndian.AppendUint64(rowKey(agent, kindRef, ""), cursor)
}

type ref struct {
	sent int64 // Unix ns
	size int64
	id   string
}

func encodeRef(r ref) []byte {
	v := make([]byte, 16, 16+len(r.id))
	binary.BigEndian.PutUint64(v[0:], uint64(r.sent))
	binary.BigEndian.PutUint64(v[8:], uint64(r.size))
	return append(v, r.id...)
}

func decodeRef(v []byte) (ref, error) {
	if len(v) < 16 {
		return ref{}, fmt.Errorf("mailbox reference of %d bytes is corrupt", len(v))
	}
	return ref{sent: int64(binary.BigEndian.Uint64(v[0:])), size: int64(binary.BigEndian.Uint64(v[8:])), id: string(v[16:])}, nil
}

// messageFormat1 starts a stored message in the binary form (schema 11):
// the strings ID, DialogueID, Sender, Category, Type, Protocol,
// RecipientType, InReplyTo and Body, each length-prefixed (encoding.go),
// then Time as a varint of Unix seconds and a uvarint of nanoseconds. A
// JSON value (schema 10 and before) starts with '{'. Encoding/json cost
// about 6 µs per message (the body base64-encoded), a tenth of a deadline
// expiry's CPU.
const messageFormat1 = 1

func encodeMessage(m mailbox.Message) []byte {
	n := 1 + 9*2 + len(m.ID) + len(m.DialogueID) + len(m.Sender) + len(m.Category) + len(m.Type) + len(m.Protocol) +
		len(m.RecipientType) + len(m.InReplyTo) + len(m.Body) + 2*binary.MaxVarintLen64
	v := append(make([]byte, 0, n), messageFormat1)
	for _, s := range []string{m.ID, m.DialogueID, m.Sender, string(m.Category), m.Type, m.Protocol, m.RecipientType, m.InReplyTo} {
		v = binrec.AppendString(v, s)
	}
	v = binrec.AppendBytes(v, m.Body)
	return binrec.AppendTime(v, m.Time)
}

// decodeMessage reads a stored message in either form; nothing it returns
// aliases v.
func decodeMessage(v []byte) (mailbox.Message, error) {
	var m mailbox.Message
	if len(v) > 0 && v[0] == '{' {
		err := json.Unmarshal(v, &m)
		return m, err
	}
	if len(v) == 0 || v[0] != messageFormat1 {
		return m, fmt.Errorf("stored message of %d bytes is corrupt: unknown form", len(v))
	}
	r := binrec.NewReader(v[1:])
	m.ID, m.DialogueID, m.Sender, m.Category = r.String(), r.String(), r.String(), mailbox.Category(r.String())
	m.Type, m.Protocol, m.RecipientType, m.InReplyTo = r.String(), r.String(), r.String(), r.String()
	if b := r.Bytes(); len(b) > 0 {
		m.Body = bytes.Clone(b)
	}
	m.Time = r.Time()
	if err := r.End(); err != nil {
		return mailbox.Message{}, fmt.Errorf("stored message of %d bytes is corrupt: %w", len(v), err)
	}
	return m, nil
}

// AppendMessage implements mailbox.Store.
func (s *Store) AppendMessage(ctx context.Context, m mailbox.Message, recipients []string, bound mailbox.Bound) ([]mailbox.Delivery, []mailbox.Refusal, error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	a := newAppend(m, recipients)
	err := s.db.Update(func(tx *boltdb.Tx) error { return a.run(tx, bound) })
	if err != nil {
		return nil, nil, err
	}
	return a.delivered, a.refused, nil
}

// appendOp is one message appended to several mailboxes inside a write
// transaction: by AppendMessage alone, or with a dialogue record.
type appendOp struct {
	m          mailbox.Message
	body       []byte // m as stored
	recipients []string
	delivered  []mailbox.Delivery
	refused    []mailbox.Refusal
}

func newAppend(m mailbox.Message, recipients []string) *appendOp {
	body := encodeMessage(m)
	// In key order: bbolt splits nodes only at commit, so keys put out of
	// order into a node shift its entries each time, quadratic in a large
	// fan-out; in order they append.
	recipients = slices.Clone(recipients)
	slices.Sort(recipients)
	return &appendOp{m: m, body: body, recipients: recipients}
}

// run appends the message in tx: recipients whose mailbox would exceed
// bound are refused and get nothing; when none accepts, nothing is
// written. The committer may run it more than once: results start afresh.
func (a *appendOp) run(tx *boltdb.Tx, bound mailbox.Bound) error {
	if err := a.stage(tx, bound); err != nil || len(a.delivered) == 0 {
		return err
	}
	return a.putMessage(tx)
}

// stage is run but for the message's own records (putMessage): the
// mailboxes' states and references. A batch of appends stages each and
// then puts the messages in id order (FireTimers): put in a random order,
// each lands mid-node and shifts the node's entries, quadratic in a
// batch. Until its message is put, no other append of the same id may
// run in tx.
func (a *appendOp) stage(tx *boltdb.Tx, bound mailbox.Bound) error {
	a.delivered, a.refused = a.delivered[:0], a.refused[:0]
	if err := owners(a.m.ID); err != nil {
		return err
	}
	if err := owners(a.recipients...); err != nil {
		return err
	}
	if tx.Bucket(bucketDialogues).Get(bodyKey(a.m.ID)) != nil {
		return resource.AlreadyExists("message", a.m.ID)
	}
	size := int64(len(a.m.Body))
	rv := encodeRef(ref{sent: a.m.Time.UnixNano(), size: size, id: a.m.ID})
	agents := tx.Bucket(bucketAgents)
	type grown struct {
		agent string
		st    mailbox.State
	}
	var accepted []grown
	for _, agent := range a.recipients {
		st := getState(agents, agent)
		if (bound.MaxMessages > 0 && st.Pending+1 > bound.MaxMessages) ||
			(bound.MaxBytes > 0 && st.PendingBytes+size > bound.MaxBytes) {
			a.refused = append(a.refused, mailbox.Refusal{Agent: agent, Err: mailbox.ErrFull})
			continue
		}
		st.Head++
		st.Pending++
		st.PendingBytes += size
		accepted = append(accepted, grown{agent, st})
	}
	if len(accepted) == 0 {
		return nil
	}
	// In key order: each agent's new reference, then its state.
	for _, g := range accepted {
		if err := agents.Put(refKey(g.agent, g.st.Head), rv); err != nil {
			return err
		}
		if err := putState(agents, g.agent, g.st); err != nil {
			return err
		}
		a.delivered = append(a.delivered, mailbox.Delivery{Agent: g.agent, Cursor: g.st.Head, Message: a.m})
	}
	return nil
}

// putMessage stores the staged message and the count of its references.
// A count of one is not written (release reads none as one): a direct
// message's commit then writes one row fewer.
func (a *appendOp) putMessage(tx *boltdb.Tx) error {
	msgs := tx.Bucket(bucketDialogues)
	if err := msgs.Put(bodyKey(a.m.ID), a.body); err != nil {
		return err
	}
	if len(a.delivered) > 1 {
		return msgs.Put(refCountKey(a.m.ID), binary.BigEndian.AppendUint64(nil, uint64(len(a.delivered))))
	}
	return nil
}

// ReadMailbox implements mailbox.Store.
func (s *Store) ReadMailbox(ctx context.Context, agent string, after uint64, limit int) ([]mailbox.Delivery, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if after == ^uint64(0) || limit <= 0 {
		return nil, nil
	}
	if err := owners(agent); err != nil {
		return nil, err
	}
	prefix := rowKey(agent, kindRef, "")
	var out []mailbox.Delivery
	err := s.db.View(func(tx *boltdb.Tx) error {
		msgs := tx.Bucket(bucketDialogues)
		c := tx.Bucket(bucketAgents).Cursor()
		for k, v := c.Seek(refKey(agent, after+1)); k != nil && bytes.HasPrefix(k, prefix) && len(out) < limit; k, v = c.Next() {
			if len(k) != len(prefix)+8 {
				continue // another agent whose name extends this one's
			}
			r, err := decodeRef(v)
			if err != nil {
				return err
			}
			body := msgs.Get(bodyKey(r.id))
			if body == nil {
				return fmt.Errorf("mailbox %q cursor %d: message %q is missing", agent, binary.BigEndian.Uint64(k[len(prefix):]), r.id)
			}
			d := mailbox.Delivery{Agent: agent, Cursor: binary.BigEndian.Uint64(k[len(prefix):])}
			if d.Message, err = decodeMessage(body); err != nil {
				return fmt.Errorf("mailbox %q message %q: %w", agent, r.id, err)
			}
			out = append(out, d)
		}
		return nil
	})
	return out, err
}

// AcknowledgeMailbox implements mailbox.Store.
func (s *Store) AcknowledgeMailbox(ctx context.Context, agent string, cursor uint64) (mailbox.State, error) {
	return s.ack(ctx, agent, func(st mailbox.State) (uint64, error) {
		if cursor > st.Head {
			return 0, fmt.Errorf("cursor %d of %q (head %d): %w", cursor, agent, st.Head, mailbox.ErrCursorAhead)
		}
		return cursor, nil
	})
}

// ClearMailbox implements mailbox.Store.
func (s *Store) ClearMailbox(ctx context.Context, agent string) (mailbox.State, error) {
	return s.ack(ctx, agent, func(st mailbox.State) (uint64, error) { return st.Head, nil })
}

// errUnchanged ends a read-modify-write that has nothing to write.
var errUnchanged = errors.New("unchanged")

// ack moves agent's acknowledged cursor to the one target picks, releasing
// the acknowledged messages from the size bound.
func (s *Store) ack(ctx context.Context, agent string, target func(mailbox.State) (uint64, error)) (mailbox.State, error) {
	if err := ctx.Err(); err != nil {
		return mailbox.State{}, err
	}
	if err := owners(agent); err != nil {
		return mailbox.State{}, err
	}
	var out mailbox.State
	err := s.db.Update(func(tx *boltdb.Tx) error {
		agents := tx.Bucket(bucketAgents)
		st := getState(agents, agent)
		out = st
		to, err := target(st)
		if err != nil {
			return err
		}
		if to <= st.Acked {
			return errUnchanged
		}
		c := agents.Cursor()
		prefix := rowKey(agent, kindRef, "")
		end := refKey(agent, to)
		for k, v := c.Seek(refKey(agent, st.Acked+1)); k != nil && bytes.HasPrefix(k, prefix) && bytes.Compare(k, end) <= 0; k, v = c.Next() {
			if len(k) != len(prefix)+8 {
				continue
			}
			r, err := decodeRef(v)
			if err != nil {
				return err
			}
			st.Pending--
			st.PendingBytes -= r.size
		}
		st.Acked = to
		out = st
		if err := queueCompaction(tx, agent, to); err != nil {
			return err
		}
		return putState(agents, agent, st)
	})
	if errors.Is(err, errUnchanged) {
		err = nil
	}
	return out, err
}

// GetMailbox implements mailbox.Store.
func (s *Store) GetMailbox(ctx context.Context, agent string) (mailbox.State, error) {
	if err := ctx.Err(); err != nil {
		return mailbox.State{}, err
	}
	if err := owners(agent); err != nil {
		return mailbox.State{}, err
	}
	var out mailbox.State
	err := s.db.View(func(tx *boltdb.Tx) error {
		out = getState(tx.Bucket(bucketAgents), agent)
		return nil
	})
	return out, err
}

// oldestRef returns agent's oldest kept reference and its cursor; ok is
// false when the mailbox keeps none.
func oldestRef(agents *boltdb.Bucket, agent string) (cursor uint64, r ref, ok bool, err error) {
	prefix := rowKey(agent, kindRef, "")
	c := agents.Cursor()
	for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
		if len(k) != len(prefix)+8 {
			continue // another agent whose name extends this one's
		}
		r, err := decodeRef(v)
		return binary.BigEndian.Uint64(k[len(prefix):]), r, err == nil, err
	}
	return 0, ref{}, false, nil
}

func compactionKey(sent int64, agent string) []byte {
	return append(binary.BigEndian.AppendUint64(nil, uint64(sent)), agent...) //nolint:gosec // times after 1970
}

// queueCompaction enters agent in bucketMailboxCompaction when its oldest
// kept reference is acknowledged (its cursor at or before acked). The key
// depends only on that reference, so entering it again changes nothing.
func queueCompaction(tx *boltdb.Tx, agent string, acked uint64) error {
	cursor, r, ok, err := oldestRef(tx.Bucket(bucketAgents), agent)
	if err != nil || !ok || cursor > acked {
		return err
	}
	queue, key := tx.Bucket(bucketMailboxCompaction), compactionKey(r.sent, agent)
	if queue.Get(key) != nil {
		return nil // entered already: leave its page clean
	}
	return queue.Put(key, nil)
}

// migrateCompactionQueue builds schema 3's bucketMailboxCompaction from
// the mailboxes' states and references (by then in bucketAgents:
// migrateOlder runs after the rows have moved).
func migrateCompactionQueue(tx *boltdb.Tx) error {
	agents := tx.Bucket(bucketAgents)
	var names []string // collected first: queueCompaction walks agents
	err := agents.ForEach(func(k, v []byte) error {
		if agent, kind, rest, record := splitRow(k); !record && kind == kindState && len(rest) == 0 && len(v) == 32 {
			names = append(names, string(agent))
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, agent := range names {
		if err := queueCompaction(tx, agent, getState(agents, agent).Acked); err != nil {
			return err
		}
	}
	return nil
}

// CompactMailboxes implements mailbox.Store. It reads the mailboxes due
// from bucketMailboxCompaction, oldest first, and in each deletes its
// oldest references while they are acknowledged and sent before before;
// then it enters the mailbox again under its next oldest reference, if
// that one is acknowledged. A pass costs what it removes, however many
// mailboxes there are.
func (s *Store) CompactMailboxes(ctx context.Context, before time.Time, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	n := 0
	err := s.db.Update(func(tx *boltdb.Tx) error {
		n = 0
		queue, agents, msgs := tx.Bucket(bucketMailboxCompaction), tx.Bucket(bucketAgents), tx.Bucket(bucketDialogues)
		end := binary.BigEndian.AppendUint64(nil, uint64(before.UnixNano())) //nolint:gosec // times after 1970

		// Collected first, as everything below: never delete while walking
		// a cursor. Each mailbox due has at least one reference to delete.
		var due [][]byte
		qc := queue.Cursor()
		for k, _ := qc.First(); len(k) > 8 && bytes.Compare(k[:8], end) < 0 && len(due) < limit; k, _ = qc.Next() {
			due = append(due, bytes.Clone(k))
		}
		for _, qk := range due {
			if n >= limit {
				break
			}
			agent := string(qk[8:])
			if err := queue.Delete(qk); err != nil {
				return err
			}
			acked := getState(agents, agent).Acked
			type dead struct {
				key []byte
				id  string
			}
			var doomed []dead
			prefix := rowKey(agent, kindRef, "")
			rc := agents.Cursor()
			for k, v := rc.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix) && n+len(doomed) < limit; k, v = rc.Next() {
				if len(k) != len(prefix)+8 {
					continue
				}
				if binary.BigEndian.Uint64(k[len(prefix):]) > acked {
					break
				}
				r, err := decodeRef(v)
				if err != nil {
					return err
				}
				if r.sent >= before.UnixNano() {
					break
				}
				doomed = append(doomed, dead{key: bytes.Clone(k), id: r.id})
			}
			for _, d := range doomed {
				if err := agents.Delete(d.key); err != nil {
					return err
				}
				if err := release(msgs, d.id); err != nil {
					return err
				}
			}
			n += len(doomed)
			if err := queueCompaction(tx, agent, acked); err != nil {
				return err
			}
		}
		return nil
	})
	return n, err
}

// release drops one reference to message id, and the body with the last.
func release(msgs *boltdb.Bucket, id string) error {
	left := uint64(0)
	if v := msgs.Get(refCountKey(id)); len(v) == 8 {
		left = binary.BigEndian.Uint64(v)
	}
	if left <= 1 {
		if err := msgs.Delete(refCountKey(id)); err != nil {
			return err
		}
		return msgs.Delete(bodyKey(id))
	}
	return msgs.Put(refCountKey(id), binary.BigEndian.AppendUint64(nil, left-1))
}
