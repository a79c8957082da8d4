package boltdb

import (
	"encoding/binary"
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// A record is the changes of one write transaction, in the order made, as
// key-level operations that replay exactly (ADR 0008). It is a sequence of
//
//	op    = kind path [key value | key | n]
//	path  = uvarint(depth) name*depth   the bucket names from the root
//	name, key, value = uvarint(len) bytes
//	n     = uvarint
//
// by kind:
//
//	opPut          path key value   put key in the bucket at path
//	opDelete       path key         delete key (a missing one is no error)
//	opCreateBucket path             create the bucket at path if missing
//	opDeleteBucket path             delete the bucket at path, if there
//	opSetSequence  path n           set the sequence of the bucket at path
//
// NextSequence is recorded as the opSetSequence of its result.
const (
	opPut byte = 1 + iota
	opDelete
	opCreateBucket
	opDeleteBucket
	opSetSequence
)

// recorder holds the record of one write transaction. Values are copied
// in: bbolt's slices are valid only inside the transaction. A nil recorder
// is empty.
type recorder struct {
	buf []byte
}

// reset empties r for another transaction, keeping its memory.
func (r *recorder) reset() {
	if r != nil {
		r.buf = r.buf[:0]
	}
}

// bytes is the record so far. It is r's own memory: valid until r is reset.
func (r *recorder) bytes() []byte {
	if r == nil {
		return nil
	}
	return r.buf
}

// len is the record's size in bytes.
func (r *recorder) len() int {
	if r == nil {
		return 0
	}
	return len(r.buf)
}

func appendName(buf, name []byte) []byte {
	buf = binary.AppendUvarint(buf, uint64(len(name)))
	return append(buf, name...)
}

func (r *recorder) appendPath(kind byte, b *Bucket) {
	r.buf = append(r.buf, kind)
	r.buf = binary.AppendUvarint(r.buf, uint64(b.depth)) //nolint:gosec // a count, never negative
	r.buf = append(r.buf, b.path...)
}

// keyOp records a put (with value) or a delete of key in b.
func (r *recorder) keyOp(kind byte, b *Bucket, key, value []byte) {
	r.appendPath(kind, b)
	r.buf = appendName(r.buf, key)
	if kind == opPut {
		r.buf = appendName(r.buf, value)
	}
}

// createBucket records the creation of b.
func (r *recorder) createBucket(b *Bucket) { r.appendPath(opCreateBucket, b) }

// deleteBucket records the deletion of bucket name inside the bucket at
// parent (nil and 0 for the root).
func (r *recorder) deleteBucket(parent []byte, depth int, name []byte) {
	r.buf = append(r.buf, opDeleteBucket)
	r.buf = binary.AppendUvarint(r.buf, uint64(depth+1)) //nolint:gosec // a count, never negative
	r.buf = append(r.buf, parent...)
	r.buf = appendName(r.buf, name)
}

func (r *recorder) setSequence(b *Bucket, n uint64) {
	r.appendPath(opSetSequence, b)
	r.buf = binary.AppendUvarint(r.buf, n)
}

// replay applies record to the write transaction tx. A put or a sequence
// into a missing bucket is an error naming its path; deleting a missing key
// or bucket is not. Malformed input is an error saying what and where,
// never a panic. tx keeps slices of record (bbolt's Put does not copy), so
// record must stay unchanged until tx ends.
func replay(tx *bolt.Tx, record []byte) error {
	if !tx.Writable() {
		return errors.New("replay: transaction is read-only")
	}
	d := decoder{buf: record}
	var path [][]byte
	for len(d.buf) > 0 {
		at := d.off
		kind := d.buf[0]
		d.skip(1)
		var err error
		if path, err = d.path(path[:0]); err != nil {
			return fmt.Errorf("replay: op at byte %d: %w", at, err)
		}
		if err := apply(tx, kind, path, &d); err != nil {
			return fmt.Errorf("replay: op at byte %d: %w", at, err)
		}
	}
	return nil
}

// apply decodes the rest of one op of kind on path and applies it.
func apply(tx *bolt.Tx, kind byte, path [][]byte, d *decoder) error {
	switch kind {
	case opPut, opDelete:
		key, err := d.bytes("key")
		if err != nil {
			return err
		}
		var value []byte
		if kind == opPut {
			if value, err = d.bytes("value"); err != nil {
				return err
			}
		}
		if len(path) == 0 {
			return fmt.Errorf("key %q at the root (only buckets live there)", key)
		}
		b := walk(tx, path)
		if b == nil {
			if kind == opDelete {
				return nil
			}
			return fmt.Errorf("put %q: bucket %s is missing", key, showPath(path))
		}
		if kind == opDelete {
			if err := b.Delete(key); err != nil {
				return fmt.Errorf("delete %q in %s: %w", key, showPath(path), err)
			}
			return nil
		}
		if err := b.Put(key, value); err != nil {
			return fmt.Errorf("put %q in %s: %w", key, showPath(path), err)
		}
		return nil
	case opCreateBucket, opDeleteBucket:
		if len(path) == 0 {
			return errors.New("bucket op with an empty path")
		}
		parent, name := path[:len(path)-1], path[len(path)-1]
		if kind == opCreateBucket {
			var err error
			if len(parent) == 0 {
				_, err = tx.CreateBucketIfNotExists(name)
			} else if p := walk(tx, parent); p == nil {
				err = fmt.Errorf("parent %s is missing", showPath(parent))
			} else {
				_, err = p.CreateBucketIfNotExists(name)
			}
			if err != nil {
				return fmt.Errorf("create bucket %s: %w", showPath(path), err)
			}
			return nil
		}
		var err error
		if len(parent) == 0 {
			err = tx.DeleteBucket(name)
		} else if p := walk(tx, parent); p != nil {
			err = p.DeleteBucket(name)
		}
		if err != nil && !errors.Is(err, berrors.ErrBucketNotFound) {
			return fmt.Errorf("delete bucket %s: %w", showPath(path), err)
		}
		return nil
	case opSetSequence:
		n, err := d.uvarint("sequence")
		if err != nil {
			return err
		}
		if len(path) == 0 {
			return errors.New("sequence with an empty path")
		}
		b := walk(tx, path)
		if b == nil {
			return fmt.Errorf("set sequence: bucket %s is missing", showPath(path))
		}
		if err := b.SetSequence(n); err != nil {
			return fmt.Errorf("set sequence of %s: %w", showPath(path), err)
		}
		return nil
	default:
		return fmt.Errorf("unknown op kind %d", kind)
	}
}

// walk returns the bucket at path (not empty), or nil.
func walk(tx *bolt.Tx, path [][]byte) *bolt.Bucket {
	b := tx.Bucket(path[0])
	for _, name := range path[1:] {
		if b == nil {
			return nil
		}
		b = b.Bucket(name)
	}
	return b
}

func showPath(path [][]byte) string {
	s := ""
	for i, name := range path {
		if i > 0 {
			s += "/"
		}
		s += fmt.Sprintf("%q", name)
	}
	return s
}

// decoder reads a record; off is how far it has read, for messages.
type decoder struct {
	buf []byte
	off int
}

func (d *decoder) skip(n int) {
	d.buf = d.buf[n:]
	d.off += n
}

func (d *decoder) uvarint(what string) (uint64, error) {
	n, size := binary.Uvarint(d.buf)
	if size <= 0 {
		return 0, fmt.Errorf("%s: bad uvarint at byte %d", what, d.off)
	}
	d.skip(size)
	return n, nil
}

func (d *decoder) bytes(what string) ([]byte, error) {
	n, err := d.uvarint(what + " length")
	if err != nil {
		return nil, err
	}
	if n > uint64(len(d.buf)) {
		return nil, fmt.Errorf("%s of %d bytes at byte %d overruns the record (%d left)", what, n, d.off, len(d.buf))
	}
	b := d.buf[:n:n]
	d.skip(int(n))
	return b, nil
}

// path reads a path into names (reusing its memory).
func (d *decoder) path(names [][]byte) ([][]byte, error) {
	depth, err := d.uvarint("path depth")
	if err != nil {
		return nil, err
	}
	// Each name takes a byte at least: a larger depth cannot be right, and
	// must not size an allocation.
	if depth > uint64(len(d.buf)) {
		return nil, fmt.Errorf("path depth %d at byte %d overruns the record (%d left)", depth, d.off, len(d.buf))
	}
	for range depth {
		name, err := d.bytes("bucket name")
		if err != nil {
			return nil, err
		}
		names = append(names, name)
	}
	return names, nil
}
