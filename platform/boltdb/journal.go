package boltdb

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"hash/fnv"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
)

// The journal (ADR 0008) makes a commit durable with one fdatasync of a
// small append instead of bbolt's two ordered fdatasyncs of the changed
// pages. bbolt commits with NoSync; the commit's record (record.go) is
// appended to the journal file and synced before any writer is answered.
// A checkpoint syncs bbolt's file and writes, into one of two header slots,
// copies of its two meta pages and where the journal's live records begin.
// A read transaction opened at the checkpoint and held until the next one
// is durable pins the checkpoint's tree: bbolt reuses no page of it, so
// whatever happened to the file's later, unsynced writes, that tree is
// intact on disk. Open restores the meta pages of the newest durable
// checkpoint, opens that tree and replays the records after it in order.
//
// The file:
//
//	[slot 0][slot 1][records ...]
//
// slot (slotSize bytes, the newer valid one wins):
//
//	magic "PARLEYJ1" | crc32c of the rest | page size u32 | checkpoint n u64 |
//	flags u32 | 0 u32 | head u64 | seq u64 | txid u64 | 0 u64 |
//	meta page 0 | meta page 1                               (little-endian)
//
// record:
//
//	magic u32 | crc32c of the rest u32 | length u32 | seq u64 | record bytes
//
// Records run from head, each seq one more than the last, in pre-written
// space (a sync then writes data only, never the file's extent map). When
// a record does not fit before the file's end, it goes to the start of the
// record area (the ring wraps) if that does not reach head. A checkpoint
// moves head to where the next record goes. Open reads records from head
// while each is whole and carries the next seq; the first that is not ends
// the journal (a torn record was never acknowledged).

