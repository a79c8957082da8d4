package boltstore

import (
	"errors"

	bolt "go.etcd.io/bbolt"
)

// maxGroup caps how many writes share one transaction.
const maxGroup = 512

// errClosed reports a write after Close.
var errClosed = errors.New("store is closed")

// committer is group commit without a timer: one goroutine runs
// transactions back to back, and each takes every write that queued while
// the previous one was being fsynced. An idle store commits a lone write at
// once; a busy one shares each fsync among many writers. (db.Batch instead
// waits MaxBatchDelay before every commit, which costs more than the fsync
// itself on fast disks.)
//
// A write whose function fails is dropped from the group and gets its
// error; the others are retried in a fresh transaction, so a failing write
// never leaves partial changes (the same contract as db.Batch, whose
// functions must also tolerate running more than once).
type committer struct {
	db *bolt.DB
	// run is db.Update: a read-write transaction whose Commit fsyncs
	// (the DB is never opened with NoSync). Tests wrap it to observe commits.
	run  func(func(*bolt.Tx) error) error
	ops  chan *op
	quit chan struct{}
	done chan struct{}
}

type op struct {
	fn  func(*bolt.Tx) error
	err chan error
}

func newCommitter(db *bolt.DB) *committer {
	c := &committer{db: db, run: db.Update, ops: make(chan *op, maxGroup), quit: make(chan struct{}), done: make(chan struct{})}
	go c.loop()
	return c
}

// update runs fn in a shared read-write transaction and returns once that
// transaction is durable, or fn's error.
func (c *committer) update(fn func(*bolt.Tx) error) error {
	o := &op{fn: fn, err: make(chan error, 1)}
	select {
	case c.ops <- o:
	case <-c.quit:
		return errClosed
	}
	return <-o.err
}

// close stops the loop after the writes already queued.
func (c *committer) close() {
	close(c.quit)
	<-c.done
}

func (c *committer) loop() {
	defer close(c.done)
	group := make([]*op, 0, maxGroup)
	for {
		select {
		case o := <-c.ops:
			group = append(group[:0], o)
		case <-c.quit:
			for {
				select {
				case o := <-c.ops:
					o.err <- errClosed
				default:
					return
				}
			}
		}
	drain:
		for len(group) < maxGroup {
			select {
			case o := <-c.ops:
				group = append(group, o)
			default:
				break drain
			}
		}
		c.commit(group)
	}
}

// commit runs group in one transaction, dropping failing writes.
func (c *committer) commit(group []*op) {
	for len(group) > 0 {
		failed := -1
		var failErr error
		err := c.run(func(tx *bolt.Tx) error {
			for i, o := range group {
				if err := o.fn(tx); err != nil {
					failed, failErr = i, err
					return err
				}
			}
			return nil
		})
		if failed >= 0 {
			group[failed].err <- failErr
			group = append(group[:failed], group[failed+1:]...)
			continue
		}
		for _, o := range group {
			o.err <- err
		}
		return
	}
}
