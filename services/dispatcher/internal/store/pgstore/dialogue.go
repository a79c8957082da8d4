package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/parleyhq/parley/platform/pgdb"
	"github.com/parleyhq/parley/platform/resource"
	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

// The dialogue store runs each method that decides from a dialogue's state
// at READ COMMITTED (db.Write) holding the dialogue's row lock, taken
// (lockDialogues) before it reads anything else of the dialogue: writers of
// one dialogue queue on it, and each reads, in statements after it got the
// lock, what the previous holder committed. So the checks a reply's plan
// makes against the dialogue hold across replicas as they do on bbolt's
// single writer, without serialization failures. Locks are taken in one
// order, so that none waits for another that waits for it: dialogue rows
// first, by id (a method that needs several locks them all at once), then
// mailbox rows by name (appendTx). A dialogue's own rows (pairs,
// participants, receipts, timers, orders) are written only under its lock,
// or by writers that take no other lock after them (PutTimers,
// RetryTimers), so their order among themselves cannot deadlock.
// CreateDialogue decides from nothing stored: the
// dialogue row it inserts is locked until it commits, and nobody can
// answer it before.

// lockDialogues locks the rows of the dialogues ids that exist, in id
// order, until tx ends. Run it before any other read of those dialogues:
// at READ COMMITTED each later statement then sees what every earlier
// holder committed. (A statement that locks a row of a join re-reads only
// the locked row when it had to wait; the others it read stay as they
// were before the wait. Hence a statement of its own.)
func lockDialogues(ctx context.Context, tx pgx.Tx, ids ...string) error {
	_, err := tx.Exec(ctx, `SELECT FROM dialogues WHERE id = ANY($1) ORDER BY id FOR UPDATE`, ids)
	return err
}

var _ store.DialogueStore = (*Store)(nil)

// getJSON decodes the data column a query returns into v; ok is false when
// it returns no row.
func getJSON(ctx context.Context, q pgdb.Querier, v any, sql string, args ...any) (bool, error) {
	var data []byte
	err := q.QueryRow(ctx, sql, args...).Scan(&data)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return true, json.Unmarshal(data, v)
}

func marshal(v any) []byte {
	data, err := json.Marshal(v)
	if err != nil {
		panic(err) // the store's own structs always marshal
	}
	return data
}

// writeMessage appends w.Mail to the recipients' mailboxes, then stores
// w.Message with receipts for those that took it (none for a broadcast),
// the participants and the pair states of the pairs not refused. When
// every mailbox refused it returns errNothing, which must roll tx back.
func (s *Store) writeMessage(ctx context.Context, tx pgx.Tx, w store.MessageWrite, bound mailbox.Bound, out *store.Delivered) error {
	m := w.Message
	*out = store.Delivered{}
	if taken, err := messageTaken(ctx, tx, m.ID); err != nil || taken {
		if err == nil {
			err = resource.AlreadyExists("message", m.ID)
		}
		return err
	}
	w.Mail.ID, w.Mail.DialogueID = m.ID, m.DialogueID
	a, err := newAppend(w.Mail, w.Recipients)
	if err != nil {
		return err
	}
	err = s.appendTx(ctx, tx, a, bound)
	*out = store.Delivered{Deliveries: a.delivered, Refused: a.refused}
	if err != nil {
		return err
	}
	refused := make(map[string]bool, len(a.refused))
	for _, r := range a.refused {
		refused[r.Agent] = true
	}
	if _, err := tx.Exec(ctx, `INSERT INTO dialogue_messages (id, data) VALUES ($1, $2)`, m.ID, marshal(m)); err != nil {
		return err
	}
	if !w.NoReceipts {
		var recipients []string
		for _, r := range w.Recipients {
			if !refused[r] {
				recipients = append(recipients, r)
			}
		}
		agents := append([]string{m.Sender}, recipients...)
		datas := make([][]byte, len(agents))
		for i, a := range agents {
			datas[i] = marshal(store.Participant{Agent: a})
		}
		if _, err := tx.Exec(ctx, `INSERT INTO dialogue_participants (dialogue, agent, data)
SELECT $1, u.agent, u.data FROM unnest($2::text[], $3::bytea[]) AS u(agent, data) ON CONFLICT DO NOTHING`, m.DialogueID, agents, datas); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO dialogue_receipts (message, agent) SELECT $1, unnest($2::text[]) ON CONFLICT DO NOTHING`, m.ID, recipients); err != nil {
			return err
		}
	}
	for _, p := range w.Pairs {
		if refused[p.Pair.A] || refused[p.Pair.B] {
			continue
		}
		k := p.Pair.Key()
		if _, err := tx.Exec(ctx, `INSERT INTO dialogue_pairs (dialogue, a, b, state) VALUES ($1, $2, $3, $4)
ON CONFLICT (dialogue, a, b) DO UPDATE SET state = excluded.state`, m.DialogueID, k.A, k.B, []byte(p.State)); err != nil {
			return err
		}
		if err := s.putTimers(ctx, tx, p.Timers); err != nil {
			return err
		}
		if o := p.Order; o != nil {
			if _, err := recordOrder(ctx, tx, o.Order, o.Transition, o.Open); err != nil {
				return err
			}
		}
	}
	return nil
}

// messageTaken reports whether a dialogue message id is stored.
func messageTaken(ctx context.Context, tx pgx.Tx, id string) (bool, error) {
	var taken bool
	err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM dialogue_messages WHERE id = $1)`, id).Scan(&taken)
	return taken, err
}

