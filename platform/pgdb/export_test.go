package pgdb

import "context"

// SweepBuckets exposes sweepBuckets to the tests.
func (d *DB) SweepBuckets(t interface{ Context() context.Context }) (int, error) {
	return d.sweepBuckets(t.Context())
}