const (
	// JournalSuffix names a database's journal file: its path plus this.
	JournalSuffix = "-journal"

	slotMagic     = "PARLEYJ1"
	slotHeader    = 64
	maxPageSize   = 64 << 10
	slotSize      = slotHeader + 2*maxPageSize
	recordsStart  = 2 * slotSize
	recordMagic   = 0x4A524543 // "CERJ" little-endian: a record
	recordHeader  = 20
	flagActive    = 1
	journalGrowBy = 1 << 20
	minRecords    = 16 << 10
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// errNoSlot marks a slot never written, or torn while written: the other
// one is then the newest.
var errNoSlot = errors.New("no valid slot")

// JournalOptions turns the journal on (Options.Journal). Zero fields take
// the defaults.
type JournalOptions struct {
	// Size is the most the journal file grows to (default 64 MiB; the
	// records get all but the first 256 KiB). It grows in steps of 1 MiB,
	// each written with zeros before use. A record larger than a quarter
	// of the record area is not journaled: its commit is made durable by a
	// checkpoint instead.
	Size int64
	// A checkpoint starts once CheckpointBytes of records (default
	// Size/8), or CheckpointPages pages written by commits (default 8192),
	// accumulated since the last one, or CheckpointEvery (default 1 s)
	// passed with anything journaled. Pages freed since a checkpoint are
	// not reused until the next, so the file grows by up to about
	// CheckpointPages pages between two.
	CheckpointBytes int64
	CheckpointPages int
	CheckpointEvery time.Duration

	// mapSize replaces the mapped address space (tests: a small one makes
	// the journal step aside).
	mapSize int
	// sync replaces fdatasync(2) of the database file ("db") and the
	// journal ("journal"), and fsync(2) of their directory ("dir"): tests
	// take the files' durable images there.
	// readAt replaces the journal's reads (tests: a failing disk).
	readAt func(f *os.File, b []byte, off int64) (int, error)
	sync   func(f *os.File, file string) error
}

func (o JournalOptions) withDefaults() JournalOptions {
	if o.Size <= 0 {
		o.Size = 64 << 20
	}
	o.Size = max(o.Size, recordsStart+minRecords)
	if o.CheckpointBytes <= 0 {
		o.CheckpointBytes = o.Size / 8
	}
	if o.CheckpointPages <= 0 {
		o.CheckpointPages = 8192
	}
	if o.CheckpointEvery <= 0 {
		o.CheckpointEvery = time.Second
	}
	return o
}

// journal is owned by the committer goroutine once Open returns, except
// what a running checkpoint's finish touches (the db file's sync and a
// slot), which nothing else writes.
type journal struct {
	opts JournalOptions
	f    *os.File // the journal
	dbf  *os.File // bbolt's file, read-only: meta pages are copied from it
	path string

	end      int64  // the file's current size (≤ opts.Size)
	tail     int64  // where the next record goes
	seq      uint64 // the next record's sequence number
	head     int64  // the newest durable checkpoint's head
	ckpt     uint64 // the newest durable checkpoint's number
	pageSize int

	pin      *bolt.Tx         // pins the newest durable checkpoint's tree
	inflight chan *checkpoint // a checkpoint finishing, or nil
	since    int64            // record bytes since the last capture
	pages    int64            // pages written since the last capture
	captured time.Time        // when the last checkpoint was captured
	mapSize  int              // the address space bbolt maps
	stepped  atomic.Bool      // the journal stepped aside (see stepAside); tests read it while writes run
	broken   error            // set once a write or sync failed: writes are refused
	buf      []byte           // the record being written

	// syncs counts the journal's fdatasyncs and its checkpoints' syncs of
	// the database file (CommitStats.Syncs).
	syncs atomic.Uint64

	// recovered is what Open found: records to replay, and the checkpoint's
	// meta pages, written back over the database file's (nil: none).
	recovered [][]byte
	metas     []byte
	ckptTxid  uint64 // the checkpoint's bbolt transaction id
}

// checkpoint is one being taken: captured between commits, finished (file
// synced, slot written and synced) on a goroutine of its own.
type checkpoint struct {
	pin   *bolt.Tx
	metas []byte
	head  int64
	seq   uint64
	txid  uint64
	flags uint32
	n     uint64
	err   error
}

// openJournal opens or creates the journal of the database at dbPath,
// locks it (waiting up to lockTimeout, zero: forever) and brings the
// database file back to the journal's last checkpoint: its meta pages are
// written over the file's. start then replays the records after it.
func openJournal(dbPath string, opts JournalOptions, lockTimeout time.Duration) (*journal, error) {
	path := dbPath + JournalSuffix
	if strconv.IntSize < 64 {
		return nil, errors.New("the journal needs a 64-bit platform")
	}
	opts = opts.withDefaults()
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("journal %s: %w", path, err)
	}
	j := &journal{opts: opts, f: f, path: path}
	if err := lockFile(f, lockTimeout); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock journal %s: %w", path, err)
	}
	if err := j.load(); err != nil {
		f.Close()
		return nil, fmt.Errorf("journal %s: %w", path, err)
	}
	var size int64
	if st, err := os.Stat(dbPath); err == nil {
		size = st.Size()
	}
	if j.metas != nil {
		if size < int64(len(j.metas)) {
			f.Close()
			return nil, fmt.Errorf("journal %s has a checkpoint but database %s is missing or shorter than two pages (%d bytes): restore the database file with its journal", path, dbPath, size)
		}
		if err := j.restoreMetas(dbPath, lockTimeout); err != nil {
			f.Close()
			return nil, err
		}
	}
	j.mapSize = mapSize(size)
	if opts.mapSize > 0 {
		j.mapSize = opts.mapSize
	}
	return j, nil
}

