package boltstore

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"time"

	"github.com/parleyhq/parley/platform/boltdb"
	"github.com/parleyhq/parley/services/dispatcher/internal/notify"
)

// bucketNotificationRetries: 8-byte big-endian sequence in the registry's
// outbox → JSON waitingRecord, the notifications the relay waits to retry
// (schema 7; see internal/notify).
var bucketNotificationRetries = []byte("notification_retries")

var _ notify.Store = (*Store)(nil)

// waitingRecord is a notify.Waiting as stored.
type waitingRecord struct {
	Notification []byte        `json:"notification"`
	First        time.Time     `json:"first"`
	Next         time.Time     `json:"next"`
	Backoff      time.Duration `json:"backoff"`
}

func sequenceKey(seq uint64) []byte { return binary.BigEndian.AppendUint64(nil, seq) }

// PutNotificationRetry implements notify.Store.
func (s *Store) PutNotificationRetry(ctx context.Context, w notify.Waiting) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	data, err := json.Marshal(waitingRecord{Notification: w.Notification, First: w.First, Next: w.Next, Backoff: w.Backoff})
	if err != nil {
		return err
	}
	return s.db.Update(func(tx *boltdb.Tx) error {
		return tx.Bucket(bucketNotificationRetries).Put(sequenceKey(w.Sequence), data)
	})
}

// DeleteNotificationRetry implements notify.Store.
func (s *Store) DeleteNotificationRetry(ctx context.Context, seq uint64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.Update(func(tx *boltdb.Tx) error {
		return tx.Bucket(bucketNotificationRetries).Delete(sequenceKey(seq))
	})
}

// NotificationRetries implements notify.Store.
func (s *Store) NotificationRetries(ctx context.Context) ([]notify.Waiting, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var out []notify.Waiting
	err := s.db.View(func(tx *boltdb.Tx) error {
		return tx.Bucket(bucketNotificationRetries).ForEach(func(k, v []byte) error {
			var r waitingRecord
			if err := json.Unmarshal(v, &r); err != nil {
				return err
			}
			out = append(out, notify.Waiting{Sequence: binary.BigEndian.Uint64(k), Notification: r.Notification, First: r.First, Next: r.Next, Backoff: r.Backoff})
			return nil
		})
	})
	return out, err
}
