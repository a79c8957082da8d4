package boltdb

import (
	"errors"

	bolt "go.etcd.io/bbolt"
)

// Tx is a bbolt transaction as the stores see it: the part of bbolt's API
// they use, under the same names. In a write transaction of a DB with
// recording on, every change made through it, its buckets and their cursors
// is appended to the transaction's recorder (record.go) in the order made,
// so that the changes can be replayed exactly. Nothing reaches the
// underlying *bolt.Tx of a write transaction except through these methods.
//
// A Tx, and every Bucket and Cursor from it, is valid only inside the
// function it was handed to.
type Tx struct {
	tx  *bolt.Tx
	rec *recorder // nil when not recording
	// buckets holds the Buckets handed out, a chunk at a time (a write
	// looks up ten or so), and paths their recorded paths: one allocation
	// per chunk instead of one per lookup. A chunk lives as long as any
	// Bucket in it.
	buckets []Bucket
	paths   []byte
}

// Bucket is a bucket of a Tx.
type Bucket struct {
	b   *bolt.Bucket
	tx  *Tx
	rec *recorder // tx.rec
	// path is this bucket's names from the root, encoded as in a record
	// (uvarint length, name, for each), and depth their count; both are
	// kept only when recording.
	path  []byte
	depth int
}

// Cursor walks a Bucket. It remembers the key it stands on, so that Delete
// can record it.
type Cursor struct {
	c   *bolt.Cursor
	b   *Bucket
	key []byte
}

// Size is the database's size in bytes as this transaction sees it.
func (tx *Tx) Size() int64 { return tx.tx.Size() }

// Stats are the transaction's page and node counts.
func (tx *Tx) Stats() bolt.TxStats { return tx.tx.Stats() }

// OnCommit runs fn once the transaction has committed.
func (tx *Tx) OnCommit(fn func()) { tx.tx.OnCommit(fn) }

// bucket wraps bbolt's bucket b, named name, inside the bucket at parent
// (nil and 0 for the root).
func (tx *Tx) bucket(b *bolt.Bucket, parent []byte, depth int, name []byte) *Bucket {
	if b == nil {
		return nil
	}
	if len(tx.buckets) == cap(tx.buckets) {
		n := 16
		if tx.buckets == nil {
			n = 4
		}
		tx.buckets = make([]Bucket, 0, n)
	}
	tx.buckets = tx.buckets[:len(tx.buckets)+1]
	nb := &tx.buckets[len(tx.buckets)-1]
	nb.b, nb.tx = b, tx
	if tx.rec != nil {
		if tx.paths == nil {
			tx.paths = make([]byte, 0, 256)
		}
		start := len(tx.paths)
		tx.paths = appendName(append(tx.paths, parent...), name)
		nb.rec, nb.path, nb.depth = tx.rec, tx.paths[start:len(tx.paths):len(tx.paths)], depth+1
	}
	return nb
}

// child wraps bbolt's top-level bucket b, named name.
func (tx *Tx) child(b *bolt.Bucket, name []byte) *Bucket { return tx.bucket(b, nil, 0, name) }

// Bucket returns the top-level bucket named name, or nil.
func (tx *Tx) Bucket(name []byte) *Bucket { return tx.child(tx.tx.Bucket(name), name) }

// CreateBucket creates the top-level bucket name.
func (tx *Tx) CreateBucket(name []byte) (*Bucket, error) {
	b, err := tx.tx.CreateBucket(name)
	return created(b, err, tx.child, name, tx.rec)
}

// CreateBucketIfNotExists returns the top-level bucket name, creating it
// when missing.
func (tx *Tx) CreateBucketIfNotExists(name []byte) (*Bucket, error) {
	b, err := tx.tx.CreateBucketIfNotExists(name)
	return created(b, err, tx.child, name, tx.rec)
}

// created wraps bucket b, just created (or found) as name by bbolt, with
// child, and records its creation; err is bbolt's.
func created(b *bolt.Bucket, err error, child func(*bolt.Bucket, []byte) *Bucket, name []byte, rec *recorder) (*Bucket, error) {
	if err != nil {
		return nil, err
	}
	nb := child(b, name)
	if rec != nil {
		rec.createBucket(nb)
	}
	return nb, nil
}

// DeleteBucket deletes the top-level bucket name and everything in it.
func (tx *Tx) DeleteBucket(name []byte) error {
	if err := tx.tx.DeleteBucket(name); err != nil {
		return err
	}
	if tx.rec != nil {
		tx.rec.deleteBucket(nil, 0, name)
	}
	return nil
}

// ForEach calls fn for each top-level bucket, in name order.
func (tx *Tx) ForEach(fn func(name []byte, b *Bucket) error) error {
	return tx.tx.ForEach(func(name []byte, b *bolt.Bucket) error { return fn(name, tx.child(b, name)) })
}