// load reads the newest valid slot and the records after its head, or
// starts an empty journal.
func (j *journal) load() error {
	st, err := j.f.Stat()
	if err != nil {
		return err
	}
	j.end = st.Size()
	var best *checkpoint
	for i := range 2 {
		c, err := j.readSlot(i)
		if errors.Is(err, errNoSlot) {
			continue // torn or never written: the other slot holds the newest
		}
		if err != nil {
			return fmt.Errorf("read slot %d: %w", i, err) // not a torn write: nothing to fall back on safely
		}
		if best == nil || c.n > best.n {
			best = c
		}
	}
	if best == nil {
		// New, or created and never checkpointed: nothing in it counts.
		if err := j.grow(recordsStart + journalGrowBy); err != nil {
			return err
		}
		j.head, j.tail, j.seq = recordsStart, recordsStart, 1
		return nil
	}
	j.ckpt, j.head, j.seq, j.ckptTxid = best.n, best.head, best.seq, best.txid
	if best.flags&flagActive != 0 {
		j.metas = best.metas
	}
	j.tail = j.head
	if j.metas == nil {
		return nil // stepped aside: the database file is whole without it
	}
	for {
		rec, next, ok, err := j.readRecord(j.tail, j.seq)
		if err == nil && !ok && j.tail != recordsStart {
			rec, next, ok, err = j.readRecord(recordsStart, j.seq) // the ring wrapped
		}
		if err != nil {
			return fmt.Errorf("read record %d: %w", j.seq, err) // not a torn write: acknowledged records may follow
		}
		if !ok {
			return nil
		}
		j.recovered = append(j.recovered, rec)
		j.tail, j.seq = next, j.seq+1
	}
}

func (j *journal) readSlot(i int) (*checkpoint, error) {
	buf := make([]byte, slotSize)
	if _, err := j.readAt(buf, int64(i)*slotSize); errors.Is(err, io.EOF) {
		return nil, errNoSlot // a file cut short while it was made
	} else if err != nil {
		return nil, err
	}
	if string(buf[:8]) != slotMagic {
		return nil, errNoSlot
	}
	ps := int(binary.LittleEndian.Uint32(buf[12:]))
	if ps <= 0 || ps > maxPageSize {
		return nil, errNoSlot
	}
	if crc32.Checksum(buf[12:slotHeader+2*ps], crcTable) != binary.LittleEndian.Uint32(buf[8:]) {
		return nil, errNoSlot
	}
	c := &checkpoint{
		n:     binary.LittleEndian.Uint64(buf[16:]),
		flags: binary.LittleEndian.Uint32(buf[24:]),
		head:  int64(binary.LittleEndian.Uint64(buf[32:])), //nolint:gosec // checked below
		seq:   binary.LittleEndian.Uint64(buf[40:]),
		txid:  binary.LittleEndian.Uint64(buf[48:]),
		metas: buf[slotHeader : slotHeader+2*ps],
	}
	if c.head < recordsStart || c.head > j.end {
		return nil, errNoSlot
	}
	return c, nil
}

// readAt reads the journal (through opts.readAt in tests).
func (j *journal) readAt(b []byte, off int64) (int, error) {
	if j.opts.readAt != nil {
		return j.opts.readAt(j.f, b, off)
	}
	return j.f.ReadAt(b, off)
}

// readRecord reads the record at off if it is whole and carries seq; err
// is a failed read, not a torn record.
func (j *journal) readRecord(off int64, seq uint64) (rec []byte, next int64, ok bool, err error) {
	var h [recordHeader]byte
	if off+recordHeader > j.end {
		return nil, 0, false, nil
	}
	if _, err := j.readAt(h[:], off); err != nil {
		return nil, 0, false, err
	}
	n := int64(binary.LittleEndian.Uint32(h[8:]))
	if binary.LittleEndian.Uint32(h[0:]) != recordMagic || binary.LittleEndian.Uint64(h[12:]) != seq || off+recordHeader+n > j.end {
		return nil, 0, false, nil
	}
	rec = make([]byte, n)
	if _, err := j.readAt(rec, off+recordHeader); err != nil {
		return nil, 0, false, err
	}
	crc := crc32.Update(crc32.Checksum(h[8:], crcTable), crcTable, rec)
	if crc != binary.LittleEndian.Uint32(h[4:]) {
		return nil, 0, false, nil
	}
	return rec, off + recordHeader + n, true, nil
}

// grow extends the file to size (at most opts.Size) with zeros, synced.
func (j *journal) grow(size int64) error {
	size = min(size, j.opts.Size)
	if size <= j.end {
		return nil
	}
	zeros := make([]byte, min(size-j.end, journalGrowBy))
	for off := j.end; off < size; off += int64(len(zeros)) {
		if _, err := j.f.WriteAt(zeros[:min(int64(len(zeros)), size-off)], off); err != nil {
			return fmt.Errorf("grow: %w", err)
		}
	}
	if err := j.sync(); err != nil {
		return err
	}
	j.end = size
	return nil
}

