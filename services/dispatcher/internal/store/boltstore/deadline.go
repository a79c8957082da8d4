package boltstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/parleyhq/parley/platform/boltdb"
	"github.com/parleyhq/parley/platform/resource"
	"github.com/parleyhq/parley/services/dispatcher/internal/binrec"
	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
)

// The timer buckets (store.TimerStore).
var (
	// bucketTimers: 8-byte big-endian due time (Unix ns: Timer.Due, At
	// until a failure puts it off) + dialogue + 0x00 + counterpart + 0x00 +
	// name → the store.Timer, encoded by encodeTimer (schema 11; JSON
	// before, still read: decodeTimer). Keys sort by time, so the due
	// timers are a prefix walk from the start.
	bucketTimers = []byte("timers")
	// bucketTimerIDs: dialogue + 0x00 + counterpart + 0x00 + name → the
	// timer's key in bucketTimers, to replace a timer set again. Firing a
	// timer leaves its entry (deleting it would rewrite a random page of
	// this index per expiry); the key then finds nothing, and the entry
	// goes with its dialogue (SweepDialogues).
	bucketTimerIDs = []byte("timer_ids")
)

var timerBuckets = [][]byte{bucketTimers, bucketTimerIDs}

var _ store.TimerStore = (*Store)(nil)

func timerID(t store.Timer) []byte { return join(t.Dialogue, t.Counterpart, t.Name) }

func timerKey(t store.Timer) []byte {
	k := make([]byte, 0, 8+len(t.Dialogue)+len(t.Counterpart)+len(t.Name)+2)
	k = binary.BigEndian.AppendUint64(k, uint64(t.Due().UnixNano())) //nolint:gosec // times after 1970 only
	return append(append(append(append(append(k, t.Dialogue...), 0), t.Counterpart...), 0), t.Name...)
}

// timerFormat1 starts a timer's value in the binary form (schema 11): the
// byte after it the strings Dialogue, Initiator, Counterpart, Protocol and
// Name, each a uvarint length and its bytes; then At and Retry in Unix ns,
// 8 bytes big-endian each (0 for a zero Retry), and Failures, a uvarint.
// A JSON value (schema 10 and before) starts with '{'. Listing a batch of
// 2048 due timers decoded them with encoding/json in about 6 µs each.
const timerFormat1 = 1

func encodeTimer(t store.Timer) []byte {
	v := make([]byte, 0, 1+5+len(t.Dialogue)+len(t.Initiator)+len(t.Counterpart)+len(t.Protocol)+len(t.Name)+16+1)
	v = append(v, timerFormat1)
	for _, s := range []string{t.Dialogue, t.Initiator, t.Counterpart, t.Protocol, t.Name} {
		v = binrec.AppendString(v, s)
	}
	var retry int64
	if !t.Retry.IsZero() {
		retry = t.Retry.UnixNano()
	}
	v = binary.BigEndian.AppendUint64(v, uint64(t.At.UnixNano())) //nolint:gosec // times after 1970 only
	v = binary.BigEndian.AppendUint64(v, uint64(retry))           //nolint:gosec // times after 1970 only
	return binary.AppendUvarint(v, uint64(t.Failures))            //nolint:gosec // never negative
}

// decodeTimer reads a timer's value in either form.
func decodeTimer(v []byte) (store.Timer, error) {
	var t store.Timer
	if len(v) > 0 && v[0] == '{' {
		err := json.Unmarshal(v, &t)
		return t, err
	}
	if len(v) == 0 || v[0] != timerFormat1 {
		return t, fmt.Errorf("timer value of %d bytes is corrupt: unknown form", len(v))
	}
	r := binrec.NewReader(v[1:])
	t.Dialogue, t.Initiator, t.Counterpart, t.Protocol, t.Name = r.String(), r.String(), r.String(), r.String(), r.String()
	at, retry := int64(r.Uint64()), int64(r.Uint64()) //nolint:gosec // written from an int64
	t.Failures = int(r.Uvarint())                     //nolint:gosec // written from an int
	if err := r.End(); err != nil {
		return store.Timer{}, fmt.Errorf("timer value of %d bytes is corrupt: %w", len(v), err)
	}
	t.At = time.Unix(0, at).UTC()
	if retry != 0 {
		t.Retry = time.Unix(0, retry).UTC()
	}
	return t, nil
}

// PutTimers implements store.TimerStore.
func (s *Store) PutTimers(ctx context.Context, timers []store.Timer) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.Update(func(tx *boltdb.Tx) error { return putTimers(tx, timers) })
}

// putTimers stores timers in tx, each replacing the timer of its name.
func putTimers(tx *boltdb.Tx, timers []store.Timer) error {
	tb, ids := tx.Bucket(bucketTimers), tx.Bucket(bucketTimerIDs)
	for _, t := range timers {
		if old := ids.Get(timerID(t)); old != nil {
			if err := tb.Delete(bytes.Clone(old)); err != nil {
				return err
			}
		}
		k := timerKey(t)
		if err := tb.Put(k, encodeTimer(t)); err != nil {
			return err
		}
		if err := ids.Put(timerID(t), k); err != nil {
			return err
		}
	}
	return nil
}

// DueTimers implements store.TimerStore.
func (s *Store) DueTimers(ctx context.Context, now time.Time, limit int) ([]store.Timer, error) {
	return s.dueTimers(ctx, now, nil, limit)
}