// Get returns key's value, or nil if key is missing or names a bucket. The
// value is valid only inside the transaction.
func (b *Bucket) Get(key []byte) []byte { return b.b.Get(key) }

// Put sets key to value. Both must stay unchanged until the transaction
// ends.
func (b *Bucket) Put(key, value []byte) error {
	if err := b.b.Put(key, value); err != nil {
		return err
	}
	if b.rec != nil {
		b.rec.keyOp(opPut, b, key, value)
	}
	return nil
}

// Delete removes key; a missing key is not an error.
func (b *Bucket) Delete(key []byte) error {
	if err := b.b.Delete(key); err != nil {
		return err
	}
	if b.rec != nil {
		b.rec.keyOp(opDelete, b, key, nil)
	}
	return nil
}

// child wraps bbolt's bucket c, named name, inside b.
func (b *Bucket) child(c *bolt.Bucket, name []byte) *Bucket {
	return b.tx.bucket(c, b.path, b.depth, name)
}

// Bucket returns the nested bucket name, or nil.
func (b *Bucket) Bucket(name []byte) *Bucket { return b.child(b.b.Bucket(name), name) }

// CreateBucket creates the nested bucket name.
func (b *Bucket) CreateBucket(name []byte) (*Bucket, error) {
	c, err := b.b.CreateBucket(name)
	return created(c, err, b.child, name, b.rec)
}

// CreateBucketIfNotExists returns the nested bucket name, creating it when
// missing.
func (b *Bucket) CreateBucketIfNotExists(name []byte) (*Bucket, error) {
	c, err := b.b.CreateBucketIfNotExists(name)
	return created(c, err, b.child, name, b.rec)
}

// DeleteBucket deletes the nested bucket name and everything in it.
func (b *Bucket) DeleteBucket(name []byte) error {
	if err := b.b.DeleteBucket(name); err != nil {
		return err
	}
	if b.rec != nil {
		b.rec.deleteBucket(b.path, b.depth, name)
	}
	return nil
}

// ForEach calls fn for each key in b in order; v is nil for a nested
// bucket. fn must not change b.
func (b *Bucket) ForEach(fn func(k, v []byte) error) error { return b.b.ForEach(fn) }

// SetSequence sets b's sequence number.
func (b *Bucket) SetSequence(n uint64) error {
	if err := b.b.SetSequence(n); err != nil {
		return err
	}
	if b.rec != nil {
		b.rec.setSequence(b, n)
	}
	return nil
}

// NextSequence increments b's sequence number and returns it. It is
// recorded as setting the result, so a replay gives the same number.
func (b *Bucket) NextSequence() (uint64, error) {
	n, err := b.b.NextSequence()
	if err != nil {
		return 0, err
	}
	if b.rec != nil {
		b.rec.setSequence(b, n)
	}
	return n, nil
}

// Stats are b's page and key counts.
func (b *Bucket) Stats() bolt.BucketStats { return b.b.Stats() }

// Cursor returns a cursor over b.
func (b *Bucket) Cursor() *Cursor { return &Cursor{c: b.b.Cursor(), b: b} }

func (c *Cursor) at(k, v []byte) ([]byte, []byte) {
	c.key = k
	return k, v
}

// First moves to the first key and returns it and its value (nil, nil when
// b is empty). v is nil for a nested bucket.
func (c *Cursor) First() (k, v []byte) { return c.at(c.c.First()) }

// Last moves to the last key.
func (c *Cursor) Last() (k, v []byte) { return c.at(c.c.Last()) }

// Next moves to the next key; nil, nil past the end.
func (c *Cursor) Next() (k, v []byte) { return c.at(c.c.Next()) }

// Prev moves to the previous key; nil, nil before the start.
func (c *Cursor) Prev() (k, v []byte) { return c.at(c.c.Prev()) }

// Seek moves to seek, or the first key after it.
func (c *Cursor) Seek(seek []byte) (k, v []byte) { return c.at(c.c.Seek(seek)) }

// Delete removes the key the cursor stands on; the next Next returns the
// key after it. Unlike bbolt's, it refuses a cursor on no key: one not yet
// moved, moved past either end, or whose key it has just deleted (bbolt
// would then delete the key that moved into its place, which this wrapper
// cannot see to record).
func (c *Cursor) Delete() error {
	if c.key == nil {
		return errCursorOnNoKey
	}
	if c.b.rec == nil {
		if err := c.c.Delete(); err != nil {
			return err
		}
		c.key = nil
		return nil
	}
	// Recorded first, while the key's bytes are surely valid, and taken
	// back if bbolt refuses.
	mark := c.b.rec.len()
	c.b.rec.keyOp(opDelete, c.b, c.key, nil)
	if err := c.c.Delete(); err != nil {
		c.b.rec.buf = c.b.rec.buf[:mark]
		return err
	}
	c.key = nil
	return nil
}

var errCursorOnNoKey = errors.New("cursor delete: the cursor stands on no key (not moved, moved past an end, or its key already deleted)")