func (j *journal) sync() error {
	if err := j.fdatasync(j.f, "journal"); err != nil {
		return fmt.Errorf("sync: %w", err)
	}
	return nil
}

// syncDir syncs dir, the directory of the database and its journal,
// which makes a creation of either durable. It is not one of the files'
// fdatasyncs that Commits counts.
func (j *journal) syncDir(dir string) error {
	if j.opts.sync != nil {
		return syncDir(dir, func(f *os.File) error { return j.opts.sync(f, "dir") })
	}
	return syncDir(dir, (*os.File).Sync)
}

// fdatasync syncs f, the database file ("db") or the journal.
func (j *journal) fdatasync(f *os.File, file string) error {
	j.syncs.Add(1)
	if j.opts.sync != nil {
		return j.opts.sync(f, file)
	}
	return fdatasync(f)
}

// restoreMetas writes the checkpoint's meta pages over the database file's
// at path, so that bbolt opens the checkpoint's tree, and syncs them. It
// holds the file's lock as bbolt takes it (another process may have the
// file open without the journal) and first checks that the file belongs
// with the journal (matches).
func (j *journal) restoreMetas(path string, lockTimeout time.Duration) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("restore meta pages of %s: %w", path, err)
	}
	defer f.Close() // lets go of the lock
	if err := lockFile(f, lockTimeout); err != nil {
		return fmt.Errorf("lock %s: %w", path, err)
	}
	if err := j.matches(f, path); err != nil {
		return err
	}
	if _, err := f.WriteAt(j.metas, 0); err != nil {
		return fmt.Errorf("restore meta pages of %s: %w", path, err)
	}
	if err := j.fdatasync(f, "db"); err != nil {
		return fmt.Errorf("restore meta pages of %s: %w", path, err)
	}
	return nil
}

// matches refuses a database file that is not the one the journal's
// checkpoint was taken of, or no longer it: older than the checkpoint
// (put back from a copy without its journal) or moved on past what the
// journal knows of (opened without it). Commits after a checkpoint each
// leave a record (one that changes nothing is not made), so the file's
// newest meta page is at most the records after it, plus one commit
// whose record was lost, plus Open's own schema commit, past the
// checkpoint; and a checkpoint syncs the file, so its newest meta page
// is at least the one before the checkpoint's.
func (j *journal) matches(f *os.File, path string) error {
	ps := len(j.metas) / 2
	buf := make([]byte, 2*ps)
	if _, err := f.ReadAt(buf, 0); err != nil {
		return fmt.Errorf("read the meta pages of %s: %w", path, err)
	}
	newest, ok := uint64(0), false
	for i := range 2 {
		if txid, valid := metaTxid(buf[i*ps : (i+1)*ps]); valid && (!ok || txid > newest) {
			newest, ok = txid, true
		}
	}
	switch {
	case !ok:
		return fmt.Errorf("%s has no valid meta page: it is not a bbolt database, or not the one journal %s belongs to", path, j.path)
	case newest+1 < j.ckptTxid:
		return fmt.Errorf("%s (transaction %d) is older than its journal %s (checkpoint at transaction %d), so it was put back from a copy without its journal: put back the journal copied with it, or remove the journal to open the copy as it is (if it was taken with the database closed)", path, newest, j.path, j.ckptTxid)
	case newest > j.ckptTxid+uint64(len(j.recovered))+2:
		// Written without the journal (an older release after a crash):
		// the journal is stale. Whether the file is whole depends on how
		// that run began, which only the operator knows (ADR 0008).
		return fmt.Errorf("%s (transaction %d) has moved on past its journal %s (checkpoint at transaction %d, %d records), so it was written without the journal (an older release?): remove the journal to go on, unless that run started after a power cut (the file may then be torn: restore both files from a backup)", path, newest, j.path, j.ckptTxid, len(j.recovered))
	}
	return nil
}

