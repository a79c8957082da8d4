package pgstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/parleyhq/parley/platform/pgdb"
	"github.com/parleyhq/parley/platform/resource"
	"github.com/parleyhq/parley/services/tasks/internal/store"
)

// chunkSize is the most bytes one artifact_chunks row holds. Readers take
// each chunk's length from the table, so changing it leaves stored
// artifacts readable.
const chunkSize = 256 << 10

// blobTimeout bounds one Write (an upload has 4 minutes to arrive) or one
// chunk read.
const blobTimeout = 5 * time.Minute

// Blobs keeps artifact bytes in the artifact_chunks table: a store.Blobs
// that replicas share without a volume.
type Blobs struct {
	db *pgdb.DB
}

var _ store.Blobs = (*Blobs)(nil)

// Blobs returns the artifact bytes kept in the store's database.
func (s *Store) Blobs() *Blobs { return &Blobs{db: s.db} }

// Write implements store.Blobs: every chunk in one transaction, so a
// refused or failed upload leaves nothing, and the bytes are committed
// before Write returns.
func (b *Blobs) Write(taskID, artifactID string, r io.Reader, limit int64) (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), blobTimeout)
	defer cancel()
	var size int64
	runs := 0
	err := b.db.Write(ctx, func(tx pgx.Tx) error {
		// Write reruns fn after a deadlock, but r is read already: fail
		// rather than store what is left of it. (Chunks of a new
		// artifact take no lock another writer holds, so this is unlikely.)
		if runs++; runs > 1 {
			return fmt.Errorf("artifact %s/%s: the upload's transaction was aborted and its bytes cannot be read twice: %w", taskID, artifactID, resource.ErrContention)
		}
		size = 0
		lr := io.LimitReader(r, limit+1)
		buf := make([]byte, chunkSize)
		// Chunk 0 is written even when empty: it marks the bytes as stored.
		for n := 0; ; n++ {
			k, err := io.ReadFull(lr, buf)
			last := errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
			if err != nil && !last {
				return fmt.Errorf("read artifact: %w", err)
			}
			size += int64(k)
			if size > limit {
				return fmt.Errorf("%w: over %d bytes", store.ErrTooLarge, limit)
			}
			if k > 0 || n == 0 {
				if _, err := tx.Exec(ctx, `INSERT INTO artifact_chunks (task_id, artifact_id, n, data) VALUES ($1, $2, $3, $4)`,
					taskID, artifactID, n, buf[:k]); err != nil {
					return err
				}
			}
			if last {
				return nil
			}
		}
	})
	if err != nil {
		return 0, err
	}
	return size, nil
}

// Open implements store.Blobs. The reader fetches one chunk at a time.
func (b *Blobs) Open(taskID, artifactID string) (io.ReadSeekCloser, error) {
	ctx, cancel := context.WithTimeout(context.Background(), blobTimeout)
	defer cancel()
	rows, err := b.db.Pool().Query(ctx, `SELECT length(data) FROM artifact_chunks WHERE task_id = $1 AND artifact_id = $2 ORDER BY n`, taskID, artifactID)
	if err != nil {
		return nil, err
	}
	lengths, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, err
	}
	if len(lengths) == 0 {
		return nil, fmt.Errorf("bytes of artifact %s of task %s: %w", artifactID, taskID, fs.ErrNotExist)
	}
	starts := make([]int64, len(lengths)+1) // starts[i]: offset of chunk i; the last is the size
	for i, l := range lengths {
		starts[i+1] = starts[i] + l
	}
	return &chunkReader{db: b.db, taskID: taskID, artifactID: artifactID, starts: starts, cur: -1}, nil
}

// chunkReader reads an artifact's chunks on demand, keeping the current one.
type chunkReader struct {
	db                 *pgdb.DB
	taskID, artifactID string
	starts             []int64
	pos                int64
	cur                int // index of data's chunk; -1 for none
	data               []byte
}

func (c *chunkReader) size() int64 { return c.starts[len(c.starts)-1] }

func (c *chunkReader) Read(p []byte) (int, error) {
	if c.pos >= c.size() {
		return 0, io.EOF
	}
	i := 0
	for c.starts[i+1] <= c.pos {
		i++
	}
	if i != c.cur {
		ctx, cancel := context.WithTimeout(context.Background(), blobTimeout)
		defer cancel()
		if err := c.db.Pool().QueryRow(ctx, `SELECT data FROM artifact_chunks WHERE task_id = $1 AND artifact_id = $2 AND n = $3`,
			c.taskID, c.artifactID, i).Scan(&c.data); err != nil {
			c.cur = -1
			return 0, fmt.Errorf("read artifact chunk %d: %w", i, err)
		}
		c.cur = i
	}
	n := copy(p, c.data[c.pos-c.starts[i]:])
	c.pos += int64(n)
	return n, nil
}

func (c *chunkReader) Seek(offset int64, whence int) (int64, error) {
	switch whence {
	case io.SeekCurrent:
		offset += c.pos
	case io.SeekEnd:
		offset += c.size()
	case io.SeekStart:
	default:
		return 0, errors.New("seek: bad whence")
	}
	if offset < 0 {
		return 0, errors.New("seek: negative position")
	}
	c.pos = offset
	return offset, nil
}

func (c *chunkReader) Close() error {
	c.data = nil
	return nil
}
