package pgstore

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/parleyhq/parley/services/dispatcher/internal/notify"
)

var _ notify.Store = (*Store)(nil)

// PutNotificationRetry implements notify.Store.
func (s *Store) PutNotificationRetry(ctx context.Context, w notify.Waiting) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	_, err := s.db.Pool().Exec(ctx, `INSERT INTO notification_retries (sequence, notification, first_ns, next_ns, backoff_ns) VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (sequence) DO UPDATE SET notification = EXCLUDED.notification, first_ns = EXCLUDED.first_ns, next_ns = EXCLUDED.next_ns, backoff_ns = EXCLUDED.backoff_ns`,
		int64(w.Sequence), w.Notification, w.First.UnixNano(), w.Next.UnixNano(), int64(w.Backoff))
	return err
}

// DeleteNotificationRetry implements notify.Store.
func (s *Store) DeleteNotificationRetry(ctx context.Context, seq uint64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	_, err := s.db.Pool().Exec(ctx, `DELETE FROM notification_retries WHERE sequence = $1`, int64(seq))
	return err
}

// NotificationRetries implements notify.Store.
func (s *Store) NotificationRetries(ctx context.Context) ([]notify.Waiting, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	rows, err := s.db.Pool().Query(ctx, `SELECT sequence, notification, first_ns, next_ns, backoff_ns FROM notification_retries ORDER BY sequence`)
	if err != nil {
		return nil, err
	}
	var (
		out                         []notify.Waiting
		seq, first, next, backoffNs int64
		data                        []byte
	)
	_, err = pgx.ForEachRow(rows, []any{&seq, &data, &first, &next, &backoffNs}, func() error {
		out = append(out, notify.Waiting{
			Sequence: uint64(seq), Notification: append([]byte(nil), data...),
			First: time.Unix(0, first), Next: time.Unix(0, next), Backoff: time.Duration(backoffNs),
		})
		return nil
	})
	return out, err
}