// metaTxid reads the transaction id of a bbolt meta page (format version
// 2: a 16-byte page header, then magic, version, page size, flags, root
// bucket (16 bytes), freelist, high-water mark, txid and an FNV-64a
// checksum of the fields before it, in the machine's byte order), and
// whether the page is valid.
func metaTxid(page []byte) (uint64, bool) {
	const header, magic, version = 16, 0xED0CDAED, 2
	if len(page) < header+64 {
		return 0, false
	}
	m := page[header:]
	if binary.NativeEndian.Uint32(m[0:]) != magic || binary.NativeEndian.Uint32(m[4:]) != version {
		return 0, false
	}
	h := fnv.New64a()
	h.Write(m[:56])
	if h.Sum64() != binary.NativeEndian.Uint64(m[56:]) {
		return 0, false
	}
	return binary.NativeEndian.Uint64(m[48:]), true
}

// start readies the journal on the opened database: pins the restored
// checkpoint's tree and replays the records after it, each in a write
// transaction of its own (not yet durable: Open checkpoints afterwards).
func (j *journal) start(db *bolt.DB) error {
	j.pageSize = db.Info().PageSize
	if j.pageSize > maxPageSize {
		return fmt.Errorf("page size %d is over the journal's %d", j.pageSize, maxPageSize)
	}
	if j.metas != nil && len(j.metas) != 2*j.pageSize {
		return fmt.Errorf("journal %s: its checkpoint holds pages of %d bytes, the database has %d", j.path, len(j.metas)/2, j.pageSize)
	}
	var err error
	if j.dbf, err = os.Open(db.Path()); err != nil {
		return err
	}
	if j.pin, err = db.Begin(false); err != nil {
		return err
	}
	if j.metas == nil {
		// No checkpoint to go back to (a new journal, or one that stepped
		// aside or closed): the file as it is, whole, becomes the one, before
		// anything commits without a sync. The journal may be new, and
		// the database file too: their fdatasyncs make their content
		// durable, not their names, so the directory is synced first.
		if err := j.syncDir(filepath.Dir(db.Path())); err != nil {
			return err
		}
		if err := j.checkpointNow(db, flagActive); err != nil {
			return err
		}
	}
	for i, rec := range j.recovered {
		if err := db.Update(func(tx *bolt.Tx) error { return replay(tx, rec) }); err != nil {
			return fmt.Errorf("replay record %d of %d: %w", i+1, len(j.recovered), err)
		}
	}
	j.recovered, j.metas = nil, nil
	return nil
}

// refuse reports why no write may commit, or nil.
func (j *journal) refuse() error { return j.broken }

// outgrows reports whether a commit of a record of n bytes, in a file of
// size bytes in use, could make bbolt remap its file: the journal must
// step aside first (bbolt's remap would wait for the pin, the pin for the
// commit). A commit allocates at most a copy of every page in use (each
// one it changes is rewritten elsewhere) and about four times its new
// data; the map holds twice that and some.
func (j *journal) outgrows(size int64, n int) bool {
	return !j.stepped.Load() && 2*size+4*int64(n)+min(64<<20, int64(j.mapSize)/8) > int64(j.mapSize)/2
}

// stepAside stops journaling for the rest of the process: a checkpoint
// marked inactive makes the database file whole on its own, the pin is let
// go, and bbolt syncs its commits itself again. A restart maps more and
// journals again.
func (j *journal) stepAside(db *bolt.DB) {
	if err := j.checkpointNow(db, 0); err != nil {
		j.broken = err
		return
	}
	j.pin.Rollback() //nolint:errcheck // a read transaction's rollback fails only when already closed
	j.pin = nil
	db.NoSync = false
	j.stepped.Store(true)
}