// CreateDialogue implements store.DialogueStore, in one READ COMMITTED
// transaction (db.Write), which two replicas never abort for each other:
// every row it writes belongs to the new dialogue or its new message, and
// unique keys decide between creates of one id (the second waits on the
// first's insert of the dialogue, or of the message's body, and then finds
// it taken: ErrAlreadyExists). The rows it shares, the recipients'
// mailboxes, are locked in name order, as every mailbox append does. A
// serializable writer of those mailboxes (AddMessage, FireTimers) that
// overlaps it fails to serialize and is retried.
func (s *Store) CreateDialogue(ctx context.Context, d store.Dialogue, w store.MessageWrite, bound mailbox.Bound) (store.Delivered, error) {
	if err := ctx.Err(); err != nil {
		return store.Delivered{}, err
	}
	w.Message.DialogueID = d.ID
	var out store.Delivered
	err := s.db.Write(ctx, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `INSERT INTO dialogues (id, data) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING`, d.ID, marshal(d))
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return resource.AlreadyExists("dialogue", d.ID)
		}
		return s.writeMessage(ctx, tx, w, bound, &out)
	})
	return delivered(out, err)
}

// delivered is the result of a dialogue write: errNothing (every mailbox
// refused, all rolled back) is no error.
func delivered(out store.Delivered, err error) (store.Delivered, error) {
	if errors.Is(err, errNothing) {
		return store.Delivered{Refused: out.Refused}, nil
	}
	if err != nil {
		return store.Delivered{}, err
	}
	return out, nil
}

// view is store.DialogueView over one transaction. Its methods cannot
// return errors: the first query that fails is kept in err, and AddMessage
// returns it after plan.
type view struct {
	ctx      context.Context
	tx       pgx.Tx
	dialogue store.Dialogue
	answered store.DialogueMessage
	err      error
}

func (v *view) fail(err error) {
	if v.err == nil {
		v.err = err
	}
}

func (v *view) Dialogue() store.Dialogue        { return v.dialogue }
func (v *view) Answered() store.DialogueMessage { return v.answered }

func (v *view) PairState(p store.Pair) json.RawMessage {
	st, err := pairState(v.ctx, v.tx, v.dialogue.ID, p)
	v.fail(err)
	return st
}

func (v *view) Received(agent string) bool {
	var ok bool
	v.fail(v.tx.QueryRow(v.ctx, `SELECT EXISTS (SELECT 1 FROM dialogue_receipts WHERE message = $1 AND agent = $2)`, v.answered.ID, agent).Scan(&ok))
	return ok
}

