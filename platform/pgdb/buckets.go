package pgdb

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
)

// Token buckets shared by the replicas of a service (auth.SharedBuckets):
// one row per (limit, key) in the table rate_buckets, which Open creates in
// every schema beside schema_migrations (bucketsTable). A take is one
// INSERT ... ON CONFLICT DO UPDATE ... RETURNING, so concurrent takes queue
// on the row lock and never over-spend; the time is the server's
// (statement_timestamp), one clock for every replica. full_at is when the
// bucket will be full again: from then on the row says nothing a missing
// row does not, and sweepBuckets deletes it.

// bucketsTable is the DDL of rate_buckets, run by every Open (idempotent).
const bucketsTable = `CREATE TABLE IF NOT EXISTS %[1]s.rate_buckets (
  name    text COLLATE "C" NOT NULL,
  key     text COLLATE "C" NOT NULL,
  tokens  double precision NOT NULL,
  at      timestamptz NOT NULL,
  full_at timestamptz NOT NULL,
  took    boolean NOT NULL,
  PRIMARY KEY (name, key)
);
CREATE INDEX IF NOT EXISTS rate_buckets_full_at ON %[1]s.rate_buckets (full_at)`

// refilled is the SQL for the tokens of the stored bucket b now, refilled
// at $3 tokens per second up to $4.
const refilled = `least($4::float8, b.tokens + $3::float8 * extract(epoch FROM statement_timestamp() - b.at)::float8)`

// takeToken is the take: a new bucket starts full ($4) less the token
// taken; a stored one is refilled and gives a token when it holds one.
// took records whether it did, for RETURNING (which sees the new row).
var takeToken = `INSERT INTO rate_buckets AS b (name, key, tokens, at, full_at, took)
VALUES ($1, $2, $4::float8 - 1, statement_timestamp(), statement_timestamp() + make_interval(secs => 1 / $3::float8), true)
ON CONFLICT (name, key) DO UPDATE SET
  took    = ` + refilled + ` >= 1,
  tokens  = ` + refilled + ` - CASE WHEN ` + refilled + ` >= 1 THEN 1 ELSE 0 END,
  at      = statement_timestamp(),
  full_at = statement_timestamp() + make_interval(secs => ($4::float8 - ` + refilled + ` + CASE WHEN ` + refilled + ` >= 1 THEN 1 ELSE 0 END) / $3::float8)
RETURNING took`

// bucketSweepEvery is how often TakeToken also deletes full buckets, and
// bucketSweepBatch how many at most per statement.
const (
	bucketSweepEvery = time.Minute
	bucketSweepBatch = 1000
)

// TakeToken implements auth.SharedBuckets: it refills the bucket (name,
// key) at rate tokens per second up to burst (a new bucket starts full)
// and takes a token if it holds one, reporting whether it did. About once
// a minute per DB it also deletes buckets that are full again; a failure
// of that sweep is logged (Options.Logger) and leaves the take as it is.
func (d *DB) TakeToken(ctx context.Context, name, key string, rate float64, burst int) (bool, error) {
	if rate <= 0 || burst < 1 {
		return false, fmt.Errorf("pgdb: rate limit %s: rate %v and burst %d must be positive", name, rate, burst)
	}
	var took bool
	if err := d.pool.QueryRow(ctx, takeToken, name, key, rate, burst).Scan(&took); err != nil {
		return false, fmt.Errorf("pgdb: rate limit %s: %w", name, err)
	}
	if last := d.bucketsSwept.Load(); time.Since(time.Unix(0, last)) >= bucketSweepEvery && d.bucketsSwept.CompareAndSwap(last, time.Now().UnixNano()) {
		// What the sweep deleted before a failure (or the caller's
		// deadline) stays deleted; the rest waits for the next minute.
		if n, err := d.sweepBuckets(ctx); err != nil && ctx.Err() == nil {
			d.logger.WarnContext(ctx, "full rate-limit buckets not swept; retrying in a minute",
				slog.String("schema", d.schema), slog.Int("swept", n), slog.Any("err", err))
		}
	}
	return took, nil
}

// TokenLeft implements auth.SharedBuckets: whether the bucket (name, key),
// refilled, holds a token. A missing bucket is full.
func (d *DB) TokenLeft(ctx context.Context, name, key string, rate float64, burst int) (bool, error) {
	var left bool
	err := d.pool.QueryRow(ctx, `SELECT `+refilled+` >= 1 FROM rate_buckets AS b WHERE name = $1 AND key = $2`, name, key, rate, burst).Scan(&left)
	if errors.Is(err, pgx.ErrNoRows) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("pgdb: rate limit %s: %w", name, err)
	}
	return left, nil
}

// sweepBuckets deletes buckets that are full again, bucketSweepBatch at a
// time (an index range scan on full_at), until none is left; it returns
// how many.
func (d *DB) sweepBuckets(ctx context.Context) (int, error) {
	total := 0
	for {
		tag, err := d.pool.Exec(ctx, `DELETE FROM rate_buckets WHERE ctid = ANY (ARRAY(
  SELECT ctid FROM rate_buckets WHERE full_at <= statement_timestamp() ORDER BY full_at LIMIT $1))`, bucketSweepBatch)
		if err != nil {
			return total, err
		}
		n := int(tag.RowsAffected())
		total += n
		if n < bucketSweepBatch {
			return total, nil
		}
	}
}