// commit makes the commit whose record is rec (pages written) durable:
// appends and syncs the record, or checkpoints when it does not fit.
func (j *journal) commit(db *bolt.DB, rec []byte, pages int64) error {
	if j.broken != nil {
		return j.broken
	}
	if j.stepped.Load() {
		return nil // bbolt synced it
	}
	j.collect(false)
	if j.broken != nil {
		return j.broken
	}
	j.pages += pages
	if len(rec) == 0 {
		return nil // nothing changed
	}
	n := int64(recordHeader + len(rec))
	at, ok := j.place(n)
	if !ok {
		// Too big for the ring, or no room until a checkpoint: this one
		// makes the commit durable (it syncs the file past it) and empties
		// the ring.
		if err := j.checkpointNow(db, flagActive); err != nil {
			j.broken = err
		}
		return j.broken
	}
	if err := j.append(at, rec); err != nil {
		j.broken = fmt.Errorf("journal %s failed, writes are refused until a restart: %w", j.path, err)
		return j.broken
	}
	j.since += n
	if j.inflight == nil && (j.since >= j.opts.CheckpointBytes || j.pages >= int64(j.opts.CheckpointPages) || time.Since(j.captured) >= j.opts.CheckpointEvery) {
		j.begin(db, flagActive)
	}
	return nil
}

// place finds where a record of n bytes goes without reaching the live
// records, growing the file when it can.
func (j *journal) place(n int64) (int64, bool) {
	if n > (j.opts.Size-recordsStart)/4 {
		return 0, false
	}
	wrapped := j.tail < j.head // the live records run from head to the end, then from the start to tail
	if wrapped {
		return j.tail, j.tail+n < j.head
	}
	if j.tail+n > j.end && j.end < j.opts.Size {
		if err := j.grow(max(j.end+journalGrowBy, j.tail+n)); err != nil {
			j.broken = err
			return 0, false
		}
	}
	if j.tail+n <= j.end {
		return j.tail, true
	}
	return recordsStart, recordsStart+n < j.head
}

func (j *journal) append(at int64, rec []byte) error {
	b := j.buf[:0]
	b = binary.LittleEndian.AppendUint32(b, recordMagic)
	b = append(b, 0, 0, 0, 0)                                 // crc
	b = binary.LittleEndian.AppendUint32(b, uint32(len(rec))) //nolint:gosec // under the file's size
	b = binary.LittleEndian.AppendUint64(b, j.seq)
	b = append(b, rec...)
	binary.LittleEndian.PutUint32(b[4:], crc32.Checksum(b[8:], crcTable))
	j.buf = b
	if _, err := j.f.WriteAt(b, at); err != nil {
		return err
	}
	if err := j.sync(); err != nil {
		return err
	}
	j.tail, j.seq = at+int64(len(b)), j.seq+1
	if cap(j.buf) > journalGrowBy {
		j.buf = nil // a rare big record's buffer is not kept
	}
	return nil
}

// begin captures a checkpoint between commits and finishes it on a
// goroutine of its own.
func (j *journal) begin(db *bolt.DB, flags uint32) {
	c, err := j.capture(db, flags)
	if err != nil {
		j.broken = err
		return
	}
	ch := make(chan *checkpoint, 1)
	j.inflight = ch
	go func() {
		c.err = j.finish(db, c)
		ch <- c
	}()
}

// checkpointNow takes a checkpoint and waits for it to be durable.
func (j *journal) checkpointNow(db *bolt.DB, flags uint32) error {
	j.collect(true)
	if j.broken != nil {
		return j.broken
	}
	c, err := j.capture(db, flags)
	if err != nil {
		return err
	}
	c.err = j.finish(db, c)
	j.apply(c)
	return j.broken
}

// capture pins the newest commit and copies its meta pages. No write
// transaction may be running: the meta pages are then that commit's (and
// the one before it's).
func (j *journal) capture(db *bolt.DB, flags uint32) (*checkpoint, error) {
	pin, err := db.Begin(false)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	metas := make([]byte, 2*j.pageSize)
	if _, err := j.dbf.ReadAt(metas, 0); err != nil {
		pin.Rollback() //nolint:errcheck // a read transaction's Rollback fails only if it is closed already
		return nil, fmt.Errorf("checkpoint: read meta pages: %w", err)
	}
	j.since, j.pages, j.captured = 0, 0, time.Now()
	return &checkpoint{pin: pin, metas: metas, head: j.tail, seq: j.seq, txid: uint64(pin.ID()), flags: flags, n: j.ckpt + 1}, nil //nolint:gosec // a txid
}

