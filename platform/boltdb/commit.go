package boltdb

import (
	"errors"
	"fmt"
	"runtime"
	"sync"

	bolt "go.etcd.io/bbolt"
)

// maxGroup caps how many writes share one transaction.
const maxGroup = 512

// errNothingToCommit and errStepAside end a group's transaction without a
// commit: with the journal, a commit that changed nothing is not made, and
// one that could outgrow the mapped file is made again after the journal
// stepped aside (journal.outgrows).
var (
	errNothingToCommit = errors.New("nothing to commit")
	errStepAside       = errors.New("the journal steps aside first")
)

// ErrClosed reports a write after Close.
var ErrClosed = errors.New("database is closed")

// ErrPanicked marks a write whose function panicked. The committer runs
// it on its own goroutine, where no caller could recover the panic, so it
// becomes that write's error instead of ending the process.
var ErrPanicked = errors.New("write function panicked")

// committer is group commit without a timer: one goroutine runs
// transactions back to back, and each takes every write that queued while
// the previous one was being fsynced. An idle database commits a lone write
// at once; a busy one shares each fsync among many writers. (db.Batch
// instead waits MaxBatchDelay before every commit; docs/benchmarks.md
// compares the two.)
//
// A write whose function fails is dropped from the group and gets its
// error; the others are retried in a fresh transaction, so a failing write
// never leaves partial changes (the same contract as db.Batch, whose
// functions must also tolerate running more than once). A function that
// panics fails the same way, with ErrPanicked. A commit that fails fails
// every write in the group.
type committer struct {
	d *DB
	// afterCommit is d.afterCommit; tests replace it before the first
	// write to see the records.
	afterCommit func(*recorder) error
	ops         chan *op
	quit        chan struct{}
	done        chan struct{}
	stop        sync.Once
}

type op struct {
	fn  func(*Tx) error
	err chan error
}

func newCommitter(d *DB) *committer {
	c := &committer{d: d, afterCommit: d.afterCommit, ops: make(chan *op, maxGroup), quit: make(chan struct{}), done: make(chan struct{})}
	go c.loop()
	return c
}

// update runs fn in a shared read-write transaction and returns once that
// transaction is durable, or with fn's or the commit's error.
func (c *committer) update(fn func(*Tx) error) error {
	o := &op{fn: fn, err: make(chan error, 1)}
	select {
	case <-c.quit:
		return ErrClosed
	default:
	}
	select {
	case c.ops <- o:
	case <-c.quit:
		return ErrClosed
	}
	select {
	case err := <-o.err:
		return err
	case <-c.done:
		// The loop has ended; it answered o before ending, or never saw it.
		select {
		case err := <-o.err:
			return err
		default:
			return ErrClosed
		}
	}
}

// close stops the loop after the group being committed; writes still
// queued get ErrClosed. Later calls only wait.
func (c *committer) close() {
	c.stop.Do(func() { close(c.quit) })
	<-c.done
}

func (c *committer) loop() {
	defer close(c.done)
	group := make([]*op, 0, maxGroup)
	var rec *recorder // made on the first group after recording is turned on
	for {
		select {
		case o := <-c.ops:
			group = append(group[:0], o)
		case <-c.quit:
			for {
				select {
				case o := <-c.ops:
					o.err <- ErrClosed
				default:
					return
				}
			}
		}
		c.gather(&group)
		if c.d.record && rec == nil {
			rec = &recorder{}
		}
		c.commit(group, rec)
	}
}

// gather adds the writes that queue while runnable writers (typically the
// ones the last commit just answered) get to run: it yields the processor
// and drains the queue until a yield brings nothing new. With no writer
// runnable it returns at once, so an idle database commits a lone write
// without delay.
func (c *committer) gather(group *[]*op) {
	for len(*group) < maxGroup {
		runtime.Gosched()
		n := len(*group)
	drain:
		for len(*group) < maxGroup {
			select {
			case o := <-c.ops:
				*group = append(*group, o)
			default:
				break drain
			}
		}
		if len(*group) == n {
			return
		}
	}
}

// commit runs group in one transaction, dropping failing writes, and
// hands every remaining write the commit's own result, or afterCommit's
// error. Each attempt records into rec (nil: not recording) afresh, so a
// retried group carries none of the failed write's changes.
func (c *committer) commit(group []*op, rec *recorder) {
	if err := c.d.beforeCommit(); err != nil {
		for _, o := range group {
			o.err <- err
		}
		return
	}
	for len(group) > 0 {
		failed := -1
		var failErr error
		rec.reset()
		err := c.d.db.Update(func(btx *bolt.Tx) error {
			tx := &Tx{tx: btx, rec: rec}
			for i, o := range group {
				if err := safeCall(o.fn, tx); err != nil {
					failed, failErr = i, err
					return err
				}
			}
			if j := c.d.journal; j != nil {
				if rec.len() == 0 {
					return errNothingToCommit // no meta page written, no txid used (journal.matches counts on it)
				}
				if j.outgrows(tx.Size(), rec.len()) {
					return errStepAside
				}
			}
			tx.OnCommit(func() { c.d.countCommit(tx) })
			return nil
		})
		switch {
		case errors.Is(err, errNothingToCommit):
			c.d.synced.Add(1) // durable as it is: it changed nothing
			for _, o := range group {
				o.err <- nil
			}
			return
		case errors.Is(err, errStepAside):
			c.d.journal.stepAside(c.d.db)
			if err := c.d.journal.refuse(); err != nil {
				for _, o := range group {
					o.err <- err
				}
				return
			}
			continue // again, with bbolt's syncs
		}
		if failed >= 0 {
			group[failed].err <- failErr
			group = append(group[:failed], group[failed+1:]...)
			continue
		}
		if err == nil {
			err = c.afterCommit(rec)
		}
		for _, o := range group {
			o.err <- err
		}
		return
	}
}

// safeCall runs fn, turning a panic into an error wrapping ErrPanicked.
func safeCall(fn func(*Tx) error, tx *Tx) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %v", ErrPanicked, r)
		}
	}()
	return fn(tx)
}