func (v *view) Receivers() []string {
	rows, err := v.tx.Query(v.ctx, `SELECT agent FROM dialogue_receipts WHERE message = $1 ORDER BY agent`, v.answered.ID)
	if err != nil {
		v.fail(err)
		return nil
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	v.fail(err)
	return out
}

func (v *view) Participant(agent string) (store.Participant, bool) {
	var p store.Participant
	ok, err := getJSON(v.ctx, v.tx, &p, `SELECT data FROM dialogue_participants WHERE dialogue = $1 AND agent = $2`, v.dialogue.ID, agent)
	v.fail(err)
	return p, ok && err == nil
}

// pairState reads a pair's state; nil when it has none.
func pairState(ctx context.Context, q pgdb.Querier, dialogue string, p store.Pair) (json.RawMessage, error) {
	k := p.Key()
	var st []byte
	err := q.QueryRow(ctx, `SELECT state FROM dialogue_pairs WHERE dialogue = $1 AND a = $2 AND b = $3`, dialogue, k.A, k.B).Scan(&st)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	return st, err
}

// AddMessage implements store.DialogueStore, holding the dialogue's lock
// from its read of the dialogue on (the package comment).
func (s *Store) AddMessage(ctx context.Context, answered string, bound mailbox.Bound, plan func(store.DialogueView) (store.MessageWrite, error)) (store.Delivered, error) {
	if err := ctx.Err(); err != nil {
		return store.Delivered{}, err
	}
	var out store.Delivered
	err := s.db.Write(ctx, func(tx pgx.Tx) error {
		out = store.Delivered{}
		v := &view{ctx: ctx, tx: tx}
		// A message never changes once stored: read before the lock.
		if ok, err := getJSON(ctx, tx, &v.answered, `SELECT data FROM dialogue_messages WHERE id = $1`, answered); err != nil {
			return err
		} else if !ok {
			return resource.NotFound("message", answered)
		}
		if ok, err := getJSON(ctx, tx, &v.dialogue, `SELECT data FROM dialogues WHERE id = $1 FOR UPDATE`, v.answered.DialogueID); err != nil {
			return err
		} else if !ok {
			return resource.NotFound("dialogue", v.answered.DialogueID)
		}
		w, err := plan(v)
		if v.err != nil {
			return v.err // plan decided on a view that failed to read
		}
		if err != nil {
			return err
		}
		w.Message.DialogueID = v.dialogue.ID
		w.NoReceipts = false
		return s.writeMessage(ctx, tx, w, bound, &out)
	})
	return delivered(out, err)
}

// GetDialogueMessage implements store.DialogueStore.
func (s *Store) GetDialogueMessage(ctx context.Context, id string) (store.DialogueMessage, error) {
	var m store.DialogueMessage
	return m, s.getJSON(ctx, &m, "message", `SELECT data FROM dialogue_messages WHERE id = $1`, id)
}

// GetDialogue implements store.DialogueStore.
func (s *Store) GetDialogue(ctx context.Context, id string) (store.Dialogue, error) {
	var d store.Dialogue
	return d, s.getJSON(ctx, &d, "dialogue", `SELECT data FROM dialogues WHERE id = $1`, id)
}

// getJSON reads one JSON row by id into v, or a NotFound error of kind.
func (s *Store) getJSON(ctx context.Context, v any, kind, sql, id string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	ok, err := getJSON(ctx, s.db.Pool(), v, sql, id)
	if err == nil && !ok {
		err = resource.NotFound(kind, id)
	}
	return err
}

// putDialogue writes a dialogue and agent's record in it.
func putDialogue(ctx context.Context, tx pgx.Tx, d store.Dialogue, p store.Participant) error {
	if _, err := tx.Exec(ctx, `UPDATE dialogues SET data = $2 WHERE id = $1`, d.ID, marshal(d)); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `UPDATE dialogue_participants SET data = $3 WHERE dialogue = $1 AND agent = $2`, d.ID, p.Agent, marshal(p))
	return err
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
	err := s.db.Write(ctx, func(tx pgx.Tx) error {
		d, p = store.Dialogue{}, store.Participant{}
		if err := lockDialogues(ctx, tx, dialogue); err != nil {
			return err
		}
		var dd, pd []byte
		err := tx.QueryRow(ctx, `SELECT d.data, p.data FROM dialogues d JOIN dialogue_participants p ON p.dialogue = d.id WHERE d.id = $1 AND p.agent = $2`,
			dialogue, agent).Scan(&dd, &pd)
		if errors.Is(err, pgx.ErrNoRows) {
			return resource.NotFound("dialogue", dialogue)
		}
		if err != nil {
			return err
		}
		if err := errors.Join(json.Unmarshal(dd, &d), json.Unmarshal(pd, &p)); err != nil {
			return err
		}
		if err := mutate(&d, &p); err != nil {
			return err
		}
		d.ID, p.Agent = dialogue, agent
		return putDialogue(ctx, tx, d, p)
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
	err := s.db.Write(ctx, func(tx pgx.Tx) error {
		n = 0
		// Locked first, in id order; a dialogue the agent joins meanwhile
		// is left out, as if joined after.
		rows, err := tx.Query(ctx, `SELECT d.id FROM dialogue_participants p JOIN dialogues d ON d.id = p.dialogue WHERE p.agent = $1 ORDER BY d.id FOR UPDATE OF d`, agent)
		if err != nil {
			return err
		}
		locked, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil || len(locked) == 0 {
			return err
		}
		rows, err = tx.Query(ctx, `SELECT d.data, p.data FROM dialogue_participants p JOIN dialogues d ON d.id = p.dialogue WHERE p.agent = $1 AND d.id = ANY($2) ORDER BY p.dialogue`, agent, locked)
		if err != nil {
			return err
		}
		type rec struct {
			d store.Dialogue
			p store.Participant
		}
		recs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (rec, error) {
			var (
				x      rec
				dd, pd []byte
			)
			if err := r.Scan(&dd, &pd); err != nil {
				return x, err
			}
			return x, errors.Join(json.Unmarshal(dd, &x.d), json.Unmarshal(pd, &x.p))
		})
		if err != nil {
			return err
		}
		for _, x := range recs {
			if x.d.Closed || x.p.Closed {
				continue
			}
			id := x.d.ID
			changed, err := mutate(&x.d, &x.p)
			if err != nil {
				return err
			}
			if !changed {
				continue
			}
			n++
			x.d.ID, x.p.Agent = id, agent
			if err := putDialogue(ctx, tx, x.d, x.p); err != nil {
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
	err := s.db.Update(ctx, func(tx pgx.Tx) error {
		rec, found = store.Request{}, false
		ok, err := getJSON(ctx, tx, &rec, `SELECT data FROM dialogue_requests WHERE sender = $1 AND id = $2`, sender, id)
		if err != nil {
			return err
		}
		if ok && (rec.Done || !rec.Time.Before(stale)) {
			found = true
			return nil
		}
		rec = store.Request{Sender: sender, ID: id, Time: now}
		_, err = tx.Exec(ctx, `INSERT INTO dialogue_requests (sender, id, start_ns, data) VALUES ($1, $2, $3, $4)
ON CONFLICT (sender, id) DO UPDATE SET start_ns = excluded.start_ns, data = excluded.data`, sender, id, now.UnixNano(), marshal(rec))
		return err
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
	return s.db.Update(ctx, func(tx pgx.Tx) error {
		if result == nil {
			_, err := tx.Exec(ctx, `DELETE FROM dialogue_requests WHERE sender = $1 AND id = $2`, sender, id)
			return err
		}
		var rec store.Request
		if ok, err := getJSON(ctx, tx, &rec, `SELECT data FROM dialogue_requests WHERE sender = $1 AND id = $2`, sender, id); err != nil || !ok {
			return err
		}
		rec.Done, rec.Result = true, result
		_, err := tx.Exec(ctx, `UPDATE dialogue_requests SET data = $3 WHERE sender = $1 AND id = $2`, sender, id, marshal(rec))
		return err
	})
}

// SweepRequests implements store.DialogueStore: one DELETE of the oldest
// due rows through the index dialogue_requests_by_start, skipping rows
// another transaction holds.
func (s *Store) SweepRequests(ctx context.Context, before time.Time, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	tag, err := s.db.Pool().Exec(ctx, `DELETE FROM dialogue_requests WHERE (sender, id) IN (
  SELECT sender, id FROM dialogue_requests WHERE start_ns < $1 ORDER BY start_ns LIMIT $2 FOR UPDATE SKIP LOCKED)`, before.UnixNano(), limit)
	if err != nil {
		return 0, err
	}
	return int(tag.RowsAffected()), nil
}

// SweepDialogues implements store.DialogueStore. It reads the dialogues
// to remove by the partial index on dialogues.sweep_at, and their messages
// by the index on dialogue_messages.dialogue (migration 0012; a trigger
// fills both columns from the JSON), so it reads only what it removes,
// limit dialogues per call.
func (s *Store) SweepDialogues(ctx context.Context, before time.Time, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	n := 0
	err := s.db.Write(ctx, func(tx pgx.Tx) error {
		n = 0
		// Locked first; a dialogue another writer holds is left to the
		// next sweep, so the sweep never waits in another lock order.
		rows, err := tx.Query(ctx, `SELECT id FROM dialogues WHERE sweep_at < $1 ORDER BY sweep_at, id LIMIT $2 FOR UPDATE SKIP LOCKED`, before, limit)
		if err != nil {
			return err
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil || len(ids) == 0 {
			return err
		}
		for _, q := range []string{
			`DELETE FROM dialogue_receipts WHERE message IN (SELECT id FROM dialogue_messages WHERE dialogue = ANY($1))`,
			`DELETE FROM dialogue_messages WHERE dialogue = ANY($1)`,
			`DELETE FROM dialogue_participants WHERE dialogue = ANY($1)`,
			`DELETE FROM dialogue_pairs WHERE dialogue = ANY($1)`,
			`DELETE FROM offer_terms WHERE dialogue = ANY($1)`,
			`DELETE FROM dialogues WHERE id = ANY($1)`,
		} {
			if _, err := tx.Exec(ctx, q, ids); err != nil {
				return err
			}
		}
		n = len(ids)
		return nil
	})
	return n, err
}