// finish makes c durable: the database file synced past it (through a
// handle of the journal's own; fdatasync(2) syncs the file, whichever
// descriptor names it), then its slot written and synced.
func (j *journal) finish(db *bolt.DB, c *checkpoint) error {
	if err := j.fdatasync(j.dbf, "db"); err != nil {
		return fmt.Errorf("checkpoint: sync %s: %w", db.Path(), err)
	}
	b := make([]byte, slotHeader+len(c.metas))
	copy(b, slotMagic)
	binary.LittleEndian.PutUint32(b[12:], uint32(j.pageSize)) //nolint:gosec // ≤ maxPageSize
	binary.LittleEndian.PutUint64(b[16:], c.n)
	binary.LittleEndian.PutUint32(b[24:], c.flags)
	binary.LittleEndian.PutUint64(b[32:], uint64(c.head)) //nolint:gosec // an offset
	binary.LittleEndian.PutUint64(b[40:], c.seq)
	binary.LittleEndian.PutUint64(b[48:], c.txid)
	copy(b[slotHeader:], c.metas)
	binary.LittleEndian.PutUint32(b[8:], crc32.Checksum(b[12:], crcTable))
	if _, err := j.f.WriteAt(b, int64(c.n%2)*slotSize); err != nil {
		return fmt.Errorf("checkpoint: write slot: %w", err)
	}
	if err := j.sync(); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	return nil
}

// collect applies a finished checkpoint; with wait, waits for one running.
func (j *journal) collect(wait bool) {
	if j.inflight == nil {
		return
	}
	if wait {
		j.apply(<-j.inflight)
		return
	}
	select {
	case c := <-j.inflight:
		j.apply(c)
	default:
	}
}

// apply makes a finished checkpoint the newest: its pin replaces the old.
func (j *journal) apply(c *checkpoint) {
	j.inflight = nil
	if c.err != nil {
		c.pin.Rollback() //nolint:errcheck // a read transaction's Rollback fails only if it is closed already
		j.broken = fmt.Errorf("journal %s failed, writes are refused until a restart: %w", j.path, c.err)
		return
	}
	if j.pin != nil {
		j.pin.Rollback() //nolint:errcheck // a read transaction's Rollback fails only if it is closed already
	}
	j.pin, j.head, j.ckpt = c.pin, c.head, c.n
}

// checkpointAndRelease takes a last checkpoint, marked inactive: the file
// is then whole on its own, so the next Open restores and replays nothing,
// and a run without the journal may change the file freely (an active
// checkpoint's meta pages would name a tree such a run may overwrite). It
// lets go of the pin, so that bbolt can close.
func (j *journal) checkpointAndRelease(db *bolt.DB) error {
	var err error
	if j.broken == nil && !j.stepped.Load() {
		err = j.checkpointNow(db, 0)
	} else {
		j.collect(true)
	}
	j.release()
	return err
}

// release lets go of the pin and the database file's handle.
func (j *journal) release() {
	if j.pin != nil {
		j.pin.Rollback() //nolint:errcheck // a read transaction's Rollback fails only if it is closed already
		j.pin = nil
	}
	if j.dbf != nil {
		j.dbf.Close()
		j.dbf = nil
	}
}

// closeFile closes the journal file, and so lets go of its lock. After
// bbolt's file is closed.
func (j *journal) closeFile() error { return j.f.Close() }

// abandon lets go of everything after a failed Open, writing nothing.
func (j *journal) abandon() {
	j.collect(true)
	j.release()
	j.f.Close()
}

// mapSize is the address space bbolt maps for a file of size bytes with
// the journal on: enough that no commit remaps it while a pin holds the map
// (the journal steps aside before a commit that could pass half of it:
// outgrows).
func mapSize(size int64) int {
	return int(max(16<<30, 8*size)) //nolint:gosec // 64-bit only (openJournal)
}