// DueTimersAfter implements store.TimerStore.
func (s *Store) DueTimersAfter(ctx context.Context, now time.Time, after store.Timer, limit int) ([]store.Timer, error) {
	return s.dueTimers(ctx, now, timerKey(after), limit)
}

// dueTimers lists up to limit timers due at now, in key order, after the
// key after (from the first when nil).
func (s *Store) dueTimers(ctx context.Context, now time.Time, after []byte, limit int) ([]store.Timer, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	out := make([]store.Timer, 0, min(limit, 4096))
	err := s.db.View(func(tx *boltdb.Tx) error {
		c := tx.Bucket(bucketTimers).Cursor()
		k, v := c.First()
		if after != nil {
			if k, v = c.Seek(after); bytes.Equal(k, after) {
				k, v = c.Next()
			}
		}
		for ; k != nil && len(out) < limit; k, v = c.Next() {
			if int64(binary.BigEndian.Uint64(k)) > now.UnixNano() { //nolint:gosec // written from an int64
				break
			}
			t, err := decodeTimer(v)
			if err != nil {
				return err
			}
			out = append(out, t)
		}
		return nil
	})
	return out, err
}

// RetryTimers implements store.TimerStore: each timer moves to the key
// of its new due time.
func (s *Store) RetryTimers(ctx context.Context, retries []store.TimerRetry) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.Update(func(tx *boltdb.Tx) error {
		tb, ids := tx.Bucket(bucketTimers), tx.Bucket(bucketTimerIDs)
		for _, r := range retries {
			k := timerKey(r.Timer)
			if tb.Get(k) == nil {
				continue
			}
			t := r.Timer
			t.Failures++
			t.Retry = r.Retry
			if err := tb.Delete(k); err != nil {
				return err
			}
			nk := timerKey(t)
			if err := tb.Put(nk, encodeTimer(t)); err != nil {
				return err
			}
			if err := ids.Put(timerID(t), nk); err != nil {
				return err
			}
		}
		return nil
	})
}

// NextTimer implements store.TimerStore.
func (s *Store) NextTimer(ctx context.Context) (store.Timer, bool, error) {
	if err := ctx.Err(); err != nil {
		return store.Timer{}, false, err
	}
	var (
		t  store.Timer
		ok bool
	)
	err := s.db.View(func(tx *boltdb.Tx) error {
		_, v := tx.Bucket(bucketTimers).Cursor().First()
		if v == nil {
			return nil
		}
		ok = true
		var err error
		t, err = decodeTimer(v)
		return err
	})
	return t, ok, err
}

// PairState implements store.TimerStore.
func (s *Store) PairState(ctx context.Context, dialogue string, p store.Pair) (json.RawMessage, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var out json.RawMessage
	err := s.db.View(func(tx *boltdb.Tx) error {
		out = bytes.Clone(tx.Bucket(bucketDialogues).Get(dialoguePairKey(dialogue, p)))
		return nil
	})
	return out, err
}

// FireTimers implements store.TimerStore: the whole batch is one
// transaction, so one commit (one fsync) makes every expiry of it durable
// with its messages.
func (s *Store) FireTimers(ctx context.Context, timers []store.Timer, bound mailbox.Bound, expire func(store.Timer, json.RawMessage) (store.TimerFiring, error)) ([]store.FiredTimer, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var (
		fired = make([]store.FiredTimer, 0, len(timers))
		errs  []error
	)
	err := s.db.Update(func(tx *boltdb.Tx) error {
		fired, errs = fired[:0], errs[:0] // the committer may run this again
		tb, dialogues := tx.Bucket(bucketTimers), tx.Bucket(bucketDialogues)
		// The messages are put last, in id order (appendOp.stage); staged
		// names the ids staged, which are not stored yet.
		var (
			staged   = make([]*appendOp, 0, len(timers))
			stagedID = make(map[string]bool, len(timers))
		)
		for _, t := range timers {
			k := timerKey(t)
			if tb.Get(k) == nil {
				continue
			}
			pk := dialoguePairKey(t.Dialogue, store.Pair{A: t.Initiator, B: t.Counterpart})
			prev := bytes.Clone(dialogues.Get(pk))
			f, err := expire(t, prev)
			if err != nil {
				errs = append(errs, fmt.Errorf("deadline %s of dialogue %s, %s: %w", t.Name, t.Dialogue, t.Counterpart, err))
				continue
			}
			out := store.FiredTimer{Timer: t, Prev: prev, Next: f.State}
			if f.Mail.ID != "" {
				a := newAppend(f.Mail, f.Recipients)
				var err error
				if stagedID[f.Mail.ID] {
					err = resource.AlreadyExists("message", f.Mail.ID)
				} else {
					err = a.stage(tx, bound)
				}
				switch {
				case errors.Is(err, store.ErrAlreadyExists):
					// Sent already; the state moves all the same.
				case err != nil:
					return err
				case len(a.delivered) > 0:
					staged = append(staged, a)
					stagedID[f.Mail.ID] = true
				}
				out.Delivered = store.Delivered{Deliveries: a.delivered, Refused: a.refused}
			}
			if f.State != nil {
				if err := dialogues.Put(pk, f.State); err != nil {
					return err
				}
			}
			if err := tb.Delete(k); err != nil {
				return err
			}
			fired = append(fired, out)
		}
		slices.SortFunc(staged, func(a, b *appendOp) int { return strings.Compare(a.m.ID, b.m.ID) })
		for _, a := range staged {
			if err := a.putMessage(tx); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return fired, errors.Join(errs...)
}
